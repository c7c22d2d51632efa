// Block-quantized y = x @ W.T (+ b) for the few rows of a decode step, in integer dot products:
// the formats of llama.cpp's GGUF files, groups of 32 weights along k, each with an fp16 scale d
// (and, for Q4_1, an fp16 minimum m):
//   Q8_0: w = d * c, c in [-127, 127] (8.5 bits a weight);
//   Q4_0: w = d * (c - 8), c in [0, 15] (4.5 bits);
//   Q4_1: w = d * c + m, c in [0, 15] (5 bits).
// And longhaul's int8 (per output channel): w = scale * c, c in [-127, 127], one fp32 scale an
// output instead of one a group: the 8-bit path with d = 1, the scale applied once at the end.
//
// The activations are quantized per call, as llama.cpp does for its dot products (quant_rows.h):
// each row's K values in groups of 32, each to int8 codes q = round(x / s), s = max|x| / 127. A
// group's product is s * (d * sum(c q) - d * offset * sum(q) + m * sum(q)), the integer sums exact,
// the rest in fp32: x rounded to its group's int8 grid (at most s / 2 a value) times the
// dequantized weight. Each code is stored as an unsigned byte or nibble u with
// w = d * (u - offset) (+ m): offset 128 for Q8_0 and int8 (u = c + 128), 8 for Q4_0, 0 for Q4_1.
//
// Layout: panels of nr outputs; in each panel, per group, the codes and then nothing else (the
// scales sit in their own panels (P, groups, nr) fp16, read once a group):
// - 8 bits: 8 k-quads of nr x 4 bytes (as the int8 kernel);
// - 4 bits: 4 k-quads of nr x 4 bytes, the low nibble of quad t holding k-quad t and the high
//   nibble k-quad t + 4, so one load and a mask or a shift give two quads.
// Paths: `vnni` (AVX512-VNNI: Zen 4/5, Ice Lake and later Xeons; nr 16: `vpdpbusd` on u and the
// signed codes of x, 4 products a lane) and `avx2` (any AVX2 CPU; nr 8: `vpmaddubsw` on |q| and
// sign(q) * (u - offset), then `vpmaddwd`; no 16-bit overflow: |q|, |u - offset| <= 127).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <type_traits>
#include <vector>

#include "panels.h"
#include "quant_rows.h"

namespace {

using longhaul::GK;
using longhaul::QuantRows;

constexpr int NR8 = 8;
constexpr int NR16 = 16;

// Bytes of codes a group of one panel: 32 k x nr outputs at 8 or 4 bits.
constexpr int64_t group_bytes(int bits, int nr) { return GK * nr * bits / 8; }

// CH: one scale an output, applied by the caller (d and m unused).
template <int BITS, bool MIN, bool CH, int MR>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni,f16c"))) void panel_vnni(
    const QuantRows& xq, int64_t m0, const uint8_t* __restrict wp, const uint16_t* __restrict dp,
    const uint16_t* __restrict mp, int offset, float* __restrict y, int64_t ldy, int nc) {
  const int64_t G = xq.groups, ldq = xq.Kp / 4;
  constexpr int64_t GB = group_bytes(BITS, NR16);
  __m512 f[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) f[i] = _mm512_setzero_ps();
  const int32_t* q = reinterpret_cast<const int32_t*>(xq.q.data() + m0 * xq.Kp);
  const __m512i low = _mm512_set1_epi8(0x0F);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* wg = wp + g * GB;
    _mm_prefetch(reinterpret_cast<const char*>(wg + 16 * GB), _MM_HINT_T2);
    __m512i a[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) a[i] = _mm512_setzero_si512();
    const int32_t* qg = q + g * (GK / 4);
    if (BITS == 8) {
#pragma GCC unroll 8
      for (int t = 0; t < 8; ++t) {
        const __m512i w = _mm512_loadu_si512(wg + t * 64);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, _mm512_set1_epi32(qg[i * ldq + t]));
      }
    } else {
#pragma GCC unroll 4
      for (int t = 0; t < 4; ++t) {
        const __m512i v = _mm512_loadu_si512(wg + t * 64);
        const __m512i lo = _mm512_and_si512(v, low), hi = _mm512_and_si512(_mm512_srli_epi16(v, 4), low);
#pragma GCC unroll 8
        for (int i = 0; i < MR; ++i) {
          a[i] = _mm512_dpbusd_epi32(a[i], lo, _mm512_set1_epi32(qg[i * ldq + t]));
          a[i] = _mm512_dpbusd_epi32(a[i], hi, _mm512_set1_epi32(qg[i * ldq + t + 4]));
        }
      }
    }
    const __m512 d = CH ? _mm512_setzero_ps()
                        : _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(dp + g * NR16)));
    const __m512 mn = MIN ? _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(mp + g * NR16)))
                          : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const int64_t r = (m0 + i) * G + g;
      const __m512i exact = _mm512_sub_epi32(a[i], _mm512_set1_epi32(offset * xq.sum[r]));
      const __m512 s = _mm512_set1_ps(xq.s[r]);
      f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), CH ? s : _mm512_mul_ps(d, s), f[i]);
      if (MIN) f[i] = _mm512_fmadd_ps(mn, _mm512_set1_ps(xq.s[r] * static_cast<float>(xq.sum[r])), f[i]);
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << nc) - 1u);
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, f[i]);
}

template <int BITS, bool MIN, bool CH, int MR>
__attribute__((target("avx2,fma,f16c"))) void panel_avx2(const QuantRows& xq, int64_t m0, const uint8_t* __restrict wp,
                                                         const uint16_t* __restrict dp, const uint16_t* __restrict mp,
                                                         int offset, float* __restrict y, int64_t ldy, int nc) {
  const int64_t G = xq.groups, ldq = xq.Kp / 4;
  constexpr int64_t GB = group_bytes(BITS, NR8);
  __m256 f[MR];
  for (int i = 0; i < MR; ++i) f[i] = _mm256_setzero_ps();
  const int32_t* q = reinterpret_cast<const int32_t*>(xq.q.data() + m0 * xq.Kp);
  const __m256i off = _mm256_set1_epi8(static_cast<char>(offset)), ones = _mm256_set1_epi16(1);
  const __m256i low = _mm256_set1_epi8(0x0F);
  // a[i] += sum over the quad of q * (u - offset), 8 outputs
  auto dot = [&](__m256i (&a)[MR], __m256i u, const int32_t* qg, int t) {
    const __m256i w = _mm256_sub_epi8(u, off);
    for (int i = 0; i < MR; ++i) {
      const __m256i x4 = _mm256_set1_epi32(qg[i * ldq + t]);
      const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(x4), _mm256_sign_epi8(w, x4));
      a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(p, ones));
    }
  };
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* wg = wp + g * GB;
    _mm_prefetch(reinterpret_cast<const char*>(wg + 16 * GB), _MM_HINT_T2);
    __m256i a[MR];
    for (int i = 0; i < MR; ++i) a[i] = _mm256_setzero_si256();
    const int32_t* qg = q + g * (GK / 4);
    if (BITS == 8) {
      for (int t = 0; t < 8; ++t) dot(a, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + t * 32)), qg, t);
    } else {
      for (int t = 0; t < 4; ++t) {
        const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + t * 32));
        dot(a, _mm256_and_si256(v, low), qg, t);
        dot(a, _mm256_and_si256(_mm256_srli_epi16(v, 4), low), qg, t + 4);
      }
    }
    const __m256 d = CH ? _mm256_setzero_ps()
                        : _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(dp + g * NR8)));
    const __m256 mn = MIN ? _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mp + g * NR8)))
                          : _mm256_setzero_ps();
    for (int i = 0; i < MR; ++i) {
      const int64_t r = (m0 + i) * G + g;
      const __m256 s = _mm256_set1_ps(xq.s[r]);
      f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), CH ? s : _mm256_mul_ps(d, s), f[i]);
      if (MIN) f[i] = _mm256_fmadd_ps(mn, _mm256_set1_ps(xq.s[r] * static_cast<float>(xq.sum[r])), f[i]);
    }
  }
  alignas(32) float row[NR8];
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(row, f[i]);
    std::copy(row, row + nc, y + i * ldy);
  }
}

using PanelFn = void (*)(const QuantRows&, int64_t, const uint8_t*, const uint16_t*, const uint16_t*, int, float*, int64_t,
                         int);

template <int BITS, bool MIN, bool CH>
struct Table {
  static constexpr PanelFn vnni[9] = {nullptr, panel_vnni<BITS, MIN, CH, 1>, panel_vnni<BITS, MIN, CH, 2>,
                                      panel_vnni<BITS, MIN, CH, 3>, panel_vnni<BITS, MIN, CH, 4>, panel_vnni<BITS, MIN, CH, 5>,
                                      panel_vnni<BITS, MIN, CH, 6>, panel_vnni<BITS, MIN, CH, 7>, panel_vnni<BITS, MIN, CH, 8>};
  static constexpr PanelFn avx2[9] = {nullptr, panel_avx2<BITS, MIN, CH, 1>, panel_avx2<BITS, MIN, CH, 2>,
                                      panel_avx2<BITS, MIN, CH, 3>, panel_avx2<BITS, MIN, CH, 4>, panel_avx2<BITS, MIN, CH, 5>,
                                      panel_avx2<BITS, MIN, CH, 6>, panel_avx2<BITS, MIN, CH, 7>, panel_avx2<BITS, MIN, CH, 8>};
};

const PanelFn* panels_for(int bits, bool with_min, bool per_channel, int nr) {
  if (per_channel) return nr == NR16 ? Table<8, false, true>::vnni : Table<8, false, true>::avx2;
  if (bits == 8) return nr == NR16 ? Table<8, false, false>::vnni : Table<8, false, false>::avx2;
  if (with_min) return nr == NR16 ? Table<4, true, false>::vnni : Table<4, true, false>::avx2;
  return nr == NR16 ? Table<4, false, false>::vnni : Table<4, false, false>::avx2;
}

// (N, groups) fp16 -> (P, groups, nr) fp16, the last panel's missing outputs 0.
torch::Tensor pack_scales(const torch::Tensor& s, int64_t nr) {
  const int64_t N = s.size(0), groups = s.size(1), P = (N + nr - 1) / nr;
  auto out = torch::zeros({P * nr, groups}, s.options());
  out.narrow(0, 0, N).copy_(s);
  return out.view({P, nr, groups}).transpose(1, 2).contiguous();
}

}  // namespace

// Whether this CPU has AVX512-VNNI integer dot products (the 16-wide panels), checked once.
bool has_avx512_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

// codes (N, K) uint8 (the u above: 0..255 for 8 bits, 0..15 for 4), d and m (N, K / 32) fp16 (m
// empty but for Q4_1) -> [codes (P, Kp * nr * bits / 8) uint8, d (P, groups, nr), m] in the
// layout above. Padding codes are `pad` (the offset: weight 0), padding scales 0. Per output
// channel (int8): d and m empty, 8 bits; the codes alone are packed (the scales stay (N,) fp32).
std::vector<torch::Tensor> pack_blocks(const torch::Tensor& codes, const torch::Tensor& d, const torch::Tensor& m,
                                       int64_t bits, int64_t pad, int64_t nr) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kByte && codes.device().is_cpu(), "pack_blocks: 2-D uint8 CPU codes");
  TORCH_CHECK(bits == 4 || bits == 8, "pack_blocks: bits must be 4 or 8, got ", bits);
  if (nr == 0) nr = has_avx512_vnni() ? NR16 : NR8;
  TORCH_CHECK(nr == NR8 || nr == NR16, "pack_blocks: panel width must be 8 or 16, got ", nr);
  TORCH_CHECK(nr == NR8 || has_avx512_vnni(), "pack_blocks: 16-wide panels need AVX512-VNNI, which this CPU lacks");
  const auto c = codes.contiguous();
  const int64_t N = c.size(0), K = c.size(1), Kp = (K + GK - 1) / GK * GK, groups = Kp / GK, P = (N + nr - 1) / nr;
  const bool per_channel = d.numel() == 0;
  TORCH_CHECK(!per_channel || (bits == 8 && m.numel() == 0), "pack_blocks: per-channel codes (no d) are 8 bits, without m");
  TORCH_CHECK(per_channel || (d.scalar_type() == at::kHalf && d.dim() == 2 && d.size(0) == N && d.size(1) == groups),
              "pack_blocks: d must be (N, ceil(K / 32)) fp16, or empty for per-channel codes");
  TORCH_CHECK(m.numel() == 0 || (m.scalar_type() == at::kHalf && m.sizes() == d.sizes()), "pack_blocks: m must be empty or like d");
  const int64_t gb = group_bytes(static_cast<int>(bits), static_cast<int>(nr));
  auto out = torch::zeros({P, groups * gb}, c.options());
  const uint8_t* src = c.data_ptr<uint8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, P, 16, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p)
      for (int64_t g = 0; g < groups; ++g) {
        uint8_t* o = dst + p * groups * gb + g * gb;
        for (int64_t j = 0; j < nr; ++j)
          for (int64_t i = 0; i < GK; ++i) {
            const int64_t n = p * nr + j, k = g * GK + i, t = i / 4;
            const uint8_t u = n < N && k < K ? src[n * K + k] : static_cast<uint8_t>(pad);
            if (bits == 8) {
              o[(t * nr + j) * 4 + (i & 3)] = u;
            } else {
              uint8_t& b = o[((t & 3) * nr + j) * 4 + (i & 3)];
              b = t < 4 ? static_cast<uint8_t>((b & 0xF0) | (u & 0x0F)) : static_cast<uint8_t>((b & 0x0F) | (u << 4));
            }
          }
      }
  });
  if (per_channel) return {out, d, m};
  return {out, pack_scales(d, nr), m.numel() ? pack_scales(m, nr) : m};
}

// x (M, K) fp32 or bf16 @ packed codes (P panels of nr) -> out (M, N) of x's dtype. d, m: the
// packed group scales and minimums (m null but for Q4_1), or d null and scale (N,) for
// per-channel codes; bias null or (N,) fp32.
template <class T>
void mm_blocks_raw(const T* x, int64_t M, int64_t K, const uint8_t* w, int64_t P, int64_t nr, const uint16_t* d,
                   const uint16_t* m, const float* scale, int bits, int offset, int64_t N, const float* bias, T* out) {
  // The calling thread's buffers, reused call after call. The panels, on other threads too, read
  // them through this reference: the name of a thread_local would mean each thread's own copy.
  thread_local QuantRows scratch;
  QuantRows& xq = scratch;
  longhaul::quantize_rows(x, M, K, xq);
  constexpr bool fp32 = std::is_same<T, float>::value;
  float* yp = fp32 ? reinterpret_cast<float*>(out) : scratch_f32(M * N);  // fp32 sums: straight into out
  const PanelFn* panels = panels_for(bits, m != nullptr, d == nullptr, static_cast<int>(nr));
  const int64_t gb = group_bytes(bits, static_cast<int>(nr)), groups = xq.groups;
  run_panels(P, M, nr, N, [&](int64_t p, int64_t m0, int mr, int nc) {
    panels[mr](xq, m0, w + p * groups * gb, d ? d + p * groups * nr : nullptr, m ? m + p * groups * nr : nullptr, offset,
               yp + m0 * N + p * nr, N, nc);
  });
  if (!fp32 || scale || bias) finish_rows(yp, M, N, scale, bias, out);
}
template void mm_blocks_raw<float>(const float*, int64_t, int64_t, const uint8_t*, int64_t, int64_t, const uint16_t*,
                                   const uint16_t*, const float*, int, int, int64_t, const float*, float*);
template void mm_blocks_raw<at::BFloat16>(const at::BFloat16*, int64_t, int64_t, const uint8_t*, int64_t, int64_t,
                                          const uint16_t*, const uint16_t*, const float*, int, int, int64_t, const float*,
                                          at::BFloat16*);

// x (M, K) fp32 or bf16 @ the packed blocks -> (M, N) in x's dtype, plus bias (empty or (N,)). d:
// the packed group scales, or (N,) fp32 for per-channel codes (8 bits, m empty), applied once.
torch::Tensor mm_blocks(const torch::Tensor& x, const torch::Tensor& wp, const torch::Tensor& d, const torch::Tensor& m,
                        int64_t bits, int64_t offset, int64_t N, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "mm_blocks: x must be a 2-D fp32 or bf16 CPU tensor");
  TORCH_CHECK(bits == 4 || bits == 8, "mm_blocks: bits must be 4 or 8");
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + GK - 1) / GK * GK, groups = Kp / GK;
  const bool per_channel = d.dim() == 1;
  TORCH_CHECK(!per_channel || (d.scalar_type() == at::kFloat && d.numel() == N && bits == 8 && m.numel() == 0 &&
                               wp.dim() == 2 && wp.size(1) % (groups * GK) == 0),
              "mm_blocks: per-channel scales must be (N,) fp32 over 8-bit codes");
  TORCH_CHECK(per_channel || (d.dim() == 3 && d.scalar_type() == at::kHalf && d.size(1) == groups &&
                              (d.size(2) == NR8 || d.size(2) == NR16)),
              "mm_blocks: packed scales do not match x");
  const int64_t P = per_channel ? wp.size(0) : d.size(0), nr = per_channel ? wp.size(1) / (groups * GK) : d.size(2);
  TORCH_CHECK(nr == NR8 || nr == NR16, "mm_blocks: packed codes do not match x");
  TORCH_CHECK(wp.dim() == 2 && wp.scalar_type() == at::kByte && wp.size(0) == P &&
              wp.size(1) == groups * group_bytes(static_cast<int>(bits), static_cast<int>(nr)),
              "mm_blocks: packed codes do not match x and the scales");
  TORCH_CHECK(m.numel() == 0 || m.sizes() == d.sizes(), "mm_blocks: m must be empty or like d");
  TORCH_CHECK(N > 0 && N <= P * nr, "mm_blocks: N does not match the packed weight");
  TORCH_CHECK(nr == NR8 || has_avx512_vnni(), "mm_blocks: 16-wide panels need AVX512-VNNI, which this CPU lacks");
  auto out = torch::empty({M, N}, x.options());
  if (M == 0) return out;
  torch::Tensor keep, scale = per_channel ? contiguous_as(d, at::kFloat) : torch::Tensor();
  const float* sp = per_channel ? scale.data_ptr<float>() : nullptr;
  const uint16_t* dptr = per_channel ? nullptr : reinterpret_cast<const uint16_t*>(d.data_ptr<at::Half>());
  const uint16_t* mptr = m.numel() ? reinterpret_cast<const uint16_t*>(m.data_ptr<at::Half>()) : nullptr;
  const float* bp = bias_f32(bias, N, keep, "mm_blocks");
  const auto xc = x.contiguous();
  if (x.scalar_type() == at::kFloat)
    mm_blocks_raw(xc.data_ptr<float>(), M, K, wp.data_ptr<uint8_t>(), P, nr, dptr, mptr, sp, static_cast<int>(bits),
                  static_cast<int>(offset), N, bp, out.data_ptr<float>());
  else
    mm_blocks_raw(xc.data_ptr<at::BFloat16>(), M, K, wp.data_ptr<uint8_t>(), P, nr, dptr, mptr, sp, static_cast<int>(bits),
                  static_cast<int>(offset), N, bp, out.data_ptr<at::BFloat16>());
  return out;
}
