"""The `auto` dtype choice: bf16 only where it is the faster choice."""

import pytest
import torch

from longhaul import hardware
from longhaul.inference import kernels


@pytest.fixture
def cpu(monkeypatch):
    """Set the probes of a CPU: (avx512_bf16, amx, native fp32 kernels run)."""
    monkeypatch.delenv("LONGHAUL_BF16", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def set_cpu(avx512_bf16: bool, amx: bool, fp32_kernels: bool):
        monkeypatch.setattr(hardware, "native_bf16", lambda: avx512_bf16 or amx)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        monkeypatch.setattr(kernels, "_missing_requirement", lambda: None if fp32_kernels else "no C++ compiler")
        return hardware.prefer_bf16.__wrapped__()
    return set_cpu


@pytest.mark.parametrize("avx512_bf16,amx,fp32_kernels,want", [
    (False, False, True, False),   # AVX2 only: bf16 is emulated
    (False, False, False, False),
    (True, False, True, False),    # AVX512-BF16 without AMX: the native fp32 kernels are faster
    (True, False, False, True),    # ... but without them oneDNN's bf16 beats its fp32
    (True, True, True, True),      # AMX: bf16
])
def test_auto_picks_bf16_only_where_it_is_faster(cpu, avx512_bf16, amx, fp32_kernels, want):
    assert cpu(avx512_bf16, amx, fp32_kernels) is want


def test_explicit_dtypes_pass_through():
    assert hardware.resolve_dtype("float32") == "float32" and hardware.resolve_dtype("bfloat16") == "bfloat16"
    assert hardware.resolve_autocast("none") == "none"
    faster = hardware.prefer_bf16()
    assert hardware.resolve_dtype("auto") == ("bfloat16" if faster else "float32")
    assert hardware.resolve_autocast("auto") == ("bfloat16" if faster else "none")
