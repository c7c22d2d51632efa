// Declarations of the native kernels defined across ops/csrc/*.cpp, for the bindings
// (module.cpp) and for kernels that call others (decode_step.cpp).
#pragma once

#include <torch/extension.h>

#include <memory>
#include <string>
#include <vector>

torch::Tensor pack(const torch::Tensor& w, int64_t nr);
bool has_avx512();
torch::Tensor mm(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias);
torch::Tensor mm_into(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias, torch::Tensor out);
bool has_avx512_bf16();
torch::Tensor pack_bf16(const torch::Tensor& w, const std::string& kind);
torch::Tensor mm_bf16(const torch::Tensor& x, const torch::Tensor& wp, int64_t N, const torch::Tensor& bias);
bool has_avx512_vnni();
std::vector<torch::Tensor> pack_blocks(const torch::Tensor& codes, const torch::Tensor& d, const torch::Tensor& m,
                                       int64_t bits, int64_t pad, int64_t nr);
torch::Tensor mm_blocks(const torch::Tensor& x, const torch::Tensor& wp, const torch::Tensor& d, const torch::Tensor& m,
                        int64_t bits, int64_t offset, int64_t N, const torch::Tensor& bias);
torch::Tensor decode_attention(const torch::Tensor& q, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
                               const torch::Tensor& block_tables, const torch::Tensor& context_lens, int64_t block_size,
                               double scale);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
std::vector<torch::Tensor> rms_norm_backward(const torch::Tensor& g, const torch::Tensor& x, const torch::Tensor& weight,
                                             double eps);
torch::Tensor rope_and_cache(const torch::Tensor& qkv, const torch::Tensor& cos, const torch::Tensor& sin,
                             torch::Tensor k_cache, torch::Tensor v_cache, const torch::Tensor& slots, int64_t Hq);
torch::Tensor swiglu(const torch::Tensor& gate, const torch::Tensor& up);
// Raw forms of the decode-step kernels, for a caller that checked its tensors once (DecodeLayers):
// pointers and sizes, T float or c10::BFloat16; the tensor functions above check and call them.
void mm_raw(const float* x, int64_t M, int64_t K, const float* w, int64_t G, int64_t nr, const float* bias, int64_t N,
            float* y);
void mm_bf16_raw(const c10::BFloat16* x, int64_t M, int64_t K, const uint16_t* w, bool dp, int64_t G, int64_t N,
                 const float* bias, c10::BFloat16* out);
template <class T>
void mm_blocks_raw(const T* x, int64_t M, int64_t K, const uint8_t* w, int64_t P, int64_t nr, const uint16_t* d,
                   const uint16_t* m, const float* scale, int bits, int offset, int64_t N, const float* bias, T* out);
template <class T>
void rms_norm_raw(const T* x, const T* w, T* y, int64_t N, int64_t E, float eps);
template <class T>
void rope_and_cache_raw(const T* qkv, const T* cos, const T* sin, T* q, T* kc, T* vc, const int64_t* slots, int64_t N,
                        int64_t Hq, int64_t Hkv, int64_t D);
template <class T>
void decode_attention_raw(const T* q, const T* kc, const T* vc, const int64_t* block_tables, const int64_t* lens, T* out,
                          int64_t B, int64_t Hq, int64_t Hkv, int64_t D, int64_t nb, int64_t block_size, float scale);
template <class T>
void swiglu_raw(const T* gate, const T* up, T* out, int64_t N, int64_t F, int64_t gs, int64_t us);
// Every decoder layer of a decode step in one call (decode_step.cpp): the layers' description is
// parsed once, at construction; `run` takes a step's tensors. Given the model's head (the
// embedding, the final norm, the LM head and the RoPE tables), `sample` runs a whole step from
// token ids to sampled tokens.
class DecodeLayers {
 public:
  DecodeLayers(const py::list& layers, const py::object& head);
  int64_t size() const;
  bool has_head() const;
  torch::Tensor run(torch::Tensor h, const torch::Tensor& k_cache, const torch::Tensor& v_cache, const torch::Tensor& cos,
                    const torch::Tensor& sin, const torch::Tensor& slots, const torch::Tensor& block_tables,
                    const torch::Tensor& lens, int64_t block_size, int64_t Hq, double eps) const;
  std::pair<std::vector<int64_t>, std::vector<double>> sample(
      const std::vector<int64_t>& ids, const std::vector<int64_t>& positions,
      const std::vector<std::vector<int64_t>>& block_tables, const torch::Tensor& k_cache, const torch::Tensor& v_cache,
      int64_t block_size, int64_t Hq, double eps, const std::vector<double>& temperatures,
      std::vector<at::Generator> generators) const;

 private:
  struct Impl;
  std::shared_ptr<Impl> impl_;
};
void swiglu_backward(const torch::Tensor& dout, const torch::Tensor& gate, const torch::Tensor& up, torch::Tensor dgate,
                     torch::Tensor dup);
std::vector<torch::Tensor> attention_pack(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                          const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& q_index,
                                          const torch::Tensor& q_len, const torch::Tensor& kv_index,
                                          const torch::Tensor& kv_len);
void attention_pack_backward(const torch::Tensor& dqp, const torch::Tensor& dkp, const torch::Tensor& dvp,
                             const torch::Tensor& cos, const torch::Tensor& sin, const torch::Tensor& out_index,
                             const torch::Tensor& kv_index, const torch::Tensor& kv_len, torch::Tensor dq, torch::Tensor dk,
                             torch::Tensor dv);
torch::Tensor attention_unpack(const torch::Tensor& o, const torch::Tensor& out_index, int64_t Hq);
torch::Tensor attention_unpack_backward(const torch::Tensor& g, const torch::Tensor& out_index, int64_t R, int64_t Tq,
                                        int64_t Hkv, int64_t Hq);
std::vector<torch::Tensor> sample_rows(const torch::Tensor& x, const torch::Tensor& u);
void sample_row(const float* row, int64_t V, double u, float* sums, int64_t* token, float* lse);
int64_t sample_scratch(int64_t V);  // the floats of `sums` sample_row needs for a row of V
std::vector<torch::Tensor> softmax_stats(torch::Tensor z, const torch::Tensor& targets, bool with_entropy, bool write_probs);
