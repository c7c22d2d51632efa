// The decoder layers of a decode step in one native call: for a batch whose every sequence adds
// one token, the runner's per-layer sequence (RMSNorm, the qkv projection, RoPE with the cache
// write, paged attention, the output projection and residual, RMSNorm, gate/up, SwiGLU, down and
// residual) run here, calling the kernels of this module directly. At batch 1 a layer is ~12
// small ops; through Python each costs microseconds of interpreter and binding time, which at
// 30 layers is a sizeable share of a token's ~10 ms.
//
// The runner describes its layers once, when it packs its weights: `DecodeLayers` parses that
// description (kinds, tensors, widths) into native structs of raw pointers and sizes, checked
// there, so a step checks its own tensors once and then only walks a vector, calling the kernels'
// raw forms. A step writes every op's result into buffers it allocates once for all layers, and
// the residual adds are plain loops. Between two weight streams every line of a tensor's metadata
// is a miss to memory, and a tensor allocation or a torch op's dispatch costs about a
// microsecond: at ~12 ops a layer they came to a few percent of a batch-1 token.

#include <torch/extension.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <type_traits>
#include <vector>

#include "bf16.h"
#include "kernels.h"
#include "panels.h"
#include "quant_rows.h"

namespace {

using longhaul::bf16;
using longhaul::GK;

enum class Kind { fp32, bf16, blocks };

// kind "fp32" / "bf16" (w), "int8" (w, per-output scale a), "q8_0" / "q4_0" / "q4_1" (w, group
// scales a, minimums b); the last four run the block kernel; bias empty or (N,) (fp32 panels: (G *
// nr,) zero padded), added by the kernel. The tensors stay here; the kernels get their pointers.
struct Linear {
  Kind kind = Kind::fp32;
  torch::Tensor w, a, b, bias;
  int64_t N = 0, K = 0, G = 0, nr = 0, bits = 0, offset = 0;
  bool dp = false;  // bf16: the AVX512-BF16 packing
  const void* wp = nullptr;
  const uint16_t *d = nullptr, *m = nullptr;  // block formats: packed fp16 group scales and minimums
  const float *scale = nullptr, *biasp = nullptr;

  // x (M, K) -> out (M, N), both of the step's dtype T
  template <class T>
  void operator()(const T* x, int64_t M, T* out) const {
    if (kind == Kind::blocks) {
      mm_blocks_raw(x, M, K, static_cast<const uint8_t*>(wp), G, nr, d, m, scale, static_cast<int>(bits),
                    static_cast<int>(offset), N, biasp, out);
    } else if constexpr (std::is_same<T, float>::value) {
      mm_raw(x, M, K, static_cast<const float*>(wp), G, nr, biasp, N, out);
    } else {
      mm_bf16_raw(x, M, K, static_cast<const uint16_t*>(wp), dp, G, N, biasp, out);
    }
  }
};

Linear linear_of(const py::tuple& t) {
  TORCH_CHECK(t.size() == 9, "DecodeLayers: a linear is (kind, w, a, b, bias, N, K, bits, offset)");
  Linear l;
  const auto kind = t[0].cast<std::string>();
  if (kind == "fp32") l.kind = Kind::fp32;
  else if (kind == "bf16") l.kind = Kind::bf16;
  else if (kind == "int8" || kind == "q8_0" || kind == "q4_0" || kind == "q4_1") l.kind = Kind::blocks;
  else TORCH_CHECK(false, "DecodeLayers: unknown linear kind ", kind);
  l.w = t[1].cast<torch::Tensor>().contiguous();
  l.a = t[2].cast<torch::Tensor>().contiguous();
  l.b = t[3].cast<torch::Tensor>().contiguous();
  l.bias = t[4].cast<torch::Tensor>();
  l.N = t[5].cast<int64_t>();
  l.K = t[6].cast<int64_t>();
  l.bits = t[7].cast<int64_t>();
  l.offset = t[8].cast<int64_t>();
  TORCH_CHECK(l.N > 0 && l.K > 0, "DecodeLayers: a linear's widths must be positive");
  l.wp = l.w.data_ptr();
  if (l.kind == Kind::fp32) {
    TORCH_CHECK(l.w.dim() == 3 && l.w.scalar_type() == at::kFloat && l.w.size(1) == l.K &&
                (l.w.size(2) == 8 || (l.w.size(2) == 16 && has_avx512())) && l.N <= l.w.size(0) * l.w.size(2),
                "DecodeLayers: an fp32 weight must be packed (G, K, 8 or 16) for this CPU");
    l.G = l.w.size(0), l.nr = l.w.size(2);
    TORCH_CHECK(!l.bias.numel() || (l.bias.scalar_type() == at::kFloat && l.bias.numel() == l.G * l.nr),
                "DecodeLayers: an fp32 bias must be padded to the panels");
    if (l.bias.numel()) l.bias = l.bias.contiguous(), l.biasp = l.bias.data_ptr<float>();
    return l;
  }
  if (l.bias.numel()) {
    TORCH_CHECK(l.bias.numel() == l.N, "DecodeLayers: a bias must have N values");
    l.bias = contiguous_as(l.bias, at::kFloat), l.biasp = l.bias.data_ptr<float>();
  }
  if (l.kind == Kind::bf16) {
    l.dp = l.w.dim() == 4;
    TORCH_CHECK(l.w.scalar_type() == at::kBFloat16 && (l.dp ? l.w.size(2) == 16 && l.w.size(1) * 2 == l.K && has_avx512_bf16()
                                                            : l.w.dim() == 3 && l.w.size(2) == 8 && l.w.size(1) == l.K),
                "DecodeLayers: a bf16 weight must be packed for this CPU (dp or widen) over K inputs");
    l.G = l.w.size(0), l.nr = l.w.size(2);
    TORCH_CHECK(l.N <= l.G * l.nr, "DecodeLayers: N does not match the packed bf16 weight");
    return l;
  }
  const int64_t groups = (l.K + GK - 1) / GK;
  TORCH_CHECK(l.bits == 4 || l.bits == 8, "DecodeLayers: block codes are 4 or 8 bits");
  TORCH_CHECK(l.w.dim() == 2 && l.w.scalar_type() == at::kByte, "DecodeLayers: block codes must be 2-D uint8");
  if (l.a.dim() == 1) {  // per output channel: 8-bit codes, fp32 scales
    TORCH_CHECK(l.bits == 8 && l.a.scalar_type() == at::kFloat && l.a.numel() == l.N && !l.b.numel(),
                "DecodeLayers: per-channel codes need (N,) fp32 scales and no minimums");
    l.G = l.w.size(0), l.nr = l.w.size(1) / (groups * GK);
    l.scale = l.a.data_ptr<float>();
  } else {
    TORCH_CHECK(l.a.dim() == 3 && l.a.scalar_type() == at::kHalf && l.a.size(1) == groups &&
                (!l.b.numel() || l.b.sizes() == l.a.sizes()), "DecodeLayers: packed group scales do not match K");
    l.G = l.a.size(0), l.nr = l.a.size(2);
    l.d = reinterpret_cast<const uint16_t*>(l.a.data_ptr<at::Half>());
    if (l.b.numel()) l.m = reinterpret_cast<const uint16_t*>(l.b.data_ptr<at::Half>());
  }
  TORCH_CHECK((l.nr == 8 || (l.nr == 16 && has_avx512_vnni())) && l.w.size(0) == l.G &&
              l.w.size(1) == groups * GK * l.nr * l.bits / 8 && l.N <= l.G * l.nr,
              "DecodeLayers: packed codes do not match K, N and the scales, or this CPU");
  return l;
}

struct Layer {
  torch::Tensor ln1, ln2;
  Linear qkv, o, gate_up, down;
  const void *n1 = nullptr, *n2 = nullptr;  // the norms' weights
};

// h (n values) += y, both of one dtype: one rounding a value, as torch's add.
template <class T>
void add_rows(T* h, const T* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) longhaul::store8(h + i, _mm256_add_ps(longhaul::load8(h + i), longhaul::load8(y + i)));
  for (; i < n; ++i) h[i] = static_cast<T>(longhaul::to_f(h[i]) + longhaul::to_f(y[i]));
}

}  // namespace

struct DecodeLayers::Impl {
  std::vector<Layer> layers;
  at::ScalarType dtype = at::kFloat;  // of the norms, the activations and the cache
  int64_t E = 0, F = 0;               // hidden width; the widest SwiGLU

  template <class T>
  torch::Tensor run(torch::Tensor h, const torch::Tensor& k_cache, const torch::Tensor& v_cache, const torch::Tensor& cos,
                    const torch::Tensor& sin, const torch::Tensor& slots, const torch::Tensor& block_tables,
                    const torch::Tensor& lens, int64_t block_size, int64_t Hq, double eps) const;
};

// layers: per layer (ln1, qkv, o, ln2, gate_up, down) with each linear as `Linear` above.
DecodeLayers::DecodeLayers(const py::list& layers) : impl_(std::make_shared<Impl>()) {
  auto& im = *impl_;
  im.layers.reserve(layers.size());
  for (const auto& item : layers) {
    const auto t = item.cast<py::tuple>();
    TORCH_CHECK(t.size() == 6, "DecodeLayers: a layer is (ln1, qkv, o, ln2, gate_up, down)");
    im.layers.push_back({t[0].cast<torch::Tensor>().contiguous(), t[3].cast<torch::Tensor>().contiguous(),
                         linear_of(t[1].cast<py::tuple>()), linear_of(t[2].cast<py::tuple>()),
                         linear_of(t[4].cast<py::tuple>()), linear_of(t[5].cast<py::tuple>())});
  }
  TORCH_CHECK(!im.layers.empty(), "DecodeLayers: no layers");
  im.dtype = im.layers[0].ln1.scalar_type();
  im.E = im.layers[0].ln1.numel();
  TORCH_CHECK(im.dtype == at::kFloat || im.dtype == at::kBFloat16, "DecodeLayers: the norms must be fp32 or bf16");
  for (Layer& L : im.layers) {
    L.n1 = L.ln1.data_ptr(), L.n2 = L.ln2.data_ptr();
    for (const auto* ln : {&L.ln1, &L.ln2})
      TORCH_CHECK(ln->scalar_type() == im.dtype && ln->numel() == im.E, "DecodeLayers: the norms differ in dtype or width");
    for (const Linear* l : {&L.qkv, &L.o, &L.gate_up, &L.down})
      TORCH_CHECK(l->kind == Kind::blocks || (l->kind == Kind::fp32) == (im.dtype == at::kFloat),
                  "DecodeLayers: an fp32 weight needs fp32 norms and a bf16 weight bf16 ones");
    TORCH_CHECK(L.qkv.K == im.E && L.gate_up.K == im.E && L.o.N == im.E && L.down.N == im.E && L.gate_up.N % 2 == 0 &&
                L.down.K == L.gate_up.N / 2, "DecodeLayers: a layer's widths do not chain");
    // a step's buffers hold one layer's attention widths: every layer has the first one's
    TORCH_CHECK(L.qkv.N == im.layers[0].qkv.N && L.o.K == im.layers[0].o.K,
                "DecodeLayers: the layers' attention widths differ");
    im.F = std::max(im.F, L.gate_up.N / 2);
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
  if (impl_->dtype == at::kFloat)
    return impl_->run<float>(h, k_cache, v_cache, cos, sin, slots, block_tables, lens, block_size, Hq, eps);
  return impl_->run<bf16>(h, k_cache, v_cache, cos, sin, slots, block_tables, lens, block_size, Hq, eps);
}

template <class T>
torch::Tensor DecodeLayers::Impl::run(torch::Tensor h, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                                      const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& slots,
                                      const torch::Tensor& block_tables, const torch::Tensor& lens, int64_t block_size,
                                      int64_t Hq, double eps) const {
  const int64_t L = static_cast<int64_t>(layers.size());
  TORCH_CHECK(h.dim() == 2 && h.size(1) == E && h.scalar_type() == dtype, "DecodeLayers: h must be (B, E) of the norms' dtype");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(0) == L && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
              v_cache.is_contiguous() && k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype,
              "DecodeLayers: a contiguous cache of one entry per layer, in h's dtype");
  const int64_t B = h.size(0), S = k_cache.size(1), Hkv = k_cache.size(2), D = k_cache.size(3), H = Hq + 2 * Hkv;
  if (B == 0) return h.clone();
  TORCH_CHECK(Hkv > 0 && Hq % Hkv == 0 && D % 2 == 0 && block_size > 0,
              "DecodeLayers: head counts, head size or block size do not fit the cache");
  TORCH_CHECK(layers[0].qkv.N == H * D && layers[0].o.K == Hq * D, "DecodeLayers: the layers' widths do not match the heads");
  const auto c = cos.contiguous(), sn = sin.contiguous();
  TORCH_CHECK(c.scalar_type() == dtype && sn.scalar_type() == dtype && c.dim() == 2 && c.size(0) == B && c.size(1) == D &&
              sn.sizes() == c.sizes(), "DecodeLayers: cos and sin (B, D) in h's dtype");
  const auto sl = contiguous_as(slots, at::kLong), bt = contiguous_as(block_tables, at::kLong);
  const auto ln = contiguous_as(lens, at::kLong);
  TORCH_CHECK(sl.numel() == B && bt.dim() == 2 && bt.size(0) == B && ln.numel() == B,
              "DecodeLayers: slots, block tables and lengths must have one row a sequence");
  const int64_t nb = bt.size(1);
  const int64_t* sp = sl.data_ptr<int64_t>();
  const int64_t* lp = ln.data_ptr<int64_t>();
  const int64_t* btp = bt.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(sp[b] >= 0 && sp[b] < S, "DecodeLayers: a slot is outside the cache");
    TORCH_CHECK(lp[b] >= 0 && lp[b] <= nb * block_size, "DecodeLayers: a context length exceeds its block table");
    for (int64_t j = 0; j * block_size < lp[b]; ++j) {
      const int64_t block = btp[b * nb + j];
      TORCH_CHECK(block >= 0 && (block + 1) * block_size <= S, "DecodeLayers: a block is outside the cache");
    }
  }
  const double scale = std::pow(static_cast<double>(D), -0.5);  // as the runner computes it
  py::gil_scoped_release no_gil;  // the loop touches no Python object from here
  h = h.clone(at::MemoryFormat::Contiguous);
  // one buffer a result, shared by the layers
  auto buf = torch::empty({B * (2 * E + H * D + 2 * Hq * D + 3 * F)}, h.options());
  T* hp = h.data_ptr<T>();
  T* xn = buf.data_ptr<T>();
  T* proj = xn + B * E;
  T* qkv = proj + B * E;
  T* q = qkv + B * H * D;
  T* att = q + B * Hq * D;
  T* gu = att + B * Hq * D;
  T* act = gu + 2 * B * F;
  T* kc = k_cache.data_ptr<T>();
  T* vc = v_cache.data_ptr<T>();
  const T* cp = c.data_ptr<T>();
  const T* snp = sn.data_ptr<T>();
  const int64_t layer = S * Hkv * D;
  const float e = static_cast<float>(eps), sc = static_cast<float>(scale);
  for (int64_t i = 0; i < L; ++i) {
    const Layer& l = layers[i];
    const int64_t f = l.gate_up.N / 2;
    T* lk = kc + i * layer;
    T* lv = vc + i * layer;
    rms_norm_raw(hp, static_cast<const T*>(l.n1), xn, B, E, e);
    l.qkv(xn, B, qkv);
    rope_and_cache_raw(qkv, cp, snp, q, lk, lv, sp, B, Hq, Hkv, D);
    decode_attention_raw(q, lk, lv, btp, lp, att, B, Hq, Hkv, D, nb, block_size, sc);
    l.o(att, B, proj);
    add_rows(hp, proj, B * E);
    rms_norm_raw(hp, static_cast<const T*>(l.n2), xn, B, E, e);
    l.gate_up(xn, B, gu);
    swiglu_raw(gu, gu + f, act, B, f, 2 * f, 2 * f);
    l.down(act, B, proj);
    add_rows(hp, proj, B * E);
  }
  return h;
}
