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

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>

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

using PanelFn = void (*)(const float*, int64_t, const float*, const float*, float*, int64_t, int);
constexpr PanelFn kPanels[9] = {nullptr, panel<1>, panel<2>, panel<3>, panel<4>, panel<5>, panel<6>, panel<7>, panel<8>};

}  // namespace

// W (N, K) fp32 -> panels (ceil(N / 8), K, 8), the last one zero padded.
torch::Tensor pack(const torch::Tensor& w) {
  TORCH_CHECK(w.dim() == 2 && w.scalar_type() == at::kFloat && w.device().is_cpu(), "pack: a 2-D fp32 CPU weight");
  const auto wc = w.contiguous();
  const int64_t N = wc.size(0), K = wc.size(1), G = (N + NR - 1) / NR;
  auto out = torch::zeros({G, K, NR}, wc.options());
  const float* src = wc.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, G, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int j = 0; j < NR && g * NR + j < N; ++j) {
        const float* r = src + (g * NR + j) * K;
        float* d = dst + g * K * NR + j;
        for (int64_t k = 0; k < K; ++k) d[k * NR] = r[k];
      }
  });
  return out;
}

// x (M, K) fp32 @ panels -> y (M, N) (contiguous); bias: empty or (ceil(N / 8) * 8,) zero padded.
static void mm_rows(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias, torch::Tensor& y) {
  const int64_t M = x.size(0), K = x.size(1), G = wp.size(0);
  if (M == 0) return;
  const float* xp = x.data_ptr<float>();
  const float* w = wp.data_ptr<float>();
  const float* b = bias.numel() ? bias.data_ptr<float>() : nullptr;
  float* yp = y.data_ptr<float>();
  auto run = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int nc = static_cast<int>(std::min<int64_t>(NR, N - g * NR));
      for (int64_t m = 0; m < M; m += 8) {
        const int mr = static_cast<int>(std::min<int64_t>(8, M - m));
        kPanels[mr](xp + m * K, K, w + g * K * NR, b ? b + g * NR : nullptr, yp + m * N + g * NR, N, nc);
      }
    }
  };
  const int threads = at::get_num_threads();
  const int64_t chunk = std::max<int64_t>(1, G / (8 * threads));
  if (threads == 1 || G <= chunk) {
    run(0, G);
    return;
  }
  std::atomic<int64_t> next{0};
  at::parallel_for(0, threads, 1, [&](int64_t, int64_t) {
    for (int64_t g0; (g0 = next.fetch_add(chunk)) < G;) run(g0, std::min(G, g0 + chunk));
  });
}

static void check_mm(const torch::Tensor& x, const torch::Tensor& wp, int64_t N) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "mm: x must be a 2-D fp32 CPU tensor");
  TORCH_CHECK(wp.dim() == 3 && wp.size(2) == NR && wp.size(1) == x.size(1) && N > 0 && N <= wp.size(0) * NR,
              "mm: packed weight does not match x");
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
