// bf16 y = x @ W.T (+ b) for the few rows of a decode step: the weights are streamed once per 8
// rows, as in small_gemm.cpp, at half the bytes of fp32.
//
// Two packings, one per instruction set:
// - `dp` (AVX512-BF16: Zen 4/5, Sapphire Rapids): panels of 16 outputs with k in pairs, so one
//   64-byte load holds W[j][k], W[j][k+1] for the panel's 16 outputs j, and `vdpbf16ps` adds
//   x[k] * W[j][k] + x[k+1] * W[j][k+1] into 16 fp32 accumulators: 32 multiply-adds a load
//   against the broadcast pair (x[k], x[k+1]) of each row. Products of bf16 values are exact in
//   fp32; each pair's sum is added to the accumulator in fp32.
// - `widen` (AVX2 + FMA): panels of 8 outputs, K x 8 bf16 values; each load of 8 is widened to
//   fp32 (a bf16 is the top half of an fp32) and multiplied with x[k] (rounded to bf16 and back)
//   in plain fp32 FMAs in k order.
// Both keep fp32 accumulators and round the result to bf16 once, to nearest even, the way
// oneDNN's bf16 linear does. x is rounded to bf16 first on both paths, so they compute the
// same products.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <string>

#include "panels.h"

namespace {

constexpr int NR_DP = 16;      // outputs per dp panel
constexpr int NR_WIDEN = 8;    // outputs per widen panel
constexpr int PF_PAIRS = 128;  // dp prefetch distance in k pairs (128 x 64 B = 8 KiB)
constexpr int PF_K = 512;      // widen prefetch distance in k (512 x 16 B = 8 KiB)

// One dot-product chain per row waits on the previous `vdpbf16ps` (several cycles), which at one or
// two rows holds a core to one 64-byte load per instruction latency, below what memory streams: so
// few-row panels split k over U interleaved accumulators a row, added in a fixed order at the end.
template <int MR, int U>
__attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16"))) void panel_dp(const uint16_t* __restrict x, int64_t K,
                                                                              const uint16_t* __restrict wp, float* __restrict y,
                                                                              int64_t ldy, int nc) {
  __m512 acc[MR][U];
  for (int i = 0; i < MR; ++i)
    for (int u = 0; u < U; ++u) acc[i][u] = _mm512_setzero_ps();
  const int64_t K2 = K / 2;
  const int32_t* xp = reinterpret_cast<const int32_t*>(x);  // a row's k pairs as 32-bit words
  const int64_t ldp = K2;                                   // pairs a row
  int64_t p = 0;
  for (; p + U <= K2; p += U) {
    _mm_prefetch(reinterpret_cast<const char*>(wp + (p + PF_PAIRS) * 2 * NR_DP), _MM_HINT_T2);
    if (U > 1) _mm_prefetch(reinterpret_cast<const char*>(wp + (p + PF_PAIRS + U - 1) * 2 * NR_DP), _MM_HINT_T2);
    for (int u = 0; u < U; ++u) {
      const __m512bh w = (__m512bh)_mm512_loadu_si512(wp + (p + u) * 2 * NR_DP);
      for (int i = 0; i < MR; ++i) acc[i][u] = _mm512_dpbf16_ps(acc[i][u], (__m512bh)_mm512_set1_epi32(xp[i * ldp + p + u]), w);
    }
  }
  for (; p < K2; ++p) {
    const __m512bh w = (__m512bh)_mm512_loadu_si512(wp + p * 2 * NR_DP);
    for (int i = 0; i < MR; ++i) acc[i][0] = _mm512_dpbf16_ps(acc[i][0], (__m512bh)_mm512_set1_epi32(xp[i * ldp + p]), w);
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << nc) - 1u);
  for (int i = 0; i < MR; ++i) {
    __m512 sum = acc[i][0];
    if (U == 2) sum = _mm512_add_ps(acc[i][0], acc[i][U - 1]);
    if (U == 4) sum = _mm512_add_ps(_mm512_add_ps(acc[i][0], acc[i][1]), _mm512_add_ps(acc[i][2], acc[i][U - 1]));
    _mm512_mask_storeu_ps(y + i * ldy, keep, sum);
  }
}

template <int MR>
void panel_widen(const float* __restrict x, int64_t K, const uint16_t* __restrict wp, float* __restrict y, int64_t ldy, int nc) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    if ((k & 3) == 0) _mm_prefetch(reinterpret_cast<const char*>(wp + (k + PF_K) * NR_WIDEN), _MM_HINT_T2);
    const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + k * NR_WIDEN));
    const __m256 w = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    a0 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + k), w, a0);
    if (MR > 1) a1 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + K + k), w, a1);
    if (MR > 2) a2 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 2 * K + k), w, a2);
    if (MR > 3) a3 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 3 * K + k), w, a3);
    if (MR > 4) a4 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 4 * K + k), w, a4);
    if (MR > 5) a5 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 5 * K + k), w, a5);
    if (MR > 6) a6 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 6 * K + k), w, a6);
    if (MR > 7) a7 = _mm256_fmadd_ps(_mm256_broadcast_ss(x + 7 * K + k), w, a7);
  }
  const __m256 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  alignas(32) float row[NR_WIDEN];
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(row, acc[i]);
    std::copy(row, row + nc, y + i * ldy);
  }
}

using DpFn = void (*)(const uint16_t*, int64_t, const uint16_t*, float*, int64_t, int);
using WidenFn = void (*)(const float*, int64_t, const uint16_t*, float*, int64_t, int);
constexpr DpFn kDp[9] = {nullptr,          panel_dp<1, 4>, panel_dp<2, 2>, panel_dp<3, 2>, panel_dp<4, 1>,
                         panel_dp<5, 1>, panel_dp<6, 1>, panel_dp<7, 1>, panel_dp<8, 1>};
constexpr WidenFn kWiden[9] = {nullptr, panel_widen<1>, panel_widen<2>, panel_widen<3>, panel_widen<4>,
                               panel_widen<5>, panel_widen<6>, panel_widen<7>, panel_widen<8>};

}  // namespace

// Whether this CPU has AVX512-BF16 dot products (the `dp` packing), checked once.
bool has_avx512_bf16() {
  static const bool yes = __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                          __builtin_cpu_supports("avx512vl");
  return yes;
}

// W (N, K) bf16 -> dp panels (ceil(N / 16), K / 2, 16, 2) or widen panels (ceil(N / 8), K, 8),
// the last panel zero padded. kind: "dp", "widen", or "" (dp where the CPU has it, else widen).
torch::Tensor pack_bf16(const torch::Tensor& w, const std::string& kind) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16 && w.device().is_cpu(), "pack_bf16: a 2-D bf16 CPU weight");
  const bool dp = kind == "dp" || (kind.empty() && has_avx512_bf16());
  TORCH_CHECK(kind.empty() || kind == "dp" || kind == "widen", "pack_bf16: kind must be dp, widen or empty, got ", kind);
  TORCH_CHECK(!dp || has_avx512_bf16(), "pack_bf16: the dp packing needs AVX512-BF16, which this CPU lacks");
  const auto wc = w.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1);
  TORCH_CHECK(!dp || K % 2 == 0, "pack_bf16: the dp packing needs an even K, got ", K);
  const int64_t nr = dp ? NR_DP : NR_WIDEN, G = (N + nr - 1) / nr;
  auto out = dp ? torch::zeros({G, K / 2, nr, 2}, wc.options()) : torch::zeros({G, K, nr}, wc.options());
  const uint16_t* src = reinterpret_cast<const uint16_t*>(wc.data_ptr<at::BFloat16>());
  uint16_t* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  if (!dp) {
    pack_panels(src, dst, N, K, nr);
    return out;
  }
  at::parallel_for(0, G, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t j = 0; j < nr && g * nr + j < N; ++j) {
        const uint16_t* r = src + (g * nr + j) * K;
        uint16_t* d = dst + g * K * nr;
        for (int64_t k = 0; k < K; ++k) d[(k / 2) * 2 * nr + 2 * j + (k & 1)] = r[k];
      }
  });
  return out;
}

// x (M, K) bf16 @ packed panels (G of them; dp or widen) -> out (M, N) bf16; bias null or (N,) fp32.
void mm_bf16_raw(const at::BFloat16* x, int64_t M, int64_t K, const uint16_t* w, bool dp, int64_t G, int64_t N,
                 const float* bias, at::BFloat16* out) {
  float* yp = scratch_f32(M * N);
  if (dp) {
    const uint16_t* xp = reinterpret_cast<const uint16_t*>(x);
    run_panels(G, M, NR_DP, N, [&](int64_t g, int64_t m, int mr, int nc) {
      kDp[mr](xp + m * K, K, w + g * K * NR_DP, yp + m * N + g * NR_DP, N, nc);
    });
  } else {
    float* xp = scratch_f32(M * K, 1);  // the same bf16 products as dp, in fp32
    for (int64_t i = 0; i < M * K; ++i) xp[i] = static_cast<float>(x[i]);
    run_panels(G, M, NR_WIDEN, N, [&](int64_t g, int64_t m, int mr, int nc) {
      kWiden[mr](xp + m * K, K, w + g * K * NR_WIDEN, yp + m * N + g * NR_WIDEN, N, nc);
    });
  }
  finish_rows(yp, M, N, nullptr, bias, out);
}

// x (M, K) @ packed bf16 weight -> (M, N) bf16; bias: empty or (N,) bf16/fp32, added in fp32
// before the one rounding to bf16.
torch::Tensor mm_bf16(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias) {
  const bool dp = wp.dim() == 4;
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && (x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat),
              "mm_bf16: x must be a 2-D bf16 or fp32 CPU tensor");
  TORCH_CHECK(wp.scalar_type() == at::kBFloat16 && (dp ? wp.size(2) == NR_DP && wp.size(1) * 2 == x.size(1)
                                                       : wp.dim() == 3 && wp.size(2) == NR_WIDEN && wp.size(1) == x.size(1)),
              "mm_bf16: packed weight does not match x");
  TORCH_CHECK(N > 0 && N <= wp.size(0) * wp.size(2), "mm_bf16: N does not match the packed weight");
  TORCH_CHECK(!dp || has_avx512_bf16(), "mm_bf16: dp panels need AVX512-BF16, which this CPU lacks");
  const int64_t M = x.size(0), K = x.size(1);
  auto out = torch::empty({M, N}, x.options().dtype(at::kBFloat16));
  if (M == 0) return out;
  const auto xb = contiguous_as(x, at::kBFloat16);
  torch::Tensor keep;
  const float* b = bias_f32(bias, N, keep, "mm_bf16");
  mm_bf16_raw(xb.data_ptr<at::BFloat16>(), M, K, reinterpret_cast<const uint16_t*>(wp.data_ptr<at::BFloat16>()), dp,
              wp.size(0), N, b, out.data_ptr<at::BFloat16>());
  return out;
}
