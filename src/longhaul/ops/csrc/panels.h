// The loop every small-batch GEMM kernel shares: panels of `nr` outputs, rows in blocks of up to
// 8 (one register accumulator each), threads taking panel chunks from a shared counter so a thread
// slowed by another process does not hold the call back. Also what their callers share: the fp32
// sums' last pass (scale, bias, rounding) into a given output, and per-thread scratch.
#pragma once

#include <ATen/Parallel.h>
#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <vector>

#include "bf16.h"

// W (N, K) row-major -> dst (ceil(N / nr), K, nr): panel g holds outputs g*nr .. g*nr+nr-1, each k's
// nr weights side by side; dst must be zeroed (the last panel's missing outputs stay 0).
template <class T>
void pack_panels(const T* src, T* dst, int64_t N, int64_t K, int64_t nr) {
  const int64_t G = (N + nr - 1) / nr;
  at::parallel_for(0, G, 16, [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g)
      for (int64_t j = 0; j < nr && g * nr + j < N; ++j) {
        const T* r = src + (g * nr + j) * K;
        T* d = dst + g * K * nr + j;
        for (int64_t k = 0; k < K; ++k) d[k * nr] = r[k];
      }
  });
}

// Calls panel(g, m, mr, nc) for every panel g of the G (nc: its real outputs, <= nr; N in all)
// and every block of mr <= 8 rows starting at row m of the M.
//
// Each thread owns a contiguous range of panels and takes it chunk by chunk from that range's
// counter, so each core streams one long run of the weight (what the hardware prefetchers follow
// best); a thread done with its own range takes the chunks left in the others', so a thread
// slowed by another process does not hold the call back.
template <class Panel>
void run_panels(int64_t G, int64_t M, int64_t nr, int64_t N, Panel panel) {
  if (M == 0) return;
  auto run = [&](int64_t g0, int64_t g1) {
    for (int64_t g = g0; g < g1; ++g) {
      const int nc = static_cast<int>(std::min<int64_t>(nr, N - g * nr));
      for (int64_t m = 0; m < M; m += 8) panel(g, m, static_cast<int>(std::min<int64_t>(8, M - m)), nc);
    }
  };
  const int threads = at::get_num_threads();
  const int64_t chunk = std::max<int64_t>(1, G / (8 * threads));
  if (threads == 1 || G <= chunk) {
    run(0, G);
    return;
  }
  struct alignas(64) Range {
    std::atomic<int64_t> next;
    int64_t end;
  };
  std::vector<Range> ranges(threads);
  for (int t = 0; t < threads; ++t) {
    ranges[t].next.store(G * t / threads, std::memory_order_relaxed);
    ranges[t].end = G * (t + 1) / threads;
  }
  at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t) {
    for (int64_t i = 0; i < threads; ++i) {
      Range& r = ranges[(t0 + i) % threads];
      for (int64_t g0; (g0 = r.next.fetch_add(chunk, std::memory_order_relaxed)) < r.end;) run(g0, std::min(r.end, g0 + chunk));
    }
  });
}

// x as a contiguous tensor of `dtype`: x itself when it already is one (no dispatcher call).
inline torch::Tensor contiguous_as(const torch::Tensor& x, at::ScalarType dtype) {
  if (x.scalar_type() == dtype && x.is_contiguous()) return x;
  return x.to(dtype).contiguous();
}

// A bias (empty or (N,)) as fp32 values, or null when empty; `keep` holds a converted copy while
// the pointer is read.
inline const float* bias_f32(const torch::Tensor& bias, int64_t N, torch::Tensor& keep, const char* who) {
  if (!bias.numel()) return nullptr;
  TORCH_CHECK(bias.numel() == N, who, ": the bias must have N = ", N, " values, got ", bias.numel());
  keep = contiguous_as(bias, at::kFloat);
  return keep.data_ptr<float>();
}

// A kernel's fp32 sums y (M, N) -> out (M, N): y * scale[n] (when scale is given), then + bias[n]
// (when given), each rounded in fp32 (the empty asm keeps the compiler from fusing the two into
// one FMA, as torch's mul_ then add_ do not), then rounded once to T; in place when out is y.
template <class T>
void finish_rows(const float* y, int64_t M, int64_t N, const float* scale, const float* bias, T* out) {
  for (int64_t m = 0; m < M; ++m) {
    const float* r = y + m * N;
    T* o = out + m * N;
    int64_t n = 0;
    for (; n + 8 <= N; n += 8) {
      __m256 v = _mm256_loadu_ps(r + n);
      if (scale) v = _mm256_mul_ps(v, _mm256_loadu_ps(scale + n));
      asm("" : "+x"(v));
      if (bias) v = _mm256_add_ps(v, _mm256_loadu_ps(bias + n));
      longhaul::store8(o + n, v);
    }
    for (; n < N; ++n) {
      float v = r[n];
      if (scale) v *= scale[n];
      asm("" : "+x"(v));
      if (bias) v += bias[n];
      o[n] = static_cast<T>(v);
    }
  }
}

// The calling thread's fp32 scratch `slot` (0 or 1) of at least n values, reused call after call
// (kernels pass its pointer to their parallel loops: a thread_local named inside the loop is
// another thread's).
inline float* scratch_f32(int64_t n, int slot = 0) {
  thread_local std::vector<float> buf[2];
  std::vector<float>& mine = buf[slot];
  if (static_cast<int64_t>(mine.size()) < n) mine.resize(n);
  return mine.data();
}
