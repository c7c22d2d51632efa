// int8 y = (x @ codes.T) * scale (+ b) for the few rows of a decode step, in integer dot products:
// one byte a weight streamed once per 8 rows, a quarter of fp32's bytes and half of bf16's.
//
// The activations are quantized per call, as llama.cpp does for its Q8_0 dot products: each row's
// K values in groups of 32, each group to int8 codes q = round(x / s) with s = max|x| / 127 (a
// group of zeros gets s = 0). A group's products with a weight's codes are summed exactly in
// int32, then converted, times s, added in fp32; the per-output weight scale multiplies the
// total once, then the bias is added. So y equals an fp32 sum over groups of
// s_g * (exact integer dot product), i.e. x rounded to its group's int8 grid (at most s_g / 2 a
// value) times the dequantized weight.
//
// Two paths, one per instruction set, on one code layout: panels of nr outputs with k in quads,
// a quad's nr x 4 codes side by side (W[j][k..k+3] for the panel's outputs j), K padded to a
// multiple of 32 with zero codes:
// - `vnni` (AVX512-VNNI: Zen 4/5, Ice Lake and later Xeons), nr = 16: codes stored with an offset
//   of 128 as unsigned bytes, so one 64-byte load feeds `vpdpbusd` (unsigned weight x signed
//   activation, 4 products a lane) for 16 outputs; the offset adds 128 * sum(q) a group, taken
//   off once a group from the activation codes' sum.
// - `avx2` (any AVX2 CPU), nr = 8: the same bytes read back as signed codes (xor 0x80), and
//   `vpmaddubsw` on |q| and sign(q) * w (no 16-bit overflow: |q|, |w| <= 127), `vpmaddwd` to int32.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "panels.h"
#include "quant_rows.h"

namespace {

using longhaul::GK;
using longhaul::QuantRows;

constexpr int NR8 = 8;
constexpr int NR16 = 16;
constexpr int PF = 16;  // prefetch distance in groups (16 x 512 B at nr 16: 8 KiB)

template <int MR>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512vnni"))) void panel_vnni(const QuantRows& xq, int64_t m0,
                                                                                const uint8_t* __restrict wp,
                                                                                float* __restrict y, int64_t ldy, int nc) {
  const int64_t G = xq.groups, Kp = xq.Kp;
  __m512 f[MR];
#pragma GCC unroll 8
  for (int i = 0; i < MR; ++i) f[i] = _mm512_setzero_ps();
  const int32_t* q = reinterpret_cast<const int32_t*>(xq.q.data() + m0 * Kp);  // a row's quads as words
  const int64_t ldq = Kp / 4;
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* wg = wp + g * GK * NR16;
    _mm_prefetch(reinterpret_cast<const char*>(wg + PF * GK * NR16), _MM_HINT_T2);
    _mm_prefetch(reinterpret_cast<const char*>(wg + PF * GK * NR16 + 256), _MM_HINT_T2);
    __m512i a[MR];
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) a[i] = _mm512_setzero_si512();
#pragma GCC unroll 8
    for (int t = 0; t < GK / 4; ++t) {
      const __m512i w = _mm512_loadu_si512(wg + t * 4 * NR16);
#pragma GCC unroll 8
      for (int i = 0; i < MR; ++i) a[i] = _mm512_dpbusd_epi32(a[i], w, _mm512_set1_epi32(q[i * ldq + g * (GK / 4) + t]));
    }
#pragma GCC unroll 8
    for (int i = 0; i < MR; ++i) {
      const int64_t r = (m0 + i) * G + g;
      const __m512i exact = _mm512_sub_epi32(a[i], _mm512_set1_epi32(128 * xq.sum[r]));
      f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(exact), _mm512_set1_ps(xq.s[r]), f[i]);
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << nc) - 1u);
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, f[i]);
}

template <int MR>
void panel_avx2(const QuantRows& xq, int64_t m0, const uint8_t* __restrict wp, float* __restrict y, int64_t ldy, int nc) {
  const int64_t G = xq.groups, Kp = xq.Kp;
  __m256 f[MR];
  for (int i = 0; i < MR; ++i) f[i] = _mm256_setzero_ps();
  const int32_t* q = reinterpret_cast<const int32_t*>(xq.q.data() + m0 * Kp);
  const int64_t ldq = Kp / 4;
  const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80)), ones = _mm256_set1_epi16(1);
  for (int64_t g = 0; g < G; ++g) {
    const uint8_t* wg = wp + g * GK * NR8;
    _mm_prefetch(reinterpret_cast<const char*>(wg + PF * GK * NR8), _MM_HINT_T2);
    __m256i a[MR];
    for (int i = 0; i < MR; ++i) a[i] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int t = 0; t < GK / 4; ++t) {
      const __m256i w = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(wg + t * 4 * NR8)), flip);
      for (int i = 0; i < MR; ++i) {
        const __m256i x4 = _mm256_set1_epi32(q[i * ldq + g * (GK / 4) + t]);
        const __m256i p = _mm256_maddubs_epi16(_mm256_abs_epi8(x4), _mm256_sign_epi8(w, x4));
        a[i] = _mm256_add_epi32(a[i], _mm256_madd_epi16(p, ones));
      }
    }
    for (int i = 0; i < MR; ++i)
      f[i] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(a[i]), _mm256_set1_ps(xq.s[(m0 + i) * G + g]), f[i]);
  }
  alignas(32) float row[NR8];
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(row, f[i]);
    std::copy(row, row + nc, y + i * ldy);
  }
}

using PanelFn = void (*)(const QuantRows&, int64_t, const uint8_t*, float*, int64_t, int);
constexpr PanelFn kVnni[9] = {nullptr, panel_vnni<1>, panel_vnni<2>, panel_vnni<3>, panel_vnni<4>,
                              panel_vnni<5>, panel_vnni<6>, panel_vnni<7>, panel_vnni<8>};
constexpr PanelFn kAvx2[9] = {nullptr, panel_avx2<1>, panel_avx2<2>, panel_avx2<3>, panel_avx2<4>,
                              panel_avx2<5>, panel_avx2<6>, panel_avx2<7>, panel_avx2<8>};

}  // namespace

// Whether this CPU has AVX512-VNNI integer dot products (the 16-wide int8 panels), checked once.
bool has_avx512_vnni() {
  static const bool yes = __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

// codes (N, K) int8 in [-127, 127] -> panels (ceil(N / nr), Kp / 4, nr, 4) uint8 (code + 128; Kp
// = K rounded up to 32; padding codes 0); nr 8 (avx2), 16 (vnni) or 0 (16 where the CPU has VNNI).
torch::Tensor pack_int8(const torch::Tensor& codes, int64_t nr) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.device().is_cpu(), "pack_int8: 2-D int8 CPU codes");
  if (nr == 0) nr = has_avx512_vnni() ? NR16 : NR8;
  TORCH_CHECK(nr == NR8 || nr == NR16, "pack_int8: panel width must be 8 or 16, got ", nr);
  TORCH_CHECK(nr == NR8 || has_avx512_vnni(), "pack_int8: 16-wide panels need AVX512-VNNI, which this CPU lacks");
  const auto c = codes.contiguous();
  const int64_t N = c.size(0), K = c.size(1), Kp = (K + GK - 1) / GK * GK, G = (N + nr - 1) / nr;
  auto out = torch::full({G, Kp / 4, nr, 4}, 128, c.options().dtype(at::kByte));
  const int8_t* src = c.data_ptr<int8_t>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  at::parallel_for(0, G, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t j = 0; j < nr && g * nr + j < N; ++j) {
        const int8_t* r = src + (g * nr + j) * K;
        uint8_t* d = dst + g * Kp * nr + 4 * j;
        for (int64_t k = 0; k < K; ++k) d[(k / 4) * 4 * nr + (k & 3)] = static_cast<uint8_t>(r[k] + 128);
      }
  });
  return out;
}

// x (M, K) fp32 or bf16 @ packed codes, times scale (N,) fp32, plus bias (empty or (N,)) -> (M, N)
// in x's dtype, x quantized per 32 values (above).
torch::Tensor mm_int8(const torch::Tensor& x, const torch::Tensor& wp, const torch::Tensor& scale, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "mm_int8: x must be a 2-D fp32 or bf16 CPU tensor");
  const int64_t M = x.size(0), K = x.size(1), Kp = (K + GK - 1) / GK * GK;
  TORCH_CHECK(wp.dim() == 4 && wp.scalar_type() == at::kByte && (wp.size(2) == NR8 || wp.size(2) == NR16) &&
              wp.size(1) * 4 == Kp && wp.size(3) == 4, "mm_int8: packed codes do not match x");
  const int64_t N = scale.numel(), G = wp.size(0), nr = wp.size(2);
  TORCH_CHECK(scale.scalar_type() == at::kFloat && N > 0 && N <= G * nr, "mm_int8: scale must be (N,) fp32");
  TORCH_CHECK(nr == NR8 || has_avx512_vnni(), "mm_int8: 16-wide panels need AVX512-VNNI, which this CPU lacks");
  const QuantRows xq = longhaul::quantize_input(x);
  auto y = torch::empty({M, N}, x.options().dtype(at::kFloat));
  float* yp = y.data_ptr<float>();
  const uint8_t* w = wp.data_ptr<uint8_t>();
  const PanelFn* panels = nr == NR16 ? kVnni : kAvx2;
  run_panels(G, M, nr, N, [&](int64_t g, int64_t m, int mr, int nc) {
    panels[mr](xq, m, w + g * Kp * nr, yp + m * N + g * nr, N, nc);
  });
  y.mul_(scale);
  if (bias.numel()) y.add_(bias.to(at::kFloat));
  return y.to(x.scalar_type());
}
