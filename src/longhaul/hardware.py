"""What the machine computes fast: whether bf16 is native here, the `auto` dtype choice, and the
`auto` device (a CUDA GPU where torch sees one, else the CPU).

bf16 pays only where the hardware has bf16 arithmetic (AVX512-BF16 or AMX on x86 CPUs, any
recent GPU). Elsewhere torch emulates it, and a bf16 matmul on an AVX2-only CPU runs at a
small fraction of fp32's speed (measured on a 2-core AMD EPYC without AVX-512: fp32 77
GFLOP/s, bf16 under 1), so `auto` picks fp32 there.

Where bf16 arithmetic is native it is the faster choice, in decode and in training: on a
2-core Zen 4 (AVX512-BF16, no AMX) with the native kernels, decode runs 1.5-1.9x fp32's tokens/s
at batch 1-32 and prefill 1.6x, and a GRPO step takes 7.5 s against 12.7 s in fp32, faster in
each of its phases (generation, reference log-probs, update). So `auto` picks bf16 wherever
`native_bf16` holds (AVX512-BF16 or AMX on a CPU, a GPU with bf16) and fp32 elsewhere;
`LONGHAUL_BF16=0/1` forces the choice.
"""

from __future__ import annotations

from functools import lru_cache

import torch

from longhaul.errors import LonghaulError


@lru_cache(maxsize=None)
def native_bf16() -> bool:
    """True when bf16 matmuls run on bf16 hardware (set LONGHAUL_BF16=0/1 to override)."""
    import os

    forced = os.environ.get("LONGHAUL_BF16")
    if forced in ("0", "1"):
        return forced == "1"
    if torch.cuda.is_available():
        return torch.cuda.is_bf16_supported()
    cpu = getattr(torch, "cpu", None)
    for probe in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        fn = getattr(cpu, probe, None)
        if fn is not None and fn():
            return True
    return False


@lru_cache(maxsize=None)
def prefer_bf16() -> bool:
    """True when bf16 is the faster choice here: wherever bf16 arithmetic is native (see the
    module docstring)."""
    return native_bf16()


def resolve_dtype(value: str) -> str:
    """'auto' -> 'bfloat16' where bf16 is the faster choice (`prefer_bf16`), else 'float32';
    other names pass through."""
    return ("bfloat16" if prefer_bf16() else "float32") if value == "auto" else value


def resolve_autocast(value: str) -> str:
    """'auto' -> 'bfloat16' (autocast with fp32 master weights) where bf16 is the faster choice,
    else 'none'."""
    return ("bfloat16" if prefer_bf16() else "none") if value == "auto" else value


DEVICE_NAMES = "auto, cpu, cuda or cuda:N"


def check_device_name(value: str) -> str:
    """`value` if it names a device longhaul can run on (DEVICE_NAMES), else a ValueError."""
    kind, _, index = value.partition(":")
    if value in ("auto", "cpu", "cuda") or (kind == "cuda" and index.isdigit()):
        return value
    raise ValueError(f"device {value!r} is not one of {DEVICE_NAMES}")


def resolve_device(value: str) -> str:
    """'auto' -> 'cuda' where torch sees a CUDA GPU, else 'cpu'; a CUDA device asked for on a
    machine without one (or past the last GPU) is a LonghaulError naming what torch sees."""
    try:
        check_device_name(value)
    except ValueError as e:
        raise LonghaulError(f"{e}; pick one of those") from None
    if value == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if value == "cpu":
        return value
    if not torch.cuda.is_available():
        why = "this torch is built without CUDA" if torch.version.cuda is None else "no CUDA GPU or driver is visible"
        raise LonghaulError(f"device {value} asked for, but {why} (torch {torch.__version__}); use device cpu, or auto")
    index = int(value.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise LonghaulError(f"device {value} asked for, but torch sees {torch.cuda.device_count()} CUDA GPU(s); "
                            f"use cuda:0 .. cuda:{torch.cuda.device_count() - 1}")
    return value
