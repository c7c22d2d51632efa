"""`EngineConfig`: every setting of the inference engine, with the reason for its default.

Owns validation only; `LLMEngine` reads it. Names follow vLLM's engine arguments where one
exists (block_size, max_num_seqs, max_num_batched_tokens, max_model_len,
enable_prefix_caching, seed).
"""

from __future__ import annotations

from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, field_validator

from longhaul.hardware import resolve_device

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class EngineConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = "smollm2-135m-instruct"  # built-in name, HF directory or .gguf (a label when a model object is passed)
    dtype: Literal["float32", "bfloat16", "float16"] = "float32"  # fp32 matches HF exactly; bf16 is ~2x faster on AMX CPUs
    device: str = Field("auto", validate_default=True)  # auto: a CUDA GPU where torch sees one, else the CPU; cpu, cuda, cuda:N
    block_size: int = Field(16, ge=1)  # tokens a KV block; vLLM's default, small enough that prefix hits are fine-grained
    num_kv_blocks: int | None = Field(None, ge=1)  # None: sized from kv_cache_memory_gb
    kv_cache_memory_gb: float = Field(1.0, gt=0)  # the pool is zero-filled at start, so this much memory is committed
    max_num_seqs: int = Field(256, ge=1)  # sequences in one step (vLLM's default)
    max_num_batched_tokens: int = Field(2048, ge=1)  # token budget a step; longer prompts are prefilled in chunks
    max_model_len: int | None = Field(None, ge=2)  # None: the model's max_position_embeddings
    enable_prefix_caching: bool = True  # RL groups share one prompt; the cache prefills it once
    # KV offload tiers under the prefix cache (kv_offload.py): blocks the pool evicts are kept in host memory, then on
    # disk, and come back on a prefix hit instead of being prefilled again. Off by default: memory is the user's call
    kv_offload_memory_gb: float = Field(0.0, ge=0)  # host tier
    kv_offload_dir: str | None = None  # disk tier (files other engine processes with the same weights can read)
    kv_offload_disk_gb: float = Field(4.0, gt=0)  # the disk tier's bound, when kv_offload_dir is set
    kv_offload_namespace: str | None = None  # the weights' source, with the settings naming the shared files; None: model
    # int8: per-output-channel int8 projections and LM head (quant.py), half the weight bytes of bf16;
    # q8_0 / q4_0 / q4_1: llama.cpp's block formats quantized at load, LM head in q8_0 (quant_blocks.py);
    # gguf: the block-quantized tensors of the model's own GGUF file, as stored (gguf_weights.py)
    quantization: Literal["int8", "q8_0", "q4_0", "q4_1", "gguf"] | None = None
    kv_cache_dtype: Literal["auto", "int8", "int4"] = "auto"  # auto: the model dtype; int8/int4 codes via kv_quant.py
    adaptive_threads: bool = True  # as many threads as other processes leave CPUs free (threads.py): a shared machine
    seed: int = 0  # seeds requests that bring none (request i gets a seed derived from this and i)

    @field_validator("device")
    @classmethod
    def _resolve_device(cls, v: str) -> str:
        return resolve_device(v)  # a LonghaulError (one line) where the device is not here

    @property
    def torch_dtype(self) -> torch.dtype:
        return DTYPES[self.dtype]
