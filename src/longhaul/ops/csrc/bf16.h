// Loads and stores of 8 values as fp32 registers, from and to fp32 or bf16 memory (AVX2), so one
// kernel template serves both precisions: a bf16 is the top half of an fp32, and an fp32 is
// rounded to the nearest bf16, ties to even (as torch and oneDNN round). NaN inputs are not
// preserved as NaN (the engine's values are finite).
#pragma once

#include <c10/util/BFloat16.h>
#include <immintrin.h>

#include <cstdint>

namespace longhaul {

using bf16 = c10::BFloat16;

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const bf16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

// The 8 bf16 nearest v (ties to even), as 8 16-bit lanes.
inline __m128i round_bf16(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_srli_epi32(_mm256_add_epi32(u, _mm256_add_epi32(_mm256_set1_epi32(0x7fff), lsb)), 16);
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

inline void store8(bf16* p, __m256 v) { _mm_storeu_si128(reinterpret_cast<__m128i*>(p), round_bf16(v)); }

// v rounded to bf16 and widened back: the value a bf16 tensor would hold.
inline __m256 as_bf16(__m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(round_bf16(v)), 16));
}

inline float to_f(float x) { return x; }
inline float to_f(bf16 x) { return static_cast<float>(x); }

template <class T>
inline T from_f(float x) { return static_cast<T>(x); }

// The scalar twin of as_bf16 for T = bf16; the identity for fp32.
template <class T>
inline float rounded(float x) { return static_cast<float>(static_cast<T>(x)); }

}  // namespace longhaul
