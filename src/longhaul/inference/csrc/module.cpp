// Python bindings of the native CPU kernels (`longhaul.inference.kernels.native()`).

#include <torch/extension.h>

torch::Tensor pack(const torch::Tensor& w);
torch::Tensor mm(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias);
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& block_tables, const torch::Tensor& context_lens, int64_t block_size,
                               double scale);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
std::vector<torch::Tensor> rms_norm_backward(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& weight,
                                             double eps);
torch::Tensor rope_and_cache(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                             torch::Tensor k_cache, torch::Tensor v_cache, const torch::Tensor& slots, int64_t Hq);
std::vector<torch::Tensor> softmax_stats(torch::Tensor z, const torch::Tensor& targets, bool with_entropy, bool write_probs);

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "pack an fp32 weight (N, K) into 8-output panels");
  m.def("mm", &mm, "x (M, K) @ packed weight -> (M, N), plus an optional padded bias");
  m.def("decode_attention", &decode_attention, "one query token per sequence over the paged K/V cache");
  m.def("rms_norm", &rms_norm, "RMSNorm of rows, as HF's LlamaRMSNorm");
  m.def("rms_norm_backward", &rms_norm_backward, "the gradient of rms_norm: (dx, dweight)");
  m.def("rope_and_cache", &rope_and_cache, "RoPE on q and k, k and v stored in the paged cache; returns q");
  m.def("softmax_stats", &softmax_stats, "per-row log p(target), entropy, and optionally the softmax in place");
}
