"""What the machine computes fast: whether bf16 is native here, and the `auto` dtype choice.

bf16 pays only where the hardware has bf16 arithmetic (AVX512-BF16 or AMX on x86 CPUs, any
recent GPU). Elsewhere torch emulates it, and a bf16 matmul on an AVX2-only CPU runs at a
small fraction of fp32's speed (measured on a 2-core AMD EPYC without AVX-512: fp32 77
GFLOP/s, bf16 under 1), so `auto` picks fp32 there.
"""

from __future__ import annotations

from functools import lru_cache

import torch


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


def resolve_dtype(value: str) -> str:
    """'auto' -> 'bfloat16' where bf16 is native, else 'float32'; other names pass through."""
    return ("bfloat16" if native_bf16() else "float32") if value == "auto" else value


def resolve_autocast(value: str) -> str:
    """'auto' -> 'bfloat16' (autocast with fp32 master weights) where bf16 is native, else 'none'."""
    return ("bfloat16" if native_bf16() else "none") if value == "auto" else value
