// One token a row from raw logits, the sampler's hot path at small batch (`inference.sampling`):
// per row the max, the log-normaliser, and either the argmax (greedy) or the inverse-CDF draw for
// a given uniform, in two passes over the row with an AVX2 exp. torch spends about a dozen ops
// (and their dispatch) on the same.
//
// The draw follows `sampling.inverse_cdf`: weights w = exp(x - max) (exactly 0 where x is -inf),
// summed in fp32 per chunk of 256 and those sums accumulated in fp64; the chunk whose running sum
// first exceeds u * total is picked, then the token inside it by an fp64 running sum of its
// weights; a rounding that lands on a weight of 0 falls back to the last positive one before.

#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <limits>
#include <vector>

#include "vec_math.h"

using longhaul::exp256;
using longhaul::hmax;
using longhaul::hsum;

namespace {

constexpr int64_t kChunk = 256;
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// w = exp(x - m), 0 where x is -inf, for 8 values.
inline __m256 weights8(__m256 x, __m256 m) {
  const __m256 keep = _mm256_cmp_ps(x, _mm256_set1_ps(kNegInf), _CMP_NEQ_OQ);
  return _mm256_and_ps(exp256(_mm256_sub_ps(x, m)), keep);
}

inline float weight1(float x, float m) { return x == kNegInf ? 0.f : std::exp(x - m); }

// The sum of the weights of row[i0, i1); `out`, when given, receives them.
float chunk_sum(const float* row, int64_t i0, int64_t i1, float m, float* out = nullptr) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s8 = _mm256_setzero_ps();
  int64_t i = i0;
  for (; i + 8 <= i1; i += 8) {
    const __m256 w = weights8(_mm256_loadu_ps(row + i), mv);
    if (out) _mm256_storeu_ps(out + (i - i0), w);
    s8 = _mm256_add_ps(s8, w);
  }
  float s = hsum(s8);
  for (; i < i1; ++i) {
    const float w = weight1(row[i], m);
    if (out) out[i - i0] = w;
    s += w;
  }
  return s;
}

}  // namespace

int64_t sample_scratch(int64_t V) { return (V + kChunk - 1) / kChunk; }

// One row: the max, lse = max + log of the weights' sum, and the token (the argmax where u < 0,
// else the inverse-CDF draw for u); `sums` holds sample_scratch(V) values of scratch.
void sample_row(const float* row, int64_t V, double u, float* sums, int64_t* token, float* lse) {
  const int64_t C = sample_scratch(V);
  // pass 1: the max
  __m256 mx8 = _mm256_set1_ps(kNegInf);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) mx8 = _mm256_max_ps(mx8, _mm256_loadu_ps(row + i));
  float m = hmax(mx8);
  for (; i < V; ++i) m = std::max(m, row[i]);
  if (m == kNegInf) {  // nothing may be sampled: the caller's masks left no token
    *token = 0;
    *lse = kNegInf;
    return;
  }
  // pass 2: the weights' sums per chunk, accumulated in fp64
  double total = 0.0;
  for (int64_t c = 0; c < C; ++c) {
    sums[c] = chunk_sum(row, c * kChunk, std::min(V, (c + 1) * kChunk), m);
    total += sums[c];
  }
  *lse = m + static_cast<float>(std::log(total));
  if (u < 0) {  // greedy: the first index of the max
    int64_t j = 0;
    while (row[j] != m) ++j;
    *token = j;
    return;
  }
  const double target = u * total;
  double before = 0.0;
  int64_t c = 0, last_positive = 0;
  for (; c < C; ++c) {
    if (sums[c] > 0) last_positive = c;
    if (before + sums[c] > target) break;
    before += sums[c];
  }
  if (c == C || sums[c] <= 0) {  // a rounding past the end or onto an empty chunk
    c = last_positive;
    before = 0.0;
    for (int64_t k = 0; k < c; ++k) before += sums[k];
  }
  const double rest = std::max(0.0, target - before);
  const int64_t i0 = c * kChunk, i1 = std::min(V, i0 + kChunk);
  float w[kChunk];
  chunk_sum(row, i0, i1, m, w);  // the same weights the chunk's sum added
  double run = 0.0;
  int64_t j = 0, last = 0;
  for (; j < i1 - i0; ++j) {
    if (w[j] > 0) last = j;
    run += w[j];
    if (run > rest) break;
  }
  *token = i0 + (j < i1 - i0 ? j : last);
}

// x (B, V) fp32, u (B,) fp64: a uniform in [0, 1) per sampled row, negative for a greedy row.
// Returns (tokens (B,) int64, lse (B,) fp32: max + log of the weights' sum).
std::vector<torch::Tensor> sample_rows(const torch::Tensor& x, const torch::Tensor& u) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && x.device().is_cpu(), "sample_rows: x must be (B, V) fp32 on CPU");
  const auto xc = x.contiguous();
  const auto uc = u.to(at::kDouble).contiguous();
  const int64_t B = xc.size(0), V = xc.size(1);
  TORCH_CHECK(uc.numel() == B && V > 0, "sample_rows: one uniform per row and a non-empty vocabulary");
  auto tokens = torch::empty({B}, xc.options().dtype(at::kLong));
  auto lse = torch::empty({B}, xc.options());
  const float* xp = xc.data_ptr<float>();
  const double* up = uc.data_ptr<double>();
  int64_t* tp = tokens.data_ptr<int64_t>();
  float* lp = lse.data_ptr<float>();
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> sums(sample_scratch(V));
    for (int64_t b = b0; b < b1; ++b) sample_row(xp + b * V, V, up[b], sums.data(), tp + b, lp + b);
  });
  return {tokens, lse};
}
