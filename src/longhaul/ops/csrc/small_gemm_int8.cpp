// Weight-only int8 y = (x @ codes.T) * scale (+ b) for the few rows of a decode step: one byte a
// weight streamed once per 8 rows, a quarter of fp32's bytes and half of bf16's.
//
// Panels of 16 outputs (AVX-512) or 8 (AVX2), K x NR codes each, contiguous. For each k the
// panel's NR codes are widened to fp32 (sign-extend, convert: exact for |code| <= 127) and
// multiplied with x[m, k] of up to 8 rows in fp32 FMAs, in k order; the per-output scale is
// applied once to each sum, then the bias. x is taken in fp32 (bf16 inputs are widened first),
// so the sums are those of the dequantized weight codes * scale in fp32, up to where the scale is
// applied: (sum_k x_k c_jk) * s_j instead of sum_k x_k (c_jk s_j).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "panels.h"

namespace {

constexpr int NR8 = 8;
constexpr int NR16 = 16;
constexpr int PF = 1024;  // prefetch distance in k (1024 x 8 B, 512 x 16 B: 8 KiB), into L2

template <int MR>
void panel8(const float* __restrict x, int64_t K, const int8_t* __restrict wp, float* __restrict y, int64_t ldy, int nc) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    if ((k & 7) == 0) _mm_prefetch(reinterpret_cast<const char*>(wp + (k + PF) * NR8), _MM_HINT_T2);
    const __m128i c = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(wp + k * NR8));
    const __m256 w = _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(c));
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
  alignas(32) float row[NR8];
  for (int i = 0; i < MR; ++i) {
    _mm256_store_ps(row, acc[i]);
    std::copy(row, row + nc, y + i * ldy);
  }
}

template <int MR>
__attribute__((target("avx512f"))) void panel16(const float* __restrict x, int64_t K, const int8_t* __restrict wp,
                                                float* __restrict y, int64_t ldy, int nc) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    if ((k & 3) == 0) _mm_prefetch(reinterpret_cast<const char*>(wp + (k + PF / 2) * NR16), _MM_HINT_T2);
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(wp + k * NR16));
    const __m512 w = _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(c));
    a0 = _mm512_fmadd_ps(_mm512_set1_ps(x[k]), w, a0);
    if (MR > 1) a1 = _mm512_fmadd_ps(_mm512_set1_ps(x[K + k]), w, a1);
    if (MR > 2) a2 = _mm512_fmadd_ps(_mm512_set1_ps(x[2 * K + k]), w, a2);
    if (MR > 3) a3 = _mm512_fmadd_ps(_mm512_set1_ps(x[3 * K + k]), w, a3);
    if (MR > 4) a4 = _mm512_fmadd_ps(_mm512_set1_ps(x[4 * K + k]), w, a4);
    if (MR > 5) a5 = _mm512_fmadd_ps(_mm512_set1_ps(x[5 * K + k]), w, a5);
    if (MR > 6) a6 = _mm512_fmadd_ps(_mm512_set1_ps(x[6 * K + k]), w, a6);
    if (MR > 7) a7 = _mm512_fmadd_ps(_mm512_set1_ps(x[7 * K + k]), w, a7);
  }
  const __m512 acc[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
  const __mmask16 keep = static_cast<__mmask16>((1u << nc) - 1u);
  for (int i = 0; i < MR; ++i) _mm512_mask_storeu_ps(y + i * ldy, keep, acc[i]);
}

using PanelFn = void (*)(const float*, int64_t, const int8_t*, float*, int64_t, int);
constexpr PanelFn kP8[9] = {nullptr, panel8<1>, panel8<2>, panel8<3>, panel8<4>, panel8<5>, panel8<6>, panel8<7>, panel8<8>};
constexpr PanelFn kP16[9] = {nullptr, panel16<1>, panel16<2>, panel16<3>, panel16<4>,
                             panel16<5>, panel16<6>, panel16<7>, panel16<8>};

}  // namespace

bool has_avx512();

// codes (N, K) int8 -> panels (ceil(N / nr), K, nr), zero padded; nr 8, 16 or 0 (16 with AVX-512).
torch::Tensor pack_int8(const torch::Tensor& codes, int64_t nr) {
  TORCH_CHECK(codes.dim() == 2 && codes.scalar_type() == at::kChar && codes.device().is_cpu(), "pack_int8: 2-D int8 CPU codes");
  if (nr == 0) nr = has_avx512() ? NR16 : NR8;
  TORCH_CHECK(nr == NR8 || nr == NR16, "pack_int8: panel width must be 8 or 16, got ", nr);
  TORCH_CHECK(nr == NR8 || has_avx512(), "pack_int8: 16-wide panels need AVX-512, which this CPU lacks");
  const auto c = codes.contiguous();
  const int64_t N = c.size(0), K = c.size(1), G = (N + nr - 1) / nr;
  auto out = torch::zeros({G, K, nr}, c.options());
  const int8_t* src = c.data_ptr<int8_t>();
  int8_t* dst = out.data_ptr<int8_t>();
  pack_panels(src, dst, N, K, nr);
  return out;
}

// x (M, K) fp32 or bf16 @ packed codes, times scale (N,) fp32, plus bias (empty or (N,)) -> (M, N) in x's dtype.
torch::Tensor mm_int8(const torch::Tensor& x, const torch::Tensor& wp, const torch::Tensor& scale, const torch::Tensor& bias) {
  TORCH_CHECK(x.dim() == 2 && x.device().is_cpu() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16),
              "mm_int8: x must be a 2-D fp32 or bf16 CPU tensor");
  TORCH_CHECK(wp.dim() == 3 && wp.scalar_type() == at::kChar && (wp.size(2) == NR8 || wp.size(2) == NR16) && wp.size(1) == x.size(1),
              "mm_int8: packed codes do not match x");
  const int64_t N = scale.numel();
  TORCH_CHECK(scale.scalar_type() == at::kFloat && N > 0 && N <= wp.size(0) * wp.size(2), "mm_int8: scale must be (N,) fp32");
  TORCH_CHECK(wp.size(2) == NR8 || has_avx512(), "mm_int8: 16-wide panels need AVX-512, which this CPU lacks");
  const int64_t M = x.size(0), K = x.size(1), G = wp.size(0), nr = wp.size(2);
  const auto xf = x.to(at::kFloat).contiguous();
  auto y = torch::empty({M, N}, xf.options());
  const float* xp = xf.data_ptr<float>();
  const int8_t* w = wp.data_ptr<int8_t>();
  float* yp = y.data_ptr<float>();
  const PanelFn* panels = nr == NR16 ? kP16 : kP8;
  run_panels(G, M, nr, N, [&](int64_t g, int64_t m, int mr, int nc) {
    panels[mr](xp + m * K, K, w + g * K * nr, yp + m * N + g * nr, N, nc);
  });
  y.mul_(scale);
  if (bias.numel()) y.add_(bias.to(at::kFloat));
  return y.to(x.scalar_type());
}
