// A decode step's activations on an int8 grid, for the integer-dot-product GEMMs
// (small_gemm_blocks.cpp: int8 and the block formats): each row's K values in groups of GK = 32, each
// group to codes q = round(x * 127 / max|x|) (|q| <= 127) with scale s = max|x| / 127, as
// llama.cpp quantizes activations for its Q8_0 dot products; a group of zeros gets s = 0. K is
// padded to a multiple of GK with zero codes.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "bf16.h"
#include "vec_math.h"

namespace longhaul {

constexpr int GK = 32;  // k values a group

// One call's activations on the int8 grid: per row, Kp codes, and per group its scale and the sum
// of its codes.
struct QuantRows {
  std::vector<int8_t> q;    // (M, Kp)
  std::vector<float> s;     // (M, Kp / GK)
  std::vector<int32_t> sum; // (M, Kp / GK)
  int64_t Kp = 0, groups = 0;
};

// One full group of GK values: the same codes, scale and sum as the scalar loop below, 8 lanes at
// a time (a product, then rounding to nearest even, as std::nearbyint does).
template <class T>
inline void quantize_group(const T* x, int8_t* q, float& s, int32_t& sum) {
  __m256 v[4], amax8 = _mm256_setzero_ps();
  const __m256 sign = _mm256_set1_ps(-0.f);
  for (int i = 0; i < 4; ++i) {
    v[i] = load8(x + 8 * i);
    amax8 = _mm256_max_ps(amax8, _mm256_andnot_ps(sign, v[i]));
  }
  const float amax = hmax(amax8);
  if (amax == 0.f) return;  // codes, scale and sum stay 0
  const __m256 inv = _mm256_set1_ps(127.f / amax);
  __m256i c[4];
  for (int i = 0; i < 4; ++i) c[i] = _mm256_cvtps_epi32(_mm256_mul_ps(v[i], inv));  // |.| <= 127
  const __m256i total = _mm256_add_epi32(_mm256_add_epi32(c[0], c[1]), _mm256_add_epi32(c[2], c[3]));
  __m128i t = _mm_add_epi32(_mm256_castsi256_si128(total), _mm256_extracti128_si256(total, 1));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0x4E));
  t = _mm_add_epi32(t, _mm_shuffle_epi32(t, 0xB1));
  // the packs interleave the 128-bit lanes; the permute puts the 32 bytes back in order
  const __m256i bytes = _mm256_packs_epi16(_mm256_packs_epi32(c[0], c[1]), _mm256_packs_epi32(c[2], c[3]));
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(q), _mm256_permutevar8x32_epi32(bytes, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7)));
  s = amax / 127.f;
  sum = _mm_cvtsi128_si32(t);
}

template <class T>
inline void quantize_rows(const T* x, int64_t M, int64_t K, QuantRows& out) {
  out.Kp = (K + GK - 1) / GK * GK;
  out.groups = out.Kp / GK;
  out.q.assign(M * out.Kp, 0);
  out.s.assign(M * out.groups, 0.f);
  out.sum.assign(M * out.groups, 0);
  float buf[GK];
  for (int64_t m = 0; m < M; ++m)
    for (int64_t g = 0; g < out.groups; ++g) {
      const int64_t k0 = g * GK, n = std::min<int64_t>(GK, K - k0);
      if (n == GK) {
        quantize_group(x + m * K + k0, out.q.data() + m * out.Kp + k0, out.s[m * out.groups + g], out.sum[m * out.groups + g]);
        continue;
      }
      float amax = 0.f;
      for (int64_t i = 0; i < GK; ++i) {
        buf[i] = i < n ? to_f(x[m * K + k0 + i]) : 0.f;
        amax = std::max(amax, std::fabs(buf[i]));
      }
      if (amax == 0.f) continue;
      const float inv = 127.f / amax;
      int8_t* q = out.q.data() + m * out.Kp + k0;
      int32_t total = 0;
      for (int64_t i = 0; i < GK; ++i) {
        q[i] = static_cast<int8_t>(std::nearbyint(buf[i] * inv));  // |.| <= 127
        total += q[i];
      }
      out.s[m * out.groups + g] = amax / 127.f;
      out.sum[m * out.groups + g] = total;
    }
}

}  // namespace longhaul
