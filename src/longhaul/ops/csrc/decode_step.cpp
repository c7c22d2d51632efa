// The decoder layers of a decode step in one native call: for a batch whose every sequence adds
// one token, the runner's per-layer sequence (RMSNorm, the qkv projection, RoPE with the cache
// write, paged attention, the output projection and residual, RMSNorm, gate/up, SwiGLU, down and
// residual) run here, calling the kernels of this module directly. At batch 1 a layer is ~12
// small ops; through Python each costs microseconds of interpreter and binding time, which at
// 30 layers is a sizeable share of a token's ~10 ms.
//
// A projection is described once, when the runner packs its weights, by a `Linear`: its kind
// (which kernel), the tensors that kernel reads and its output width. Bias, when the kernel does
// not add it, is part of the description too.

#include <torch/extension.h>

#include <cmath>
#include <string>
#include <vector>

#include "kernels.h"

namespace {

// kind: "fp32" (w), "bf16" (w), "int8" (w, scale), "q8_0" / "q4_0" / "q4_1" (w, d, m); bias
// empty or (N,), added by the kernel.
struct Linear {
  std::string kind;
  torch::Tensor w, a, b, bias;
  int64_t N = 0, bits = 0, offset = 0;

  torch::Tensor operator()(const torch::Tensor& x) const {
    if (kind == "fp32") return mm(x, w, N, bias);
    if (kind == "bf16") return mm_bf16(x, w, N, bias);
    if (kind == "int8") return mm_int8(x, w, a, bias);
    return mm_blocks(x, w, a, b, bits, offset, N, bias);
  }
};

Linear linear_of(const py::tuple& t) {
  TORCH_CHECK(t.size() == 8, "decode_layers: a linear is (kind, w, a, b, bias, N, bits, offset)");
  Linear l;
  l.kind = t[0].cast<std::string>();
  TORCH_CHECK(l.kind == "fp32" || l.kind == "bf16" || l.kind == "int8" || l.kind == "q8_0" || l.kind == "q4_0" ||
              l.kind == "q4_1", "decode_layers: unknown linear kind ", l.kind);
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

// h (B, E): the step's hidden states after the embedding, one token a sequence; layers: per
// layer (ln1, qkv, o, ln2, gate_up, down) with each linear as `Linear` above; k_cache, v_cache
// (layers, slots, Hkv, D); cos, sin (B, D); slots (B,); block_tables (B, nb); lens (B,) with this
// token. Returns h after the last layer (the final norm and the head stay with the caller).
torch::Tensor decode_layers(torch::Tensor h, const py::list& layers, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                            const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& slots,
                            const torch::Tensor& block_tables, const torch::Tensor& lens, int64_t block_size, int64_t Hq,
                            double eps) {
  TORCH_CHECK(h.dim() == 2 && k_cache.dim() == 4 && k_cache.size(0) == static_cast<int64_t>(layers.size()),
              "decode_layers: h (B, E) and a cache of one entry per layer");
  std::vector<Layer> ls;
  ls.reserve(layers.size());
  for (const auto& item : layers) {
    const auto t = item.cast<py::tuple>();
    TORCH_CHECK(t.size() == 6, "decode_layers: a layer is (ln1, qkv, o, ln2, gate_up, down)");
    ls.push_back({t[0].cast<torch::Tensor>(), t[3].cast<torch::Tensor>(), linear_of(t[1].cast<py::tuple>()),
                  linear_of(t[2].cast<py::tuple>()), linear_of(t[4].cast<py::tuple>()), linear_of(t[5].cast<py::tuple>())});
  }
  const int64_t B = h.size(0), Hkv = k_cache.size(2), D = k_cache.size(3), H = Hq + 2 * Hkv;
  const double scale = std::pow(static_cast<double>(D), -0.5);  // as the runner computes it
  py::gil_scoped_release no_gil;  // the loop touches no Python object from here
  h = h.contiguous().clone();
  for (size_t i = 0; i < ls.size(); ++i) {
    const Layer& L = ls[i];
    const auto kc = k_cache.select(0, static_cast<int64_t>(i)), vc = v_cache.select(0, static_cast<int64_t>(i));
    const auto qkv = L.qkv(rms_norm(h, L.ln1, eps)).view({B, H, D});
    const auto q = rope_and_cache(qkv, cos, sin, kc, vc, slots, Hq);
    const auto o = decode_attention(q, kc, vc, block_tables, lens, block_size, scale).view({B, Hq * D});
    h.add_(L.o(o));
    const auto gu = L.gate_up(rms_norm(h, L.ln2, eps));
    const int64_t F = gu.size(1) / 2;
    h.add_(L.down(swiglu(gu.narrow(1, 0, F), gu.narrow(1, F, F))));
  }
  return h;
}
