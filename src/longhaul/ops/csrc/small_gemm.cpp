// fp32 y = x @ W.T (+ b) for the few rows of a decode step, on AVX2 + FMA CPUs.
//
// At batch 1-16 a decoder linear is a stream of its weights: each weight is used M times and
// the matrix does not fit in cache. The kernel keeps W packed in panels of 8 outputs, each
// panel K x 8 contiguous (one sequential stream per panel, the next panel right after it),
// and for each k broadcasts x[m, k] of up to 8 rows against the 8 weights: 8 accumulators,
// 8 FMAs per 32-byte weight load, every weight read once from memory per 8 rows, and a
// software prefetch 8 KiB ahead into L2 (hardware prefetchers stop at 4 KiB page edges; at batch
// 8 the FMAs keep a core busy most of the time, so the stream needs to be requested early: on the
// 2-core EPYC, 2 KiB into L1 streamed 18 GB/s with two threads, 8 KiB into L2 21-23). Threads
// take panel chunks from a shared counter, so a thread slowed by another process does not
// hold the call back. Each output is a plain fp32 FMA sum over k in order.
//
// On a CPU with AVX-512 the panels are 16 outputs wide (one 64-byte zmm load a k, the same 8
// broadcasts per row): half the broadcasts and loop overhead per byte. At batch 8 the 8-wide
// AVX2 panel keeps both FMA pipes saturated with no slack, so it cannot stream at memory speed;
// on a 2-core Zen 4 the 16-wide panel streams 30 GB of weights at 34-36 GB/s with two threads
// against 17-19 for the 8-wide one (a plain read: ~32-40). Same sums, same order.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>

#include "panels.h"

namespace {

constexpr int NR = 8;         // outputs per panel
constexpr int PF = 256;       // prefetch distance in k (256 x 32 B = 8 KiB), into L2

template <int MR>
inline void panel(const float* __restrict x, int64_t K, const float* __restrict wp, const float* bias,
                  float* __restrict y, int64_t ldy, int nc) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    if ((k & 1) == 0) _mm_prefetch(reinterpret_cast<const char*>(wp + (k + PF) * NR), _MM_HINT_T2);
    const __m256 w = _mm256_loadu_ps(wp + k * NR);
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
  alignas(32) float row[NR];
  for (int i = 0; i < MR; ++i) {
    __m256 v = acc[i];
    if (bias) {  // the bias of a partial panel is padded with zeros like its weights
      v = _mm256_add_ps(v, _mm256_loadu_ps(bias));
    }
    if (nc == NR) {
      _mm256_storeu_ps(y + i * ldy, v);
    } else {
      _mm256_store_ps(row, v);
      std::copy(row, row + nc, y + i * ldy);
    }
  }
}

constexpr int NR16 = 16;      // outputs per AVX-512 panel
constexpr int PF16 = 128;     // prefetch distance in k (128 x 64 B = 8 KiB), into L2

template <int MR>
__attribute__((target("avx512f"))) void panel16(const float* __restrict x, int64_t K, const float* __restrict wp,
                                                const float* bias, float* __restrict y, int64_t ldy, int nc) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t k = 0; k < K; ++k) {
    _mm_prefetch(reinterpret_cast<const char*>(wp + (k + PF16) * NR16), _MM_HINT_T2);
    const __m512 w = _mm512_loadu_ps(wp + k * NR16);
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
  const __mmask16 keep = static_cast<__mmask16>((1u << nc) - 1u);  // nc <= 16: the panel's real outputs
  for (int i = 0; i < MR; ++i) {
    __m512 v = acc[i];
    if (bias) v = _mm512_add_ps(v, _mm512_loadu_ps(bias));
    _mm512_mask_storeu_ps(y + i * ldy, keep, v);
  }
}

using PanelFn = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int);
constexpr PanelFn kPanels[9] = {nullptr, panel<1>, panel<2>, panel<3>, panel<4>, panel<5>, panel<6>, panel<7>, panel<8>};
constexpr PanelFn kPanels16[9] = {nullptr,     panel16<1>, panel16<2>, panel16<3>, panel16<4>,
                                  panel16<5>, panel16<6>, panel16<7>, panel16<8>};

}  // namespace

// Whether this CPU runs the 16-wide panels (checked once).
bool has_avx512() {
  static const bool yes = __builtin_cpu_supports("avx512f");
  return yes;
}

// W (N, K) fp32 -> panels (ceil(N / nr), K, nr), the last one zero padded; nr 8 (AVX2), 16
// (AVX-512) or 0: 16 where the CPU has AVX-512, else 8. `mm` reads the width from the shape.
torch::Tensor pack(const torch::Tensor& w, int64_t nr) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu(), "pack: a 2-D fp32 CPU weight");
  if (nr == 0) nr = has_avx512() ? NR16 : NR;
  TORCH_CHECK(nr == NR || nr == NR16, "pack: panel width must be 8 or 16, got ", nr);
  TORCH_CHECK(nr == NR || has_avx512(), "pack: 16-wide panels need AVX-512, which this CPU lacks");
  const auto wc = w.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1), G = (N + nr - 1) / nr;
  auto out = torch::zeros({G, K, nr}, wc.options());
  const float* src = wc.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  pack_panels(src, dst, N, K, nr);
  return out;
}

// x (M, K) fp32 @ panels (G, K, nr) -> y (M, N); bias: null or (G * nr,) zero padded.
void mm_raw(const float* x, int64_t M, int64_t K, const float* w, int64_t G, int64_t nr, const float* b, int64_t N, float* y) {
  const PanelFn* panels = nr == NR16 ? kPanels16 : kPanels;
  run_panels(G, M, nr, N, [&](int64_t g, int64_t m, int mr, int nc) {
    panels[mr](x + m * K, K, w + g * K * nr, b ? b + g * nr : nullptr, y + m * N + g * nr, N, nc);
  });
}

static void mm_rows(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias, torch::Tensor& y) {
  mm_raw(x.data_ptr<float>(), x.size(0), x.size(1), wp.data_ptr<float>(), wp.size(0), wp.size(2),
         bias.numel() ? bias.data_ptr<float>() : nullptr, N, y.data_ptr<float>());
}

static void check_mm(const torch::Tensor& x, const torch::Tensor& wp, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "mm: x must be a 2-D fp32 CPU tensor");
  TORCH_CHECK(wp.dim() == 3 && (wp.size(2) == NR || wp.size(2) == NR16) && wp.size(1) == x.size(1) && N > 0 &&
              N <= wp.size(0) * wp.size(2), "mm: packed weight does not match x");
  TORCH_CHECK(wp.size(2) == NR || has_avx512(), "mm: 16-wide panels need AVX-512, which this CPU lacks");
}

torch::Tensor mm(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias) {
  check_mm(x, wp, N);
  const auto xc = x.contiguous();
  auto y = torch::empty({xc.size(0), N}, xc.options());
  mm_rows(xc, wp, N, bias, y);
  return y;
}

// `mm` written into out (M, N), a contiguous fp32 tensor (e.g. rows of a recording buffer).
torch::Tensor mm_into(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias, torch::Tensor out) {
  check_mm(x, wp, N);
  TORCH_CHECK(out.is_contiguous() && out.scalar_type() == at::kFloat && out.dim() == 2 && out.size(0) == x.size(0) &&
              out.size(1) == N, "mm_into: out must be a contiguous fp32 (M, N) tensor");
  const auto xc = x.contiguous();
  mm_rows(xc, wp, N, bias, out);
  return out;
}
