// Row statistics of a log-softmax over a large vocabulary, for the fused LM head
// (`rl.fused_head`): per row the log-probability of a target token, optionally the entropy,
// and optionally the softmax written over the logits in place (what the backward needs).
//
// torch spends five passes over each (rows, V) chunk here (logsumexp, gather, sub, exp, and
// for the entropy a product and a sum); this takes two, or three when it writes the softmax,
// with an AVX2 exp, rows split over threads.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>

#include "vec_math.h"

using longhaul::exp256;
using longhaul::hmax;
using longhaul::hsum;

// z (M, V) fp32 contiguous, targets (M,) int64 -> (logp (M,), entropy (M,) or empty).
// write_probs: z becomes softmax(z) in place.
std::vector<torch::Tensor> softmax_stats(torch::Tensor z, const torch::Tensor& targets, bool with_entropy, bool write_probs) {
  TORCH_CHECK(z.dim() == 2 && z.is_contiguous() && z.scalar_type() == at::kFloat, "softmax_stats: z must be (M, V) contiguous fp32");
  const auto t = targets.to(at::kLong).contiguous();
  const int64_t M = z.size(0), V = z.size(1);
  TORCH_CHECK(t.numel() == M, "softmax_stats: one target per row");
  const int64_t* tp = t.data_ptr<int64_t>();
  for (int64_t m = 0; m < M; ++m) TORCH_CHECK(tp[m] >= 0 && tp[m] < V, "softmax_stats: a target is outside the vocabulary");
  auto logp = torch::empty({M}, z.options());
  auto ent = with_entropy ? torch::empty({M}, z.options()) : torch::empty({0}, z.options());
  float* zp = z.data_ptr<float>();
  float* lp = logp.data_ptr<float>();
  float* ep = with_entropy ? ent.data_ptr<float>() : nullptr;
  at::parallel_for(0, M, 1, [&](int64_t m0, int64_t m1) {
    for (int64_t m = m0; m < m1; ++m) {
      float* row = zp + m * V;
      int64_t i = 0;
      __m256 mx8 = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
      for (; i + 8 <= V; i += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(row + i));
      float mx = hmax(mx8);
      for (; i < V; ++i) mx = std::max(mx, row[i]);
      const __m256 mxv = _mm256_set1_ps(mx);
      __m256 s8 = _mm256_setzero_ps(), sz8 = s8;  // sum e, sum e * (z - max), e = exp(z - max)
      float s = 0.f, sz = 0.f;
      const float target = row[tp[m]];
      for (i = 0; i + 8 <= V; i += 8) {
        const __m256 x = _mm256_sub_ps(_mm256_loadu_ps(row + i), mxv);
        const __m256 e = exp256(x);
        s8 = _mm256_add_ps(s8, e);
        if (with_entropy) sz8 = _mm256_fmadd_ps(e, x, sz8);
        if (write_probs) _mm256_storeu_ps(row + i, e);
      }
      for (; i < V; ++i) {
        const float x = row[i] - mx, e = std::exp(x);
        s += e;
        sz += e * x;
        if (write_probs) row[i] = e;
      }
      s += hsum(s8);
      sz += hsum(sz8);
      const float log_s = std::log(s);
      lp[m] = (target - mx) - log_s;
      if (ep) ep[m] = log_s - sz / s;  // H = lse - sum p z, both shifted by max(z): no cancellation
      if (write_probs) {
        const float inv = 1.f / s;
        const __m256 iv = _mm256_set1_ps(inv);
        for (i = 0; i + 8 <= V; i += 8) _mm256_storeu_ps(row + i, _mm256_mul_ps(_mm256_loadu_ps(row + i), iv));
        for (; i < V; ++i) row[i] *= inv;
      }
    }
  });
  return {logp, ent};
}
