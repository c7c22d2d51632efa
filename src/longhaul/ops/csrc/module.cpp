// Python bindings of the native CPU kernels (`longhaul.ops.kernels.native()`).

#include <torch/extension.h>

#include "kernels.h"

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("pack", &pack, "pack an fp32 weight (N, K) into 8- or 16-output panels (nr 0: the widest this CPU runs)",
        py::arg("w"), py::arg("nr") = 0);
  m.def("has_avx512", &has_avx512, "whether this CPU runs the 16-wide (AVX-512) GEMM panels");
  m.def("mm", &mm, "x (M, K) @ packed weight -> (M, N), plus an optional padded bias");
  m.def("mm_into", &mm_into, "mm written into a given contiguous (M, N) tensor");
  m.def("has_avx512_bf16", &has_avx512_bf16, "whether this CPU has AVX512-BF16 dot products (the dp bf16 packing)");
  m.def("pack_bf16", &pack_bf16, "pack a bf16 weight (N, K): kind dp (AVX512-BF16), widen (AVX2) or empty (the best here)",
        py::arg("w"), py::arg("kind") = "");
  m.def("mm_bf16", &mm_bf16, "x (M, K) @ packed bf16 weight -> (M, N) bf16, plus an optional bias");
  m.def("has_avx512_vnni", &has_avx512_vnni, "whether this CPU has AVX512-VNNI (the 16-wide integer panels)");
  m.def("pack_blocks", &pack_blocks, "pack block-quantized codes (N, K) and their fp16 scales (and minimums), or per-channel "
        "int8 codes (no scales), into panels", py::arg("codes"), py::arg("d"), py::arg("m"), py::arg("bits"), py::arg("pad"),
        py::arg("nr") = 0);
  m.def("mm_blocks", &mm_blocks, "x (M, K), quantized per 32 values, @ packed Q8_0 / Q4_0 / Q4_1 blocks or per-channel int8 "
        "codes, plus an optional bias");
  m.def("decode_attention", &decode_attention, "one query token per sequence over the paged K/V cache");
  m.def("rms_norm", &rms_norm, "RMSNorm of rows, as HF's LlamaRMSNorm");
  m.def("rms_norm_backward", &rms_norm_backward, "the gradient of rms_norm: (dx, dweight)");
  m.def("rope_and_cache", &rope_and_cache, "RoPE on q and k, k and v stored in the paged cache; returns q");
  m.def("swiglu", &swiglu, "silu(gate) * up");
  py::class_<DecodeLayers>(m, "DecodeLayers", "a model's decoder layers, described once, for decode steps in one call")
      .def(py::init<const py::list&, const py::object&>(), py::arg("layers"), py::arg("head") = py::none())
      .def("__len__", &DecodeLayers::size)
      .def_property_readonly("has_head", &DecodeLayers::has_head)
      .def("run", &DecodeLayers::run, "every layer of a decode step (one token a sequence)")
      .def("sample", &DecodeLayers::sample, "a whole decode step: token ids and positions -> (sampled tokens, their "
           "log-probabilities)");
  m.def("swiglu_backward", &swiglu_backward, "the gradient of swiglu, written into (dgate, dup)");
  m.def("attention_pack", &attention_pack, "flat q, k, v -> the padded attention rows, RoPE on q and k");
  m.def("attention_pack_backward", &attention_pack_backward, "the gradient of attention_pack, written into (dq, dk, dv)");
  m.def("attention_unpack", &attention_unpack, "the padded attention output -> flat rows (N, Hq D)");
  m.def("attention_unpack_backward", &attention_unpack_backward, "the gradient of attention_unpack");
  m.def("sample_rows", &sample_rows, "one token a row from fp32 logits: argmax where u < 0, else the inverse-CDF draw "
        "for u; and each row's log-normaliser");
  m.def("softmax_stats", &softmax_stats, "per-row log p(target), entropy, and optionally the softmax in place");
}
