// fp32 ops of the packed training forward (`longhaul.rl.packed_forward`) and their gradients,
// on AVX2 + FMA CPUs: SwiGLU, and the move of q, k, v between the flat rows and the padded
// attention rows that SDPA runs on, with RoPE applied on the way in.
//
// Through torch, each of these is a chain of small elementwise ops (silu, mul; index_select,
// permute copies, and RoPE's mul / neg / cat / add), every one a pass over memory, forward and
// backward, and autograd stitches the gradients of split views back together with cat. Here
// each is one pass each way, reading the inputs through their strides (the views of a fused
// qkv or gate_up projection, SDPA's outputs as they come) and writing the gradients straight
// into the caller's buffer (the fused projection's gradient, no cat).
//
// Layout (as `PackedBatch`): attention row r has kv_len[r] keys, the flat rows kv_index[r, :L],
// in position order, and its queries are the last ones; flat row n's query sits at
// out_index[n] = r * Tq + t. In the padded tensors SDPA sees, the query heads are folded into
// the query length: qp[r, h, g * Tq + t] is query head h * G + g of that row, for KV head h.
// Pads are zeros (masked in attention, so their values never matter).

#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <type_traits>
#include <vector>

#include "bf16.h"
#include "vec_math.h"

namespace {

using longhaul::bf16;
using longhaul::exp256;
using longhaul::load8;
using longhaul::store8;
using longhaul::to_f;

void check_rows(const torch::Tensor& t, int64_t dims, const char* what) {
  TORCH_CHECK(t.dim() == dims && t.scalar_type() == at::kFloat && t.stride(dims - 1) == 1,
              what, ": expected an fp32 tensor of ", dims, " dims with unit stride in the last");
}

// y = RoPE(x) for one head of D: HF's half-split rotation, y = x cos + rotate_half(x) sin.
inline void rope(const float* x, const float* c, const float* s, float* y, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) y[i] = x[i] * c[i] - x[i + half] * s[i];
  for (int64_t i = half; i < D; ++i) y[i] = x[i] * c[i] + x[i - half] * s[i];
}

// x = RoPE^T(y) in place (the gradient of `rope`: its transpose).
inline void rope_transpose(float* y, const float* c, const float* s, int64_t D) {
  const int64_t half = D / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float a = y[i], b = y[i + half];
    y[i] = a * c[i] + b * s[i + half];
    y[i + half] = b * c[i + half] - a * s[i];
  }
}

}  // namespace

// silu(gate) * up for gate, up (N, F) views (unit column stride) -> (N, F), fp32 or bf16 (bf16
// as HF computes it in bf16: silu rounded, then the product rounded).
template <class T>
void swiglu_raw(const T* gp, const T* upp, T* op, int64_t N, int64_t F, int64_t gs, int64_t us) {
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    const __m256 one = _mm256_set1_ps(1.f);
    for (int64_t n = n0; n < n1; ++n) {
      const T* g = gp + n * gs;
      const T* u = upp + n * us;
      T* o = op + n * F;
      int64_t i = 0;
      for (; i + 8 <= F; i += 8) {
        const __m256 x = load8(g + i);
        __m256 act = _mm256_div_ps(x, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        if (std::is_same<T, bf16>::value) act = longhaul::as_bf16(act);
        store8(o + i, _mm256_mul_ps(act, load8(u + i)));
      }
      for (; i < F; ++i) {
        const float x = to_f(g[i]);
        o[i] = static_cast<T>(longhaul::rounded<T>(x / (1.f + std::exp(-x))) * to_f(u[i]));
      }
    }
  });
}

template void swiglu_raw<float>(const float*, const float*, float*, int64_t, int64_t, int64_t, int64_t);
template void swiglu_raw<bf16>(const bf16*, const bf16*, bf16*, int64_t, int64_t, int64_t, int64_t);

torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up) {
  TORCH_CHECK(gate.dim() == 2 && up.dim() == 2 && gate.stride(1) == 1 && up.stride(1) == 1 &&
              (gate.scalar_type() == at::kFloat || gate.scalar_type() == at::kBFloat16) &&
              up.scalar_type() == gate.scalar_type(),
              "swiglu: gate and up must be 2-D fp32 or bf16 views of one dtype with unit stride in the last dim");
  TORCH_CHECK(gate.sizes() == up.sizes(), "swiglu: gate and up differ in shape");
  const int64_t N = gate.size(0), F = gate.size(1), gs = gate.stride(0), us = up.stride(0);
  auto out = torch::empty({N, F}, gate.options());
  if (gate.scalar_type() == at::kFloat)
    swiglu_raw(gate.data_ptr<float>(), up.data_ptr<float>(), out.data_ptr<float>(), N, F, gs, us);
  else
    swiglu_raw(gate.data_ptr<bf16>(), up.data_ptr<bf16>(), out.data_ptr<bf16>(), N, F, gs, us);
  return out;
}

// The gradient of `swiglu` for dout (N, F), written into dgate, dup (views, e.g. the two halves
// of one fused gate_up gradient): dup = dout silu(gate), dgate = dout up s (1 + gate (1 - s)),
// s = sigmoid(gate).
void swiglu_backward(const torch::Tensor& dout, const torch::Tensor& gate, const torch::Tensor& up, torch::Tensor dgate,
                     torch::Tensor dup) {
  check_rows(dout, 2, "swiglu_backward dout");
  check_rows(gate, 2, "swiglu_backward gate");
  check_rows(up, 2, "swiglu_backward up");
  check_rows(dgate, 2, "swiglu_backward dgate");
  check_rows(dup, 2, "swiglu_backward dup");
  TORCH_CHECK(dout.sizes() == gate.sizes() && up.sizes() == gate.sizes() && dgate.sizes() == gate.sizes() &&
              dup.sizes() == gate.sizes(), "swiglu_backward: shapes differ");
  const int64_t N = gate.size(0), F = gate.size(1);
  const float* dp = dout.data_ptr<float>();
  const float* gp = gate.data_ptr<float>();
  const float* upp = up.data_ptr<float>();
  float* dgp = dgate.data_ptr<float>();
  float* dup_ = dup.data_ptr<float>();
  const int64_t ds = dout.stride(0), gs = gate.stride(0), us = up.stride(0), dgs = dgate.stride(0), dus = dup.stride(0);
  at::parallel_for(0, N, 8, [&](int64_t n0, int64_t n1) {
    const __m256 one = _mm256_set1_ps(1.f);
    for (int64_t n = n0; n < n1; ++n) {
      const float* d = dp + n * ds;
      const float* g = gp + n * gs;
      const float* u = upp + n * us;
      float* dg = dgp + n * dgs;
      float* du = dup_ + n * dus;
      int64_t i = 0;
      for (; i + 8 <= F; i += 8) {
        const __m256 x = _mm256_loadu_ps(g + i), dv = _mm256_loadu_ps(d + i);
        const __m256 sig = _mm256_div_ps(one, _mm256_add_ps(one, exp256(_mm256_sub_ps(_mm256_setzero_ps(), x))));
        _mm256_storeu_ps(du + i, _mm256_mul_ps(dv, _mm256_mul_ps(x, sig)));
        const __m256 ds_ = _mm256_mul_ps(sig, _mm256_fmadd_ps(x, _mm256_sub_ps(one, sig), one));
        _mm256_storeu_ps(dg + i, _mm256_mul_ps(_mm256_mul_ps(dv, _mm256_loadu_ps(u + i)), ds_));
      }
      for (; i < F; ++i) {
        const float s = 1.f / (1.f + std::exp(-g[i]));
        du[i] = d[i] * g[i] * s;
        dg[i] = d[i] * u[i] * s * (1.f + g[i] * (1.f - s));
      }
    }
  });
}

// q (N, Hq, D), k, v (N, Hkv, D) (views), cos, sin (N, D) -> [qp (R, Hkv, G Tq, D) roped,
// kp (R, Hkv, Lk, D) roped, vp (R, Hkv, Lk, D)], contiguous, pads zero.
std::vector<torch::Tensor> attention_pack(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& q_index,
                                          const torch::Tensor& q_len, const torch::Tensor& kv_index,
                                          const torch::Tensor& kv_len) {
  check_rows(q, 3, "attention_pack q");
  check_rows(k, 3, "attention_pack k");
  check_rows(v, 3, "attention_pack v");
  const auto c = cos.contiguous(), s = sin.contiguous();
  const auto qi = q_index.to(at::kLong).contiguous(), ki = kv_index.to(at::kLong).contiguous();
  const auto ql = q_len.to(at::kLong).contiguous(), kl = kv_len.to(at::kLong).contiguous();
  const int64_t N = q.size(0), Hq = q.size(1), D = q.size(2), Hkv = k.size(1);
  const int64_t R = qi.size(0), Tq = qi.size(1), Lk = ki.size(1);
  TORCH_CHECK(k.sizes() == v.sizes() && k.size(0) == N && k.size(2) == D && Hq % Hkv == 0 && D % 2 == 0,
              "attention_pack: q (N, Hq, D), k and v (N, Hkv, D) with Hkv dividing Hq");
  TORCH_CHECK(c.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat && c.size(0) == N && c.size(1) == D &&
              s.sizes() == c.sizes(), "attention_pack: cos and sin must be fp32 (N, D)");
  TORCH_CHECK(ki.size(0) == R && ql.numel() == R && kl.numel() == R, "attention_pack: index shapes differ");
  const int64_t G = Hq / Hkv;
  const int64_t* qip = qi.data_ptr<int64_t>();
  const int64_t* kip = ki.data_ptr<int64_t>();
  const int64_t* qlp = ql.data_ptr<int64_t>();
  const int64_t* klp = kl.data_ptr<int64_t>();
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(qlp[r] >= 0 && qlp[r] <= Tq && klp[r] >= 0 && klp[r] <= Lk, "attention_pack: a length is out of range");
    for (int64_t t = 0; t < qlp[r]; ++t) TORCH_CHECK(qip[r * Tq + t] >= 0 && qip[r * Tq + t] < N, "attention_pack: a query index is out of range");
    for (int64_t l = 0; l < klp[r]; ++l) TORCH_CHECK(kip[r * Lk + l] >= 0 && kip[r * Lk + l] < N, "attention_pack: a key index is out of range");
  }
  auto qp = torch::empty({R, Hkv, G * Tq, D}, q.options());
  auto kp = torch::empty({R, Hkv, Lk, D}, q.options());
  auto vp = torch::empty({R, Hkv, Lk, D}, q.options());
  const float* qd = q.data_ptr<float>();
  const float* kd = k.data_ptr<float>();
  const float* vd = v.data_ptr<float>();
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  float* qo = qp.data_ptr<float>();
  float* ko = kp.data_ptr<float>();
  float* vo = vp.data_ptr<float>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1), ks0 = k.stride(0), ks1 = k.stride(1), vs0 = v.stride(0), vs1 = v.stride(1);
  at::parallel_for(0, R * Hkv, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t r = u / Hkv, h = u % Hkv;
      for (int64_t g = 0; g < G; ++g)
        for (int64_t t = 0; t < Tq; ++t) {
          float* o = qo + ((u * G + g) * Tq + t) * D;
          if (t >= qlp[r]) { std::fill(o, o + D, 0.f); continue; }
          const int64_t n = qip[r * Tq + t];
          rope(qd + n * qs0 + (h * G + g) * qs1, cp + n * D, sp + n * D, o, D);
        }
      for (int64_t l = 0; l < Lk; ++l) {
        float* ko_ = ko + (u * Lk + l) * D;
        float* vo_ = vo + (u * Lk + l) * D;
        if (l >= klp[r]) { std::fill(ko_, ko_ + D, 0.f); std::fill(vo_, vo_ + D, 0.f); continue; }
        const int64_t n = kip[r * Lk + l];
        rope(kd + n * ks0 + h * ks1, cp + n * D, sp + n * D, ko_, D);
        const float* vi = vd + n * vs0 + h * vs1;
        std::copy(vi, vi + D, vo_);
      }
    }
  });
  return {qp, kp, vp};
}

// The gradient of `attention_pack`: dqp, dkp, dvp (any strides, unit in the last) -> written into
// dq (N, Hq, D), dk, dv (N, Hkv, D) (views, overwritten). A query row is read from one place
// (out_index); a key row that several attention rows share (a shared prompt) sums its
// gradients, one thread per (k or v, KV head) in a fixed order, so the sums do not depend on
// scheduling. RoPE is linear per row, so its transpose is applied once, after the sums.
void attention_pack_backward(const torch::Tensor& dqp, const torch::Tensor& dkp, const torch::Tensor& dvp,
                             const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& out_index,
                             const torch::Tensor& kv_index, const torch::Tensor& kv_len, torch::Tensor dq, torch::Tensor dk,
                             torch::Tensor dv) {
  check_rows(dqp, 4, "attention_pack_backward dqp");
  check_rows(dkp, 4, "attention_pack_backward dkp");
  check_rows(dvp, 4, "attention_pack_backward dvp");
  check_rows(dq, 3, "attention_pack_backward dq");
  check_rows(dk, 3, "attention_pack_backward dk");
  check_rows(dv, 3, "attention_pack_backward dv");
  const auto c = cos.contiguous(), s = sin.contiguous();
  const auto oi = out_index.to(at::kLong).contiguous(), ki = kv_index.to(at::kLong).contiguous();
  const auto kl = kv_len.to(at::kLong).contiguous();
  const int64_t N = dq.size(0), Hq = dq.size(1), D = dq.size(2), Hkv = dk.size(1);
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0 && dqp.size(2) % (Hq / Hkv) == 0, "attention_pack_backward: Hq must be a multiple of the KV heads");
  TORCH_CHECK(c.scalar_type() == at::kFloat && s.scalar_type() == at::kFloat && s.sizes() == c.sizes(),
              "attention_pack_backward: cos and sin must be fp32 (N, D)");
  const int64_t R = dkp.size(0), Lk = dkp.size(2), G = Hq / Hkv, Tq = dqp.size(2) / G;
  TORCH_CHECK(dk.sizes() == dv.sizes() && dk.size(0) == N && dqp.size(0) == R && dqp.size(1) == Hkv && dqp.size(3) == D &&
              dkp.sizes() == dvp.sizes() && dkp.size(1) == Hkv && oi.numel() == N && ki.size(0) == R && ki.size(1) == Lk &&
              kl.numel() == R && c.size(0) == N && c.size(1) == D, "attention_pack_backward: shapes do not match");
  const int64_t* oip = oi.data_ptr<int64_t>();
  const int64_t* kip = ki.data_ptr<int64_t>();
  const int64_t* klp = kl.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) TORCH_CHECK(oip[n] >= 0 && oip[n] < R * Tq, "attention_pack_backward: an output index is out of range");
  for (int64_t r = 0; r < R; ++r) {
    TORCH_CHECK(klp[r] >= 0 && klp[r] <= Lk, "attention_pack_backward: a length is out of range");
    for (int64_t l = 0; l < klp[r]; ++l) TORCH_CHECK(kip[r * Lk + l] >= 0 && kip[r * Lk + l] < N, "attention_pack_backward: a key index is out of range");
  }
  const float* cp = c.data_ptr<float>();
  const float* sp = s.data_ptr<float>();
  const float* gq = dqp.data_ptr<float>();
  const float* gk = dkp.data_ptr<float>();
  const float* gv = dvp.data_ptr<float>();
  float* oq = dq.data_ptr<float>();
  float* ok = dk.data_ptr<float>();
  float* ov = dv.data_ptr<float>();
  const int64_t q0 = dqp.stride(0), q1 = dqp.stride(1), q2 = dqp.stride(2);
  const int64_t k0 = dkp.stride(0), k1 = dkp.stride(1), k2 = dkp.stride(2);
  const int64_t v0 = dvp.stride(0), v1 = dvp.stride(1), v2 = dvp.stride(2);
  const int64_t a0 = dq.stride(0), a1 = dq.stride(1), b0 = dk.stride(0), b1 = dk.stride(1), e0 = dv.stride(0), e1 = dv.stride(1);
  // queries: one read each, parallel over rows
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t r = oip[n] / Tq, t = oip[n] % Tq;
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const int64_t h = hq / G, g = hq % G;
        const float* src = gq + r * q0 + h * q1 + (g * Tq + t) * q2;
        float* dst = oq + n * a0 + hq * a1;
        std::copy(src, src + D, dst);
        rope_transpose(dst, cp + n * D, sp + n * D, D);
      }
    }
  });
  // keys and values: one task per (k or v, KV head), each its own columns
  at::parallel_for(0, 2 * Hkv, 1, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const bool is_k = u < Hkv;
      const int64_t h = u % Hkv;
      const float* src = is_k ? gk : gv;
      const int64_t s0 = is_k ? k0 : v0, s1 = is_k ? k1 : v1, s2 = is_k ? k2 : v2;
      float* dst = is_k ? ok : ov;
      const int64_t d0 = is_k ? b0 : e0, d1 = is_k ? b1 : e1;
      for (int64_t n = 0; n < N; ++n) std::fill(dst + n * d0 + h * d1, dst + n * d0 + h * d1 + D, 0.f);
      for (int64_t r = 0; r < R; ++r)
        for (int64_t l = 0; l < klp[r]; ++l) {
          const float* x = src + r * s0 + h * s1 + l * s2;
          float* y = dst + kip[r * Lk + l] * d0 + h * d1;
          for (int64_t i = 0; i < D; ++i) y[i] += x[i];
        }
      if (is_k)
        for (int64_t n = 0; n < N; ++n) rope_transpose(dst + n * d0 + h * d1, cp + n * D, sp + n * D, D);
    }
  });
}

// o (R, Hkv, G Tq, D) (any strides, unit in the last) -> (N, Hq D): flat row n's heads from its
// attention row's query slot out_index[n].
torch::Tensor attention_unpack(const torch::Tensor& o, const torch::Tensor& out_index, int64_t Hq) {
  check_rows(o, 4, "attention_unpack");
  const auto oi = out_index.to(at::kLong).contiguous();
  const int64_t R = o.size(0), Hkv = o.size(1), D = o.size(3), N = oi.numel();
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0 && o.size(2) % (Hq / Hkv) == 0, "attention_unpack: Hq must be a multiple of the KV heads");
  const int64_t G = Hq / Hkv, Tq = o.size(2) / G;
  const int64_t* oip = oi.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) TORCH_CHECK(oip[n] >= 0 && oip[n] < R * Tq, "attention_unpack: an output index is out of range");
  auto out = torch::empty({N, Hq * D}, o.options());
  const float* src = o.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  const int64_t s0 = o.stride(0), s1 = o.stride(1), s2 = o.stride(2);
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t r = oip[n] / Tq, t = oip[n] % Tq;
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const float* x = src + r * s0 + (hq / G) * s1 + ((hq % G) * Tq + t) * s2;
        std::copy(x, x + D, dst + (n * Hq + hq) * D);
      }
    }
  });
  return out;
}

// The gradient of `attention_unpack`: g (N, Hq D) -> (R, Hkv, G Tq, D), zeros at the pads.
torch::Tensor attention_unpack_backward(const torch::Tensor& g, const torch::Tensor& out_index, int64_t R, int64_t Tq,
                                        int64_t Hkv, int64_t Hq) {
  check_rows(g, 2, "attention_unpack_backward");
  const auto oi = out_index.to(at::kLong).contiguous();
  const int64_t N = g.size(0);
  TORCH_CHECK(oi.numel() == N && Hkv > 0 && Hq % Hkv == 0 && g.size(1) % Hq == 0,
              "attention_unpack_backward: shapes do not match");
  const int64_t G = Hq / Hkv, D = g.size(1) / Hq, gs = g.stride(0);
  const int64_t* oip = oi.data_ptr<int64_t>();
  for (int64_t n = 0; n < N; ++n) TORCH_CHECK(oip[n] >= 0 && oip[n] < R * Tq, "attention_unpack_backward: an output index is out of range");
  auto out = torch::zeros({R, Hkv, G * Tq, D}, g.options());
  const float* src = g.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, N, 16, [&](int64_t n0, int64_t n1) {
    for (int64_t n = n0; n < n1; ++n) {
      const int64_t r = oip[n] / Tq, t = oip[n] % Tq;
      for (int64_t hq = 0; hq < Hq; ++hq) {
        const float* x = src + n * gs + hq * D;
        std::copy(x, x + D, dst + ((r * Hkv + hq / G) * G * Tq + (hq % G) * Tq + t) * D);
      }
    }
  });
  return out;
}
