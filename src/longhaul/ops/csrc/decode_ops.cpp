// Decode-step ops beside the matmuls: paged attention, RMSNorm, RoPE with the cache write, on
// AVX2 + FMA CPUs, for fp32 and bf16 tensors (one template; bf16 values are widened to fp32 on
// load, all arithmetic is fp32, results are rounded to bf16 once, where HF rounds, on store).
//
// In a decode step each op sees a handful of rows, so torch's per-op cost (dispatch, the
// gather of a sequence's K/V blocks into a padded copy, a mask, SDPA's setup) outweighs the
// arithmetic: on SmolLM2-135M at batch 8 they took ~25 ms a step against ~35 ms of matmuls.
// Attention here reads K and V straight from the paged cache (no gather, no mask), a task per
// (sequence, KV head, split of the context) serving the head's G query heads from one read of
// each key and value; the softmax is the max-subtracted one in fp32, merged over splits.

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "bf16.h"
#include "panels.h"
#include "vec_math.h"

namespace {

using longhaul::bf16;
using longhaul::exp256;
using longhaul::hmax;
using longhaul::hsum;
using longhaul::load8;
using longhaul::store8;
using longhaul::to_f;

inline float dot(const float* a, const float* b, int64_t n) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = acc0;
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i + 8), _mm256_loadu_ps(b + i + 8), acc1);
  }
  for (; i + 8 <= n; i += 8) acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(a + i), _mm256_loadu_ps(b + i), acc0);
  float s = hsum(_mm256_add_ps(acc0, acc1));
  for (; i < n; ++i) s += a[i] * b[i];
  return s;
}

// q (fp32) . k (fp32 or bf16) for one key of n values.
template <class T>
inline float dot_key(const float* q, const T* k, int64_t n) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), acc);
  float s = hsum(acc);
  for (; i < n; ++i) s += q[i] * to_f(k[i]);
  return s;
}

// q . k for 8 keys at once (D a multiple of 8): one accumulator a key, reduced together.
template <class T>
inline __m256 dot8(const float* q, const T* const* k, int64_t D) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
  for (int64_t i = 0; i < D; i += 8) {
    const __m256 qv = _mm256_loadu_ps(q + i);
    a0 = _mm256_fmadd_ps(qv, load8(k[0] + i), a0);
    a1 = _mm256_fmadd_ps(qv, load8(k[1] + i), a1);
    a2 = _mm256_fmadd_ps(qv, load8(k[2] + i), a2);
    a3 = _mm256_fmadd_ps(qv, load8(k[3] + i), a3);
    a4 = _mm256_fmadd_ps(qv, load8(k[4] + i), a4);
    a5 = _mm256_fmadd_ps(qv, load8(k[5] + i), a5);
    a6 = _mm256_fmadd_ps(qv, load8(k[6] + i), a6);
    a7 = _mm256_fmadd_ps(qv, load8(k[7] + i), a7);
  }
  // pairwise sums: lane j of the result is key j's dot product
  const __m256 s0 = _mm256_hadd_ps(_mm256_hadd_ps(a0, a1), _mm256_hadd_ps(a2, a3));
  const __m256 s1 = _mm256_hadd_ps(_mm256_hadd_ps(a4, a5), _mm256_hadd_ps(a6, a7));
  return _mm256_add_ps(_mm256_permute2f128_ps(s0, s1, 0x20), _mm256_permute2f128_ps(s0, s1, 0x31));
}

// Rows of one KV head sit Hkv rows apart in the paged cache and jump at every block, so the
// hardware prefetchers do not see them coming: the loops below ask for the row kAhead positions
// on while they work on this one (into L2: a long context's rows would not fit L1).
constexpr int64_t kAhead = 64;

inline void prefetch_row(const void* row, int64_t bytes) {
  const char* c = static_cast<const char*>(row);
  for (int64_t i = 0; i < bytes; i += 64) _mm_prefetch(c + i, _MM_HINT_T1);
}

// acc (DV * 8,) += sum_{p in [p0, p1)} w[p] v[slot[p]], the accumulators held in registers;
// prefetches the rows of positions up to `ahead` (none when 0).
template <int DV, class T>
inline void weighted_sum(const float* w, const int64_t* slot, int64_t p0, int64_t p1, int64_t ahead, const T* v,
                         float* acc_out) {
  __m256 acc[DV];
#pragma GCC unroll 16
  for (int i = 0; i < DV; ++i) acc[i] = _mm256_loadu_ps(acc_out + 8 * i);
  for (int64_t p = p0; p < p1; ++p) {
    if (p + kAhead < ahead) prefetch_row(v + slot[p + kAhead] * DV * 8, DV * 8 * sizeof(T));
    const T* vv = v + slot[p] * DV * 8;
    const __m256 a = _mm256_set1_ps(w[p]);
#pragma GCC unroll 16
    for (int i = 0; i < DV; ++i) acc[i] = _mm256_fmadd_ps(a, load8(vv + 8 * i), acc[i]);
  }
#pragma GCC unroll 16
  for (int i = 0; i < DV; ++i) _mm256_storeu_ps(acc_out + 8 * i, acc[i]);
}

template <class T>
inline void weighted_sum_any(const float* w, const int64_t* slot, int64_t p0, int64_t p1, const T* v, int64_t D, float* acc) {
  for (int64_t p = p0; p < p1; ++p)
    for (int64_t i = 0; i < D; ++i) acc[i] += w[p] * to_f(v[slot[p] * D + i]);
}

constexpr int64_t kSpan = 64;        // positions whose keys / values serve all G query heads while in L1
constexpr int64_t kMinSplit = 32;    // the fewest positions a task takes when a context is split over threads
constexpr int64_t kSerialWork = 256;  // (position, KV head) pairs below which a step's attention stays on one thread

// One task: query heads [h*G, h*G + G) of sequence b over the positions whose K/V rows are
// slot[p0..p1).
// Writes, per query head, the running max m, the sum of exp(s - m) and the unnormalised
// output sum_p exp(s_p - m) v_p into part (G rows of D + 2 floats). Each key and value is read
// from memory once for the G heads: the heads take turns over a span of positions in L1.
template <class T>
void attend_part(const T* qp, const T* kp, const T* vp, const int64_t* slot, int64_t p0, int64_t p1, int64_t b, int64_t h,
                 int64_t Hq, int64_t G, int64_t D, float sc, std::vector<float>& qf, std::vector<float>& w, float* part) {
  const int64_t L = p1 - p0;
  qf.resize(G * D);
  w.resize(G * L);
  for (int64_t g = 0; g < G; ++g) {
    const T* qrow = qp + (b * Hq + h * G + g) * D;
    for (int64_t i = 0; i < D; ++i) qf[g * D + i] = to_f(qrow[i]) * sc;
  }
  std::vector<float> mx(G, -INFINITY);
  int64_t p = p0;
  if (D % 8 == 0) {
    std::vector<__m256> mx8(G, _mm256_set1_ps(-INFINITY));
    for (int64_t a = p; a < std::min(p1, p + kAhead); ++a) prefetch_row(kp + slot[a] * D, D * sizeof(T));
    for (; p + 8 <= p1; p += 8) {
      for (int64_t a = p + kAhead; a < std::min(p1, p + kAhead + 8); ++a) prefetch_row(kp + slot[a] * D, D * sizeof(T));
      const T* keys[8];
      for (int j = 0; j < 8; ++j) keys[j] = kp + slot[p + j] * D;
      for (int64_t g = 0; g < G; ++g) {
        const __m256 s8 = dot8(qf.data() + g * D, keys, D);
        _mm256_storeu_ps(w.data() + g * L + (p - p0), s8);
        mx8[g] = _mm256_max_ps(mx8[g], s8);
      }
    }
    for (int64_t g = 0; g < G; ++g) mx[g] = hmax(mx8[g]);
  }
  for (; p < p1; ++p)
    for (int64_t g = 0; g < G; ++g) {
      const float s = dot_key(qf.data() + g * D, kp + slot[p] * D, D);
      w[g * L + (p - p0)] = s;
      mx[g] = std::max(mx[g], s);
    }
  for (int64_t a = p0; a < std::min(p1, p0 + kAhead); ++a) prefetch_row(vp + slot[a] * D, D * sizeof(T));
  for (int64_t g = 0; g < G; ++g) {
    float* wg = w.data() + g * L;
    const __m256 mxv = _mm256_set1_ps(mx[g]);
    __m256 s8 = _mm256_setzero_ps();
    float sum = 0.f;
    int64_t i = 0;
    for (; i + 8 <= L; i += 8) {
      const __m256 e = exp256(_mm256_sub_ps(_mm256_loadu_ps(wg + i), mxv));
      _mm256_storeu_ps(wg + i, e);
      s8 = _mm256_add_ps(s8, e);
    }
    for (; i < L; ++i) {
      wg[i] = std::exp(wg[i] - mx[g]);
      sum += wg[i];
    }
    float* row = part + g * (D + 2);
    row[0] = mx[g];
    row[1] = sum + hsum(s8);
    std::fill(row + 2, row + 2 + D, 0.f);
  }
  const int64_t* sl = slot + p0;
  for (int64_t s0 = 0; s0 < L; s0 += kSpan) {
    const int64_t s1 = std::min(L, s0 + kSpan);
    for (int64_t g = 0; g < G; ++g) {
      const float* wg = w.data() + g * L;
      float* acc = part + g * (D + 2) + 2;
      if (D == 64)
        weighted_sum<8>(wg, sl, s0, s1, g == 0 ? L : 0, vp, acc);
      else if (D == 128)
        weighted_sum<16>(wg, sl, s0, s1, g == 0 ? L : 0, vp, acc);
      else
        weighted_sum_any(wg, sl, s0, s1, vp, D, acc);
    }
  }
}

// Paged decode attention. A task is (sequence, KV head, a split of the context): one split when
// there are enough (sequence, head) pairs to keep every thread busy, else each context is cut
// into up to threads * 4 / pairs splits of at least kMinSplit positions, computed apart and then
// merged by their log-sum-exp (flash-decoding's split), so one long sequence uses every core.
// With one split a task normalises its heads' rows and writes them out itself; a step whose
// contexts hold fewer than kSerialWork (position, KV head) pairs in all runs on the calling thread,
// since waking the others costs more than the arithmetic.
template <class T>
void attention_impl(const T* qp, const T* kp, const T* vp, const int64_t* btp, const int64_t* lp, T* op, int64_t B,
                    int64_t Hq, int64_t Hkv, int64_t D, int64_t nb, int64_t block_size, float sc) {
  if (B == 0) return;
  const int64_t G = Hq / Hkv, threads = at::get_num_threads();
  int64_t longest = 0, work = 0;
  for (int64_t b = 0; b < B; ++b) {
    longest = std::max(longest, lp[b]);
    work += lp[b] * Hkv;
  }
  const int64_t want = (threads * 4 + B * Hkv - 1) / (B * Hkv);
  const int64_t S = std::max<int64_t>(1, std::min(want, longest / kMinSplit));
  const int64_t row = D + 2;
  std::vector<float> parts(S > 1 ? B * Hq * S * row : 0);
  // writes the G heads' rows of `part` (G rows of D + 2) normalised to out (G rows of D)
  auto finish = [D](const float* part, int64_t G, T* out) {
    for (int64_t g = 0; g < G; ++g, part += D + 2, out += D) {
      if (part[0] == -INFINITY) {  // an empty context: zeros
        for (int64_t i = 0; i < D; ++i) out[i] = static_cast<T>(0.f);
        continue;
      }
      const float inv = 1.f / part[1];
      for (int64_t i = 0; i < D; ++i) out[i] = static_cast<T>(part[2 + i] * inv);
    }
  };
  auto tasks = [&](int64_t t0, int64_t t1) {
    std::vector<float> qf, w, mine(G * row);
    std::vector<int64_t> slot;
    for (int64_t t = t0; t < t1; ++t) {
      const int64_t s = t % S, h = (t / S) % Hkv, b = t / (S * Hkv), L = lp[b];
      const int64_t per = (L + S - 1) / S, p0 = std::min(L, s * per), p1 = std::min(L, p0 + per);
      if (p0 >= p1) {
        for (int64_t g = 0; g < G; ++g) mine[g * row] = -INFINITY;
      } else {
        slot.resize(p1 - p0);  // K/V rows of this head at positions p0..p1 of the sequence's blocks
        for (int64_t p = p0; p < p1; ++p) slot[p - p0] = (btp[b * nb + p / block_size] * block_size + p % block_size) * Hkv + h;
        attend_part(qp, kp, vp, slot.data(), 0, p1 - p0, b, h, Hq, G, D, sc, qf, w, mine.data());
      }
      if (S == 1) {
        finish(mine.data(), G, op + (b * Hq + h * G) * D);
        continue;
      }
      float* part = parts.data() + ((b * Hq + h * G) * S) * row;  // rows of (head g, split s) at (g * S + s)
      for (int64_t g = 0; g < G; ++g) std::copy(mine.begin() + g * row, mine.begin() + (g + 1) * row, part + (g * S + s) * row);
    }
  };
  if (work < kSerialWork) tasks(0, B * Hkv * S);
  else at::parallel_for(0, B * Hkv * S, 1, tasks);
  if (S == 1) return;
  at::parallel_for(0, B * Hq, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> o(D);
    for (int64_t r = r0; r < r1; ++r) {
      const float* pr = parts.data() + r * S * row;
      float m = -INFINITY;
      for (int64_t s = 0; s < S; ++s) m = std::max(m, pr[s * row]);
      T* out = op + r * D;
      if (m == -INFINITY) {  // an empty context: zeros
        for (int64_t i = 0; i < D; ++i) out[i] = static_cast<T>(0.f);
        continue;
      }
      std::fill(o.begin(), o.end(), 0.f);
      float l = 0.f;
      for (int64_t s = 0; s < S; ++s) {
        if (pr[s * row] == -INFINITY) continue;
        const float f = std::exp(pr[s * row] - m);
        l += f * pr[s * row + 1];
        for (int64_t i = 0; i < D; ++i) o[i] += f * pr[s * row + 2 + i];
      }
      const float inv = 1.f / l;
      for (int64_t i = 0; i < D; ++i) out[i] = static_cast<T>(o[i] * inv);
    }
  });
}

// RMSNorm of one row: fp32 as HF computes it in fp32; bf16 as HF's LlamaRMSNorm does in bf16,
// w * bf16(x * r), rounded twice.
template <class T>
inline void rms_row(const T* x, const T* w, T* y, int64_t E, float eps) {
  __m256 acc = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= E; i += 8) {
    const __m256 v = load8(x + i);
    acc = _mm256_fmadd_ps(v, v, acc);
  }
  float ss = hsum(acc);
  for (int64_t j = i; j < E; ++j) ss += to_f(x[j]) * to_f(x[j]);
  const float inv = 1.f / std::sqrt(ss / static_cast<float>(E) + eps);
  const __m256 iv = _mm256_set1_ps(inv);
  i = 0;
  for (; i + 8 <= E; i += 8) {
    __m256 n = _mm256_mul_ps(load8(x + i), iv);
    if (std::is_same<T, bf16>::value) n = longhaul::as_bf16(n);
    store8(y + i, _mm256_mul_ps(load8(w + i), n));
  }
  for (; i < E; ++i) y[i] = static_cast<T>(to_f(w[i]) * longhaul::rounded<T>(to_f(x[i]) * inv));
}

template <class T>
void rope_cache_impl(const T* xp, const T* cp, const T* snp, T* qp, T* kc, T* vc, const int64_t* sp, int64_t N, int64_t H,
                     int64_t Hq, int64_t Hkv, int64_t D) {
  const int64_t half = D / 2;
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    std::vector<float> c(D), s(D);
    for (int64_t n = n0; n < n1; ++n) {
      for (int64_t i = 0; i < D; ++i) c[i] = to_f(cp[n * D + i]), s[i] = to_f(snp[n * D + i]);
      for (int64_t h = 0; h < Hq + Hkv; ++h) {
        const T* in = xp + (n * H + h) * D;
        T* out = h < Hq ? qp + (n * Hq + h) * D : kc + (sp[n] * Hkv + (h - Hq)) * D;
        int64_t i = 0;
        if (half % 8 == 0)
          for (; i < half; i += 8) {
            const __m256 a = load8(in + i), b = load8(in + i + half);
            store8(out + i, _mm256_fmsub_ps(a, _mm256_loadu_ps(&c[i]), _mm256_mul_ps(b, _mm256_loadu_ps(&s[i]))));
            store8(out + i + half,
                   _mm256_fmadd_ps(b, _mm256_loadu_ps(&c[i + half]), _mm256_mul_ps(a, _mm256_loadu_ps(&s[i + half]))));
          }
        for (; i < half; ++i) {
          const float a = to_f(in[i]), b = to_f(in[i + half]);
          out[i] = static_cast<T>(a * c[i] - b * s[i]);
          out[i + half] = static_cast<T>(b * c[i + half] + a * s[i + half]);
        }
      }
      std::copy(xp + (n * H + Hq + Hkv) * D, xp + (n * H + H) * D, vc + sp[n] * Hkv * D);
    }
  });
}

bool fp32_or_bf16(const torch::Tensor& t) { return t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16; }

}  // namespace

// Raw forms for a caller that checked its tensors once (DecodeLayers): the same arithmetic as the
// tensor functions below. Context lengths and slots are the caller's to check.
template <class T>
void rms_norm_raw(const T* x, const T* w, T* y, int64_t N, int64_t E, float eps) {
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) rms_row(x + n * E, w, y + n * E, E, eps);
  });
}

template <class T>
void rope_and_cache_raw(const T* qkv, const T* cos, const T* sin, T* q, T* kc, T* vc, const int64_t* slots, int64_t N,
                        int64_t Hq, int64_t Hkv, int64_t D) {
  rope_cache_impl(qkv, cos, sin, q, kc, vc, slots, N, Hq + 2 * Hkv, Hq, Hkv, D);
}

template <class T>
void decode_attention_raw(const T* q, const T* kc, const T* vc, const int64_t* block_tables, const int64_t* lens, T* out,
                          int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t nb, int64_t block_size, float scale) {
  attention_impl(q, kc, vc, block_tables, lens, out, B, Hq, Hkv, D, nb, block_size, scale);
}

template void rms_norm_raw<float>(const float*, const float*, float*, int64_t, int64_t, float);
template void rms_norm_raw<bf16>(const bf16*, const bf16*, bf16*, int64_t, int64_t, float);
template void rope_and_cache_raw<float>(const float*, const float*, const float*, float*, float*, float*, const int64_t*,
                                        int64_t, int64_t, int64_t, int64_t);
template void rope_and_cache_raw<bf16>(const bf16*, const bf16*, const bf16*, bf16*, bf16*, bf16*, const int64_t*, int64_t,
                                       int64_t, int64_t, int64_t);
template void decode_attention_raw<float>(const float*, const float*, const float*, const int64_t*, const int64_t*, float*,
                                          int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float);
template void decode_attention_raw<bf16>(const bf16*, const bf16*, const bf16*, const int64_t*, const int64_t*, bf16*,
                                         int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, float);

// q (B, Hq, D); k_cache, v_cache (slots, Hkv, D) of one layer; block_tables (B, nb) int64;
// context_lens (B,) int64: attend to positions [0, len) -> (B, Hq, D). q and the cache share
// one dtype, fp32 or bf16; the output has it too.
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& block_tables, const torch::Tensor& context_lens, int64_t block_size,
                               double scale) {
  TORCH_CHECK(q.dim() == 3 && fp32_or_bf16(q), "decode_attention: q must be (B, Hq, D) fp32 or bf16");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == q.scalar_type() &&
              v_cache.scalar_type() == q.scalar_type(), "decode_attention: the cache must be contiguous, of q's dtype");
  const auto qc = q.contiguous();
  const auto bt = contiguous_as(block_tables, at::kLong);
  const auto lens = contiguous_as(context_lens, at::kLong);
  const int64_t B = qc.size(0), Hq = qc.size(1), D = qc.size(2), Hkv = k_cache.size(1), nb = bt.size(1);
  TORCH_CHECK(k_cache.size(2) == D && Hq % Hkv == 0, "decode_attention: head sizes do not match the cache");
  auto out = torch::empty_like(qc);  // every row is written, an empty context's as zeros
  const int64_t* btp = bt.data_ptr<int64_t>();
  const int64_t* lp = lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)  // checked here: an error cannot leave a parallel region
    TORCH_CHECK(lp[b] >= 0 && lp[b] <= nb * block_size, "decode_attention: a context length exceeds its block table");
  const float sc = static_cast<float>(scale);
  if (qc.scalar_type() == at::kFloat)
    attention_impl(qc.data_ptr<float>(), k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), btp, lp,
                   out.data_ptr<float>(), B, Hq, Hkv, D, nb, block_size, sc);
  else
    attention_impl(qc.data_ptr<bf16>(), k_cache.data_ptr<bf16>(), v_cache.data_ptr<bf16>(), btp, lp, out.data_ptr<bf16>(),
                   B, Hq, Hkv, D, nb, block_size, sc);
  return out;
}

// x (N, E), weight (E,) of one dtype, fp32 or bf16 -> weight * (x * rsqrt(mean(x^2) + eps)), as
// HF's LlamaRMSNorm (mean in fp32).
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps) {
  TORCH_CHECK(x.dim() == 2 && fp32_or_bf16(x) && weight.scalar_type() == x.scalar_type() && weight.numel() == x.size(1),
              "rms_norm: x (N, E) and weight (E,), both fp32 or both bf16");
  const auto xc = x.contiguous();
  const auto wc = weight.contiguous();
  auto y = torch::empty_like(xc);
  const float e = static_cast<float>(eps);
  if (xc.scalar_type() == at::kFloat)
    rms_norm_raw(xc.data_ptr<float>(), wc.data_ptr<float>(), y.data_ptr<float>(), xc.size(0), xc.size(1), e);
  else
    rms_norm_raw(xc.data_ptr<bf16>(), wc.data_ptr<bf16>(), y.data_ptr<bf16>(), xc.size(0), xc.size(1), e);
  return y;
}

// qkv (N, Hq + 2 Hkv, D): RoPE on q and k by cos, sin (N, D) (HF's half-split rotation),
// rotated k and plain v stored at `slots` (N,) of one layer's k_cache, v_cache (slots, Hkv, D);
// returns the rotated q (N, Hq, D). All of one dtype, fp32 or bf16 (one rounding a value).
torch::Tensor rope_and_cache(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                             torch::Tensor k_cache, torch::Tensor v_cache, const torch::Tensor& slots, int64_t Hq) {
  const auto dt = qkv.scalar_type();
  TORCH_CHECK(qkv.dim() == 3 && fp32_or_bf16(qkv) && cos.scalar_type() == dt && sin.scalar_type() == dt,
              "rope_and_cache: qkv (N, H, D), cos and sin of one dtype, fp32 or bf16");
  TORCH_CHECK(k_cache.is_contiguous() && v_cache.is_contiguous() && k_cache.scalar_type() == dt &&
              v_cache.scalar_type() == dt, "rope_and_cache: the cache must be contiguous, of qkv's dtype");
  const auto x = qkv.contiguous();
  const auto c = cos.contiguous(), sn = sin.contiguous();
  const auto sl = contiguous_as(slots, at::kLong);
  const int64_t N = x.size(0), H = x.size(1), D = x.size(2), Hkv = k_cache.size(1), S = k_cache.size(0);
  TORCH_CHECK(H == Hq + 2 * Hkv && k_cache.size(2) == D && D % 2 == 0 && c.size(0) == N && c.size(1) == D,
              "rope_and_cache: shapes do not match");
  const int64_t* sp = sl.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) TORCH_CHECK(sp[n] >= 0 && sp[n] < S, "rope_and_cache: a slot is outside the cache");
  auto q = torch::empty({N, Hq, D}, x.options());
  if (dt == at::kFloat)
    rope_cache_impl(x.data_ptr<float>(), c.data_ptr<float>(), sn.data_ptr<float>(), q.data_ptr<float>(),
                    k_cache.data_ptr<float>(), v_cache.data_ptr<float>(), sp, N, H, Hq, Hkv, D);
  else
    rope_cache_impl(x.data_ptr<bf16>(), c.data_ptr<bf16>(), sn.data_ptr<bf16>(), q.data_ptr<bf16>(), k_cache.data_ptr<bf16>(),
                    v_cache.data_ptr<bf16>(), sp, N, H, Hq, Hkv, D);
  return q;
}

// The gradient of `rms_norm` for g (N, E): dx = r (w g) - x r^3 mean(w g x), dw = sum_n g x r,
// r = rsqrt(mean(x^2) + eps). -> (dx (N, E), dw (E,)). Threads sum dw in partial rows, added in
// thread order, so the result does not depend on scheduling.
std::vector<torch::Tensor> rms_norm_backward(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& weight,
                                             double eps) {
  TORCH_CHECK(x.dim() == 2 && x.scalar_type() == at::kFloat && g.sizes() == x.sizes() && g.scalar_type() == at::kFloat &&
              weight.scalar_type() == at::kFloat && weight.numel() == x.size(1), "rms_norm_backward: g, x (N, E), weight (E,) fp32");
  const auto xc = x.contiguous(), gc = g.contiguous(), wc = weight.contiguous();
  const int64_t N = xc.size(0), E = xc.size(1);
  constexpr int64_t kRows = 64;  // rows a partial dw: a fixed split, the same for any thread count
  const int64_t parts = std::max<int64_t>(1, (N + kRows - 1) / kRows);
  auto dx = torch::empty_like(xc);
  auto partial = torch::zeros({parts, E}, xc.options());
  const float* xp = xc.data_ptr<float>();
  const float* gp = gc.data_ptr<float>();
  const float* wp = wc.data_ptr<float>();
  float* dxp = dx.data_ptr<float>();
  float* pp = partial.data_ptr<float>();
  at::parallel_for(0, parts, 1, [&](int64_t c0, int64_t c1) {
    for (int64_t c = c0; c < c1; ++c) {
      float* dw = pp + c * E;
      for (int64_t n = c * kRows; n < std::min(N, (c + 1) * kRows); ++n) {
        const float* xr = xp + n * E;
        const float* gr = gp + n * E;
        const float r = 1.f / std::sqrt(dot(xr, xr, E) / static_cast<float>(E) + static_cast<float>(eps));
        float wgx = 0.f;
        for (int64_t i = 0; i < E; ++i) wgx += wp[i] * gr[i] * xr[i];
        const float k = r * r * r * wgx / static_cast<float>(E);
        float* d = dxp + n * E;
        for (int64_t i = 0; i < E; ++i) {
          d[i] = r * wp[i] * gr[i] - xr[i] * k;
          dw[i] += gr[i] * xr[i] * r;
        }
      }
    }
  });
  return {dx, partial.sum(0)};
}
