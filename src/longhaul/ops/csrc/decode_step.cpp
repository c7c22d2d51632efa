// The decoder layers of a decode step in one native call: for a batch whose every sequence adds
// one token, the runner's per-layer sequence (RMSNorm, the qkv projection, RoPE with the cache
// write, paged attention, the output projection and residual, RMSNorm, gate/up, SwiGLU, down and
// residual) run here, calling the kernels of this module directly. At batch 1 a layer is ~12
// small ops; through Python each costs microseconds of interpreter and binding time, which at
// 30 layers is a sizeable share of a token's ~10 ms.
//
// The runner describes its layers once, when it packs its weights: `DecodeLayers` parses that
// description (kinds, tensors, widths) into native structs, so a step only walks a vector. A step
// writes every op's result into buffers it allocates once for all layers, and the residual adds
// are plain loops: a tensor allocation, or a torch op's dispatch, costs about a microsecond, and
// at ~12 ops a layer they add up to a few percent of a batch-1 token.

#include <torch/extension.h>

#include <cmath>
#include <string>
#include <vector>

#include "bf16.h"
#include "kernels.h"

namespace {

enum class Kind { fp32, bf16, blocks };

// kind "fp32" / "bf16" (w), "int8" (w, per-output scale), "q8_0" / "q4_0" / "q4_1" (w, d, m); the
// last four run the block kernel; bias empty or (N,), added by the kernel.
struct Linear {
  Kind kind = Kind::fp32;
  torch::Tensor w, a, b, bias;
  int64_t N = 0, bits = 0, offset = 0;

  // x (B, K) @ W -> out (B, N), contiguous, of x's dtype
  void operator()(const torch::Tensor& x, const torch::Tensor& out) const {
    switch (kind) {
      case Kind::fp32: mm_into(x, w, N, bias, out); return;
      case Kind::bf16: mm_bf16_out(x, w, N, bias, out); return;
      case Kind::blocks: mm_blocks_out(x, w, a, b, bits, offset, N, bias, out); return;
    }
  }
};

// h (B, E) += y (B, E), both contiguous of one dtype: one rounding a value, as torch's add.
template <class T>
void add_rows(T* h, const T* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) longhaul::store8(h + i, _mm256_add_ps(longhaul::load8(h + i), longhaul::load8(y + i)));
  for (; i < n; ++i) h[i] = static_cast<T>(longhaul::to_f(h[i]) + longhaul::to_f(y[i]));
}

void add_rows(const torch::Tensor& h, const torch::Tensor& y) {
  if (h.scalar_type() == at::kFloat) add_rows(h.data_ptr<float>(), y.data_ptr<float>(), h.numel());
  else add_rows(h.data_ptr<longhaul::bf16>(), y.data_ptr<longhaul::bf16>(), h.numel());
}

Linear linear_of(const py::tuple& t) {
  TORCH_CHECK(t.size() == 8, "DecodeLayers: a linear is (kind, w, a, b, bias, N, bits, offset)");
  Linear l;
  const auto kind = t[0].cast<std::string>();
  if (kind == "fp32") l.kind = Kind::fp32;
  else if (kind == "bf16") l.kind = Kind::bf16;
  else if (kind == "int8" || kind == "q8_0" || kind == "q4_0" || kind == "q4_1") l.kind = Kind::blocks;
  else TORCH_CHECK(false, "DecodeLayers: unknown linear kind ", kind);
  l.w = t[1].cast<torch::Tensor>();
  l.a = t[2].cast<torch::Tensor>();
  l.b = t[3].cast<torch::Tensor>();
  l.bias = t[4].cast<torch::Tensor>();
  l.N = t[5].cast<int64_t>();
  l.bits = t[6].cast<int64_t>();
  l.offset = t[7].cast<int64_t>();
  return l;
}

struct Layer {
  torch::Tensor ln1, ln2;
  Linear qkv, o, gate_up, down;
};

}  // namespace

struct DecodeLayers::Impl {
  std::vector<Layer> layers;
};

// layers: per layer (ln1, qkv, o, ln2, gate_up, down) with each linear as `Linear` above.
DecodeLayers::DecodeLayers(const py::list& layers) : impl_(std::make_shared<Impl>()) {
  impl_->layers.reserve(layers.size());
  for (const auto& item : layers) {
    const auto t = item.cast<py::tuple>();
    TORCH_CHECK(t.size() == 6, "DecodeLayers: a layer is (ln1, qkv, o, ln2, gate_up, down)");
    impl_->layers.push_back({t[0].cast<torch::Tensor>(), t[3].cast<torch::Tensor>(), linear_of(t[1].cast<py::tuple>()),
                             linear_of(t[2].cast<py::tuple>()), linear_of(t[4].cast<py::tuple>()),
                             linear_of(t[5].cast<py::tuple>())});
  }
}

int64_t DecodeLayers::size() const { return static_cast<int64_t>(impl_->layers.size()); }

// h (B, E): the step's hidden states after the embedding, one token a sequence; k_cache, v_cache
// (layers, slots, Hkv, D); cos, sin (B, D); slots (B,); block_tables (B, nb); lens (B,) with this
// token. Returns h after the last layer (the final norm and the head stay with the caller).
torch::Tensor DecodeLayers::run(torch::Tensor h, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& slots,
                                const torch::Tensor& block_tables, const torch::Tensor& lens, int64_t block_size,
                                int64_t Hq, double eps) const {
  const auto& ls = impl_->layers;
  TORCH_CHECK(h.dim() == 2 && k_cache.dim() == 4 && k_cache.size(0) == size(),
              "DecodeLayers: h (B, E) and a cache of one entry per layer");
  TORCH_CHECK(h.scalar_type() == at::kFloat || h.scalar_type() == at::kBFloat16, "DecodeLayers: h must be fp32 or bf16");
  const int64_t B = h.size(0), E = h.size(1), Hkv = k_cache.size(2), D = k_cache.size(3), H = Hq + 2 * Hkv;
  const double scale = std::pow(static_cast<double>(D), -0.5);  // as the runner computes it
  for (const Layer& L : ls)
    TORCH_CHECK(L.qkv.N == H * D && L.o.N == E && L.down.N == E && L.gate_up.N % 2 == 0,
                "DecodeLayers: a layer's widths do not match h and the cache");
  py::gil_scoped_release no_gil;  // the loop touches no Python object from here
  const auto sl = longs(slots), bt = longs(block_tables), ln = longs(lens);
  h = h.contiguous().clone();
  const auto opts = h.options();
  // one buffer a result, shared by the layers; gate_up's halves are views of its rows
  const auto xn = torch::empty({B, E}, opts), proj = torch::empty({B, E}, opts);
  const auto qkv = torch::empty({B, H * D}, opts), q = torch::empty({B, Hq, D}, opts), att = torch::empty({B, Hq, D}, opts);
  const auto qkv3 = qkv.view({B, H, D}), att2 = att.view({B, Hq * D});
  torch::Tensor gu, gate, up, act;
  for (size_t i = 0; i < ls.size(); ++i) {
    const Layer& L = ls[i];
    if (!gu.defined() || gu.size(1) != L.gate_up.N) {
      const int64_t F = L.gate_up.N / 2;
      gu = torch::empty({B, 2 * F}, opts), act = torch::empty({B, F}, opts);
      gate = gu.narrow(1, 0, F), up = gu.narrow(1, F, F);
    }
    const auto kc = k_cache.select(0, static_cast<int64_t>(i)), vc = v_cache.select(0, static_cast<int64_t>(i));
    rms_norm_out(h, L.ln1, eps, xn);
    L.qkv(xn, qkv);
    rope_and_cache_out(qkv3, cos, sin, kc, vc, sl, Hq, q);
    decode_attention_out(q, kc, vc, bt, ln, block_size, scale, att);
    L.o(att2, proj);
    add_rows(h, proj);
    rms_norm_out(h, L.ln2, eps, xn);
    L.gate_up(xn, gu);
    swiglu_out(gate, up, act);
    L.down(act, proj);
    add_rows(h, proj);
  }
  return h;
}
