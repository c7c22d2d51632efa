"""`ServeConfig`: every setting of the server, with the reason for its default.

Owns validation only; `app.create_app` reads it and `longhaul serve` fills it from the
command line. Engine settings pass through to `EngineConfig` (same names as vLLM's).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from longhaul.errors import LonghaulError
from longhaul.inference.spec_worker import SpeculativeConfig
from longhaul.models.lora import is_adapter_dir


class ServeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    model: str = "tiny-llama"  # built-in name, HF directory, .gguf, or an fsspec URL of a safetensors directory with a manifest
    served_model_name: str | None = None  # the id clients send as `model`; default the model's base name
    dtype: Literal["auto", "float32", "bfloat16"] = "auto"  # auto: bf16 where the hardware has it (AMX, AVX512-BF16, GPUs), else fp32
    device: str = "auto"  # the engine's: auto is a CUDA GPU where torch sees one (plain PyTorch there), else the CPU
    host: str = "127.0.0.1"  # loopback unless told otherwise: exposing a server is a decision
    port: int = Field(8000, ge=0, le=65535)  # 0 picks a free port (tests)
    max_model_len: int | None = Field(None, ge=16)  # None: the model's max_position_embeddings
    max_num_seqs: int = Field(32, ge=1)  # sequences a step; >= the clients a replica is sized for
    max_num_batched_tokens: int = Field(2048, ge=16)  # per-step token budget (prefill chunks + decodes)
    kv_cache_memory_gb: float = Field(1.0, gt=0)
    # KV offload tiers (EngineConfig's): evicted prefix blocks kept in host memory / on disk, brought back on a hit;
    # an agent's next turn after a slow tool call skips the prefill of its history. Off unless given
    kv_offload_memory_gb: float = Field(0.0, ge=0)
    kv_offload_dir: str | None = None  # replicas of the same model pointed at one directory share its blocks
    kv_offload_disk_gb: float = Field(4.0, gt=0)
    torch_threads: int | None = Field(None, ge=1)  # None: torch's default (all cores)
    # The engine steps in a process of its own, so HTTP, tokenization and streaming never take its GIL (vLLM's
    # engine core does the same); false keeps it in a thread of the server (one process: embedders, debugging)
    engine_process: bool = True
    api_keys: list[str] = Field(default_factory=list)  # plain keys (--api-key, LONGHAUL_API_KEY); no quota unless set below
    api_keys_file: str | None = None  # JSON/YAML list of keys with per-key quotas (auth.load_keys_file)
    requests_per_minute: int | None = Field(None, ge=1)  # default quota of a key without its own; None: unlimited
    tokens_per_minute: int | None = Field(None, ge=1)  # prompt + generated tokens, charged as they happen
    max_queued_requests: int = Field(64, ge=0)  # admitted beyond max_num_seqs before 503; never unbounded
    max_tokens_cap: int = Field(4096, ge=1)  # largest max_tokens a request may ask for (bounded work a request)
    max_request_bytes: int = Field(4 << 20, ge=1024)  # larger bodies get 413 before they are parsed
    queue: str = "sqlite"  # job broker: "sqlite" (the jobs database) or redis://host:port/db (Redis Streams)
    jobs_db: str | None = None  # where job records live (SQLite); None: $LONGHAUL_HOME/serve/jobs.sqlite. A restart resumes from it
    job_workers: int = Field(1, ge=0)  # agent episodes run at once by this replica (0: accept jobs, run none)
    max_queued_jobs: int = Field(1000, ge=1)  # queued jobs before POST /v1/jobs answers 503
    job_lease_s: float = Field(60.0, gt=0)  # Redis: a job unacknowledged this long by a silent replica is claimed again
    warmup_tokens: int = Field(4, ge=1)  # the warm-up generation /ready waits for
    log_level: str = "info"
    seed: int = 0
    # speculative decoding, vLLM's `--speculative-config`: {"method": "ngram"} (prompt lookup, no second model)
    # or {"method": "draft", "draft_model": NAME}, plus num_speculative_tokens, ngram_min/max (spec_worker.SpeculativeConfig)
    speculative_config: dict | None = None
    # LoRA adapters served beside the base model, vLLM's `--lora-modules name=path`: a request whose `model` is a
    # name runs with that adapter (peft's adapter_config.json and adapter_model.safetensors), batched with the rest
    lora_modules: dict[str, str] = Field(default_factory=dict)

    @field_validator("lora_modules")
    @classmethod
    def _check_loras(cls, v: dict[str, str]) -> dict[str, str]:
        for name, path in v.items():
            if not name or "/" in name:
                raise ValueError(f"adapter name {name!r} must be a plain id clients send as `model` (no '/')")
            if not is_adapter_dir(path):
                raise ValueError(f"{name}={path} is not a LoRA adapter directory (adapter_config.json and "
                                 "adapter_model.safetensors); pass a directory peft saved")
        return v

    @field_validator("speculative_config")
    @classmethod
    def _check_speculative(cls, v: dict | None) -> dict | None:
        if v is None:
            return v

        return SpeculativeConfig(**v).model_dump()  # a bad field fails here, before any model loads


def lora_modules_option(items: list[str]) -> dict[str, str]:
    """`--lora-modules NAME=DIR` entries as a mapping; one line on a malformed or repeated one."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise LonghaulError(f"--lora-modules {item!r} is not NAME=ADAPTER_DIR; pass e.g. coder=runs/team/rl/coder/adapter")
        if name in out:
            raise LonghaulError(f"--lora-modules names {name!r} twice; give each adapter its own name")
        out[name] = path
    return out
