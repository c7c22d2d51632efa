"""The `auto` dtype choice: bf16 only where it is the faster choice."""

import pytest
import torch

from longhaul import hardware
from longhaul.errors import LonghaulError
from longhaul.ops import kernels


@pytest.fixture
def cpu(monkeypatch):
    """Set the probes of a CPU: (avx512_bf16, amx, native kernels run)."""
    monkeypatch.delenv("LONGHAUL_BF16", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)

    def set_cpu(avx512_bf16: bool, amx: bool, kernels_run: bool):
        monkeypatch.setattr(hardware, "native_bf16", lambda: avx512_bf16 or amx)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        monkeypatch.setattr(kernels, "_missing_requirement", lambda: None if kernels_run else "no C++ compiler")
        return hardware.prefer_bf16.__wrapped__()
    return set_cpu


@pytest.mark.parametrize("avx512_bf16,amx,kernels_run,want", [
    (False, False, True, False),   # AVX2 only: bf16 is emulated
    (False, False, False, False),
    (True, False, True, True),     # AVX512-BF16 without AMX: the native bf16 kernels beat the fp32 ones
    (True, False, False, True),    # ... and without any native kernels oneDNN's bf16 beats its fp32
    (True, True, True, True),      # AMX: bf16
])
def test_auto_picks_bf16_where_bf16_arithmetic_is_native(cpu, avx512_bf16, amx, kernels_run, want):
    assert cpu(avx512_bf16, amx, kernels_run) is want


def test_explicit_dtypes_pass_through():
    assert hardware.resolve_dtype("float32") == "float32" and hardware.resolve_dtype("bfloat16") == "bfloat16"
    assert hardware.resolve_autocast("none") == "none"
    faster = hardware.prefer_bf16()
    assert hardware.resolve_dtype("auto") == ("bfloat16" if faster else "float32")
    assert hardware.resolve_autocast("auto") == ("bfloat16" if faster else "none")


@pytest.fixture
def probes(monkeypatch):
    """Set what `native_bf16` reads: LONGHAUL_BF16, the GPU, and the CPU's AVX512-BF16 and AMX
    probes; returns the uncached `native_bf16`, which `prefer_bf16` then calls too."""
    def set_probes(env, cuda_bf16=None, avx512_bf16=False, amx=False):
        if env is None:
            monkeypatch.delenv("LONGHAUL_BF16", raising=False)
        else:
            monkeypatch.setenv("LONGHAUL_BF16", env)
        monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda_bf16 is not None)
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bool(cuda_bf16))
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16, raising=False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx, raising=False)
        monkeypatch.setattr(hardware, "native_bf16", hardware.native_bf16.__wrapped__)
        return hardware.native_bf16
    return set_probes


@pytest.mark.parametrize("env,cuda_bf16,avx512_bf16,amx,want", [
    (None, None, False, False, False),  # AVX2 only (Zen 3)
    (None, None, True, False, True),    # AVX512-BF16 (Zen 4/5)
    (None, None, True, True, True),     # AMX (Sapphire Rapids)
    (None, None, False, True, True),    # AMX alone
    (None, True, False, False, True),   # a GPU with bf16: the CPU does not matter
    (None, False, True, True, False),   # a GPU without
    ("1", None, False, False, True),    # LONGHAUL_BF16 overrides every probe
    ("0", True, True, True, False),
])
def test_native_bf16_reads_the_setting_then_the_gpu_then_the_cpu(probes, env, cuda_bf16, avx512_bf16, amx, want):
    assert probes(env, cuda_bf16, avx512_bf16, amx)() is want


@pytest.mark.parametrize("env,cuda_bf16,amx,want", [
    ("1", None, False, True),   # forced bf16 on an AVX2-only CPU
    ("0", None, True, False),   # forced fp32 with AMX
    (None, True, False, True),  # a GPU with bf16
    (None, False, True, False),  # a GPU without: the CPU's AMX does not count
])
def test_prefer_bf16_follows_the_setting_and_the_gpu_before_the_cpu(probes, env, cuda_bf16, amx, want):
    probes(env, cuda_bf16, avx512_bf16=amx, amx=amx)
    assert hardware.prefer_bf16.__wrapped__() is want


@pytest.mark.parametrize("faster", [True, False])
def test_auto_resolves_each_way_whatever_the_host(monkeypatch, faster):
    """Both branches of `auto`, through the config too (it resolves when loaded), on every host."""
    from longhaul.config import RolloutConfig, TrainConfig

    monkeypatch.setattr(hardware, "prefer_bf16", lambda: faster)
    assert hardware.resolve_dtype("auto") == RolloutConfig().dtype == ("bfloat16" if faster else "float32")
    assert hardware.resolve_autocast("auto") == TrainConfig().autocast == ("bfloat16" if faster else "none")
    assert RolloutConfig(dtype="float32").dtype == "float32" and TrainConfig(autocast="none").autocast == "none"


def test_auto_device_is_a_gpu_only_where_torch_sees_one():
    assert hardware.resolve_device("auto") == ("cuda" if torch.cuda.is_available() else "cpu")
    assert hardware.resolve_device("cpu") == "cpu"


@pytest.mark.parametrize("name", ["gpu", "cuda:", "cuda:x", "CPU", "mps"])
def test_device_names_outside_the_list_are_refused_in_one_line(name):
    with pytest.raises(LonghaulError, match=r"^device .* is not one of auto, cpu, cuda or cuda:N; pick one of those$"):
        hardware.resolve_device(name)


def test_a_gpu_that_is_not_here_is_refused_with_what_torch_sees(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(LonghaulError, match=r"device cuda asked for, but .*; use device cpu, or auto$"):
        hardware.resolve_device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert hardware.resolve_device("cuda:1") == "cuda:1"
    with pytest.raises(LonghaulError, match=r"torch sees 2 CUDA GPU\(s\); use cuda:0 .. cuda:1$"):
        hardware.resolve_device("cuda:2")


def test_bf16_autocast_follows_the_device_it_is_asked_about():
    from longhaul.ops.autocast import autocast, autocast_dtype, no_autocast

    assert autocast_dtype("cpu") is None
    with autocast("bfloat16"):
        assert autocast_dtype("cpu") == torch.bfloat16
        assert autocast_dtype(torch.zeros(1).device) == torch.bfloat16
        x = torch.randn(4, 8)
        assert (x @ x.t()).dtype == torch.bfloat16
        with no_autocast("cpu"):
            assert autocast_dtype("cpu") is None and (x @ x.t()).dtype == torch.float32
    with autocast("none"):
        assert autocast_dtype("cpu") is None
