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
//
// Given the model's head, `sample` runs the rest of the step too: the embedding and the RoPE
// rows, the final norm, the LM head, the temperature and the draw from each sequence's generator,
// returning plain token ids and log-probabilities. Between the runner, the sampler and the
// engine's bookkeeping, the Python and torch calls of a step around the layers cost several
// percent more of a batch-1 token, most of it in misses to lines the weight stream evicted.

#include <torch/extension.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/DistributionsHelper.h>

#include <algorithm>
#include <cmath>
#include <mutex>
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

// Where a step's layers read and write the cache: pointers and sizes checked by `Impl::check`.
struct Step {
  void *kc = nullptr, *vc = nullptr;
  const void *cos = nullptr, *sin = nullptr;
  const int64_t *slots = nullptr, *tables = nullptr, *lens = nullptr;
  int64_t B = 0, S = 0, Hq = 0, Hkv = 0, D = 0, nb = 0, block_size = 0;
  float eps = 0.f, scale = 0.f;
};

// The model's ends for whole steps: the embedding (V, E), the final norm, the LM head and the
// RoPE tables (P, D) in fp32, as the runner keeps them.
struct Head {
  torch::Tensor embed, norm, cos, sin;
  Linear lm;
};

// A uniform in [0, 1) from a CPU generator, the value `torch.rand(1, dtype=torch.float64,
// generator=g)` returns (one 64-bit draw, 53 bits of it), under the generator's lock.
double uniform(at::Generator& g) {
  auto* gen = at::check_generator<at::CPUGeneratorImpl>(g);
  std::lock_guard<std::mutex> lock(gen->mutex_);
  return at::uniform_real_distribution<double>(0.0, 1.0)(gen);
}

}  // namespace

struct DecodeLayers::Impl {
  std::vector<Layer> layers;
  std::unique_ptr<Head> head;
  at::ScalarType dtype = at::kFloat;  // of the norms, the activations and the cache
  int64_t E = 0, F = 0;               // hidden width; the widest SwiGLU

  Step check(int64_t B, const torch::Tensor& k_cache, const torch::Tensor& v_cache, const int64_t* slots,
             const int64_t* tables, const int64_t* lens, int64_t nb, int64_t block_size, int64_t Hq, double eps) const;
  template <class T>
  void forward(const Step& st, T* h) const;
  template <class T>
  torch::Tensor run(torch::Tensor h, const torch::Tensor& k_cache, const torch::Tensor& v_cache, const torch::Tensor& cos,
                    const torch::Tensor& sin, const torch::Tensor& slots, const torch::Tensor& block_tables,
                    const torch::Tensor& lens, int64_t block_size, int64_t Hq, double eps) const;
  template <class T>
  void sample(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Step& st,
              const std::vector<double>& temperatures, const std::vector<double>& u, int64_t* tokens,
              double* logprobs) const;
};

// layers: per layer (ln1, qkv, o, ln2, gate_up, down) with each linear as `Linear` above; head:
// None or (embed (V, E), norm (E,), the LM head as a linear, cos (P, D), sin (P, D)).
DecodeLayers::DecodeLayers(const py::list& layers, const py::object& head) : impl_(std::make_shared<Impl>()) {
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
  const auto fits = [&](const Linear& l) { return l.kind == Kind::blocks || (l.kind == Kind::fp32) == (im.dtype == at::kFloat); };
  for (Layer& L : im.layers) {
    L.n1 = L.ln1.data_ptr(), L.n2 = L.ln2.data_ptr();
    for (const auto* ln : {&L.ln1, &L.ln2})
      TORCH_CHECK(ln->scalar_type() == im.dtype && ln->numel() == im.E, "DecodeLayers: the norms differ in dtype or width");
    for (const Linear* l : {&L.qkv, &L.o, &L.gate_up, &L.down})
      TORCH_CHECK(fits(*l), "DecodeLayers: an fp32 weight needs fp32 norms and a bf16 weight bf16 ones");
    TORCH_CHECK(L.qkv.K == im.E && L.gate_up.K == im.E && L.o.N == im.E && L.down.N == im.E && L.gate_up.N % 2 == 0 &&
                L.down.K == L.gate_up.N / 2, "DecodeLayers: a layer's widths do not chain");
    // a step's buffers hold one layer's attention widths: every layer has the first one's
    TORCH_CHECK(L.qkv.N == im.layers[0].qkv.N && L.o.K == im.layers[0].o.K,
                "DecodeLayers: the layers' attention widths differ");
    im.F = std::max(im.F, L.gate_up.N / 2);
  }
  if (head.is_none()) return;
  const auto t = head.cast<py::tuple>();
  TORCH_CHECK(t.size() == 5, "DecodeLayers: a head is (embed, norm, LM head, cos, sin)");
  auto h = std::make_unique<Head>();
  h->embed = t[0].cast<torch::Tensor>().contiguous();
  h->norm = t[1].cast<torch::Tensor>().contiguous();
  h->lm = linear_of(t[2].cast<py::tuple>());
  h->cos = t[3].cast<torch::Tensor>().contiguous();
  h->sin = t[4].cast<torch::Tensor>().contiguous();
  TORCH_CHECK(h->embed.dim() == 2 && h->embed.size(1) == im.E && h->embed.scalar_type() == im.dtype && h->embed.size(0) > 0,
              "DecodeLayers: the embedding must be (V, E) in the norms' dtype");
  TORCH_CHECK(h->norm.numel() == im.E && h->norm.scalar_type() == im.dtype, "DecodeLayers: the final norm must be (E,) in "
              "the norms' dtype");
  TORCH_CHECK(fits(h->lm) && h->lm.K == im.E, "DecodeLayers: the LM head must take E inputs in the layers' format");
  TORCH_CHECK(h->cos.dim() == 2 && h->cos.scalar_type() == at::kFloat && h->sin.sizes() == h->cos.sizes() &&
              h->sin.scalar_type() == at::kFloat, "DecodeLayers: the RoPE tables must be (P, D) fp32");
  im.head = std::move(h);
}

int64_t DecodeLayers::size() const { return static_cast<int64_t>(impl_->layers.size()); }
bool DecodeLayers::has_head() const { return impl_->head != nullptr; }

// The cache and a step's indices, checked once: slots, lengths and every block a context covers.
Step DecodeLayers::Impl::check(int64_t B, const torch::Tensor& k_cache, const torch::Tensor& v_cache, const int64_t* slots,
                               const int64_t* tables, const int64_t* lens, int64_t nb, int64_t block_size, int64_t Hq,
                               double eps) const {
  const int64_t L = static_cast<int64_t>(layers.size());
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.size(0) == L && k_cache.is_contiguous() && v_cache.sizes() == k_cache.sizes() &&
              v_cache.is_contiguous() && k_cache.scalar_type() == dtype && v_cache.scalar_type() == dtype,
              "DecodeLayers: a contiguous cache of one entry per layer, in the norms' dtype");
  Step st;
  st.B = B, st.S = k_cache.size(1), st.Hkv = k_cache.size(2), st.D = k_cache.size(3), st.Hq = Hq;
  st.nb = nb, st.block_size = block_size, st.slots = slots, st.tables = tables, st.lens = lens;
  st.kc = k_cache.data_ptr(), st.vc = v_cache.data_ptr();
  TORCH_CHECK(st.Hkv > 0 && Hq % st.Hkv == 0 && st.D % 2 == 0 && block_size > 0,
              "DecodeLayers: head counts, head size or block size do not fit the cache");
  TORCH_CHECK(layers[0].qkv.N == (Hq + 2 * st.Hkv) * st.D && layers[0].o.K == Hq * st.D,
              "DecodeLayers: the layers' widths do not match the heads");
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(slots[b] >= 0 && slots[b] < st.S, "DecodeLayers: a slot is outside the cache");
    TORCH_CHECK(lens[b] >= 0 && lens[b] <= nb * block_size, "DecodeLayers: a context length exceeds its block table");
    for (int64_t j = 0; j * block_size < lens[b]; ++j) {
      const int64_t block = tables[b * nb + j];
      TORCH_CHECK(block >= 0 && (block + 1) * block_size <= st.S, "DecodeLayers: a block is outside the cache");
    }
  }
  st.eps = static_cast<float>(eps);
  st.scale = static_cast<float>(std::pow(static_cast<double>(st.D), -0.5));  // as the runner computes it
  return st;
}

// Every layer over h (B, E) in place; st.cos and st.sin hold (B, D) of T.
template <class T>
void DecodeLayers::Impl::forward(const Step& st, T* hp) const {
  const int64_t B = st.B, Hq = st.Hq, Hkv = st.Hkv, D = st.D, H = Hq + 2 * Hkv;
  // one buffer a result, shared by the layers
  auto buf = torch::empty({B * (2 * E + H * D + 2 * Hq * D + 3 * F)}, torch::TensorOptions().dtype(dtype));
  T* xn = buf.data_ptr<T>();
  T* proj = xn + B * E;
  T* qkv = proj + B * E;
  T* q = qkv + B * H * D;
  T* att = q + B * Hq * D;
  T* gu = att + B * Hq * D;
  T* act = gu + 2 * B * F;
  T* kc = static_cast<T*>(st.kc);
  T* vc = static_cast<T*>(st.vc);
  const T* cp = static_cast<const T*>(st.cos);
  const T* snp = static_cast<const T*>(st.sin);
  const int64_t layer = st.S * Hkv * D;
  for (size_t i = 0; i < layers.size(); ++i) {
    const Layer& l = layers[i];
    const int64_t f = l.gate_up.N / 2;
    T* lk = kc + i * layer;
    T* lv = vc + i * layer;
    rms_norm_raw(hp, static_cast<const T*>(l.n1), xn, B, E, st.eps);
    l.qkv(xn, B, qkv);
    rope_and_cache_raw(qkv, cp, snp, q, lk, lv, st.slots, B, Hq, Hkv, D);
    decode_attention_raw(q, lk, lv, st.tables, st.lens, att, B, Hq, Hkv, D, st.nb, st.block_size, st.scale);
    l.o(att, B, proj);
    add_rows(hp, proj, B * E);
    rms_norm_raw(hp, static_cast<const T*>(l.n2), xn, B, E, st.eps);
    l.gate_up(xn, B, gu);
    swiglu_raw(gu, gu + f, act, B, f, 2 * f, 2 * f);
    l.down(act, B, proj);
    add_rows(hp, proj, B * E);
  }
}

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
  TORCH_CHECK(h.dim() == 2 && h.size(1) == E && h.scalar_type() == dtype, "DecodeLayers: h must be (B, E) of the norms' dtype");
  const int64_t B = h.size(0);
  const auto sl = contiguous_as(slots, at::kLong), bt = contiguous_as(block_tables, at::kLong);
  const auto ln = contiguous_as(lens, at::kLong);
  TORCH_CHECK(sl.numel() == B && bt.dim() == 2 && bt.size(0) == B && ln.numel() == B,
              "DecodeLayers: slots, block tables and lengths must have one row a sequence");
  Step st = check(B, k_cache, v_cache, sl.data_ptr<int64_t>(), bt.data_ptr<int64_t>(), ln.data_ptr<int64_t>(), bt.size(1),
                  block_size, Hq, eps);
  if (B == 0) return h.clone();
  const auto c = cos.contiguous(), sn = sin.contiguous();
  TORCH_CHECK(c.scalar_type() == dtype && sn.scalar_type() == dtype && c.dim() == 2 && c.size(0) == B && c.size(1) == st.D &&
              sn.sizes() == c.sizes(), "DecodeLayers: cos and sin (B, D) in h's dtype");
  st.cos = c.data_ptr(), st.sin = sn.data_ptr();
  py::gil_scoped_release no_gil;  // the loop touches no Python object from here
  h = h.clone(at::MemoryFormat::Contiguous);
  forward(st, h.data_ptr<T>());
  return h;
}

// ids, positions (B,): each sequence's token and its position; block_tables: each sequence's
// blocks; temperatures (B,): 0 for greedy; generators (B,): each sequence's, drawn once where its
// temperature is positive, in row order (as `sampling.uniforms`). Returns each sequence's
// sampled token and its log-probability under the distribution it was sampled from.
std::pair<std::vector<int64_t>, std::vector<double>> DecodeLayers::sample(
    const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
    const std::vector<std::vector<int64_t>>& block_tables, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
    int64_t block_size, int64_t Hq, double eps, const std::vector<double>& temperatures,
    std::vector<at::Generator> generators) const {
  const Impl& im = *impl_;
  TORCH_CHECK(im.head, "DecodeLayers.sample: built without the model's head");
  const int64_t B = static_cast<int64_t>(ids.size());
  TORCH_CHECK(positions.size() == ids.size() && block_tables.size() == ids.size() && temperatures.size() == ids.size() &&
              generators.size() == ids.size(), "DecodeLayers.sample: one position, block table, temperature and "
              "generator a sequence");
  const int64_t V = im.head->embed.size(0), P = im.head->cos.size(0);
  TORCH_CHECK(block_size > 0, "DecodeLayers.sample: the block size must be positive");
  int64_t nb = 1;
  for (const auto& t : block_tables) nb = std::max<int64_t>(nb, static_cast<int64_t>(t.size()));
  std::vector<int64_t> tables(B * nb, 0), slots(B), lens(B);
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ids[b] >= 0 && ids[b] < V, "DecodeLayers.sample: a token id is outside the vocabulary");
    TORCH_CHECK(positions[b] >= 0 && positions[b] < P, "DecodeLayers.sample: a position is past the RoPE tables");
    TORCH_CHECK(temperatures[b] >= 0, "DecodeLayers.sample: a temperature is negative or NaN");
    std::copy(block_tables[b].begin(), block_tables[b].end(), tables.begin() + b * nb);
    const int64_t p = positions[b], j = p / block_size;
    TORCH_CHECK(j < static_cast<int64_t>(block_tables[b].size()), "DecodeLayers.sample: a position is past its block table");
    slots[b] = block_tables[b][j] * block_size + p % block_size;
    lens[b] = p + 1;
  }
  Step st = im.check(B, k_cache, v_cache, slots.data(), tables.data(), lens.data(), nb, block_size, Hq, eps);
  TORCH_CHECK(im.head->cos.size(1) == st.D, "DecodeLayers.sample: the RoPE tables' width is not the head size");
  std::vector<double> u(B, -1.0);
  for (int64_t b = 0; b < B; ++b)
    if (temperatures[b] > 0) u[b] = uniform(generators[b]);
  std::vector<int64_t> tokens(B);
  std::vector<double> logprobs(B);
  if (B == 0) return {tokens, logprobs};
  py::gil_scoped_release no_gil;
  if (im.dtype == at::kFloat) im.sample<float>(ids, positions, st, temperatures, u, tokens.data(), logprobs.data());
  else im.sample<bf16>(ids, positions, st, temperatures, u, tokens.data(), logprobs.data());
  return {tokens, logprobs};
}

// The runner's step, from the embedding to the sampler (`ModelRunner.forward`, `sampling.sample`):
// the rows' embeddings; cos and sin rounded to T; the layers; the final norm and the LM head,
// whose T logits widen to fp32; then per row the division by its temperature where that is
// neither 0 (greedy) nor 1 (the sampler divides those rows by 1, which changes nothing), the draw
// for its uniform (or the argmax) and the token's logit less the log-normaliser.
template <class T>
void DecodeLayers::Impl::sample(const std::vector<int64_t>& ids, const std::vector<int64_t>& positions, const Step& step,
                                const std::vector<double>& temperatures, const std::vector<double>& u, int64_t* tokens,
                                double* logprobs) const {
  const Head& hd = *head;
  Step st = step;
  const int64_t B = st.B, D = st.D, N = hd.lm.N;
  auto buf = torch::empty({B * (2 * E + 2 * D)}, torch::TensorOptions().dtype(dtype));
  T* h = buf.data_ptr<T>();
  T* xn = h + B * E;
  T* cs = xn + B * E;
  T* sn = cs + B * D;
  const T* embed = hd.embed.data_ptr<T>();
  const float* ct = hd.cos.data_ptr<float>();
  const float* stb = hd.sin.data_ptr<float>();
  for (int64_t b = 0; b < B; ++b) {
    std::copy(embed + ids[b] * E, embed + (ids[b] + 1) * E, h + b * E);
    for (int64_t d = 0; d < D; ++d) {
      cs[b * D + d] = static_cast<T>(ct[positions[b] * D + d]);
      sn[b * D + d] = static_cast<T>(stb[positions[b] * D + d]);
    }
  }
  st.cos = cs, st.sin = sn;
  forward(st, h);
  rms_norm_raw(h, hd.norm.data_ptr<T>(), xn, B, E, st.eps);
  auto logits = torch::empty({B, N}, torch::TensorOptions().dtype(at::kFloat));
  float* x = logits.data_ptr<float>();
  if constexpr (std::is_same<T, float>::value) {
    hd.lm(xn, B, x);
  } else {
    auto low = torch::empty({B, N}, torch::TensorOptions().dtype(dtype));
    T* y = low.data_ptr<T>();
    hd.lm(xn, B, y);
    at::parallel_for(0, B * N, 4096, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) x[i] = static_cast<float>(y[i]);
    });
  }
  at::parallel_for(0, B, 1, [&](int64_t b0, int64_t b1) {
    std::vector<float> sums(sample_scratch(N));
    for (int64_t b = b0; b < b1; ++b) {
      float* row = x + b * N;
      if (temperatures[b] > 0 && temperatures[b] != 1) {
        const float t = static_cast<float>(temperatures[b]);
        for (int64_t i = 0; i < N; ++i) row[i] = row[i] / t;
      }
      float lse = 0.f;
      sample_row(row, N, u[b], sums.data(), tokens + b, &lse);
      logprobs[b] = static_cast<double>(row[tokens[b]] - lse);
    }
  });
}
