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

#include <torch/extension.h>

#include "bf16.h"

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

// x (M, K) fp32 or bf16 CPU (checked by the caller) on the grid.
inline QuantRows quantize_input(const torch::Tensor& x) {
  const auto xc = x.contiguous();
  QuantRows out;
  if (xc.scalar_type() == at::kFloat)
    quantize_rows(xc.data_ptr<float>(), xc.size(0), xc.size(1), out);
  else
    quantize_rows(xc.data_ptr<bf16>(), xc.size(0), xc.size(1), out);
  return out;
}

}  // namespace longhaul
