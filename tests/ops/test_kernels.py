"""The native fp32 decode kernels against torch references (fp64 matmul, SDPA over the
gathered cache, F.rms_norm) with stated tolerances; the runner with and without them, on each
GEMM panel width this CPU runs; the fallback when they cannot be built; and oneDNN's packed
fp32 and bf16 linears on each CPU path this CPU has."""

import fcntl
import os
import subprocess
import sys
import time

import pytest
import torch
import torch.nn.functional as F

from longhaul.ops import kernels
from longhaul.inference.kv_cache import KVCache
from longhaul.ops.linear import SmallBatchLinear, pack
from longhaul.models import load_policy
from tests.ops.conftest import cache_with, runner_pair


@pytest.fixture(params=[8, 16], ids=["avx2-panels", "avx512-panels"])
def panel_width(request, native):
    if request.param == 16 and not native.has_avx512():  # their instructions cannot execute here; refused, below
        pytest.skip("this CPU has no AVX-512: the 16-wide panels do not run here")
    return request.param


def test_16_wide_panels_run_only_where_the_cpu_has_avx512(native):
    w = torch.randn(24, 16)
    if native.has_avx512():
        assert native.pack(w, 16).shape == (2, 16, 16)
    else:
        with pytest.raises(RuntimeError, match="need AVX-512"):
            native.pack(w, 16)


@pytest.mark.parametrize("n,k", [(576, 576), (13, 37), (100, 1536), (8, 8), (1, 5), (40, 24)])
@pytest.mark.parametrize("m", [1, 2, 5, 7, 8, 9, 16, 44])
def test_small_gemm_equals_fp64_matmul(native, panel_width, m, n, k):
    gen = torch.Generator().manual_seed(m * 1000 + n + k)
    x, w, b = torch.randn(m, k, generator=gen), torch.randn(n, k, generator=gen), torch.randn(n, generator=gen)
    ref = x.double() @ w.double().T
    for bias in (None, b):
        lin = SmallBatchLinear(w, bias, native, panel_width)
        assert lin.weight.shape[2] == panel_width
        want = ref if bias is None else ref + b.double()
        got = lin(x)
        assert got.shape == (m, n) and got.dtype == torch.float32
        # fp32 FMA sums in k order: within a few ulps of the fp64 sum times sqrt(K)
        torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5 * k ** 0.5)


def test_small_gemm_keeps_leading_dims_and_no_rows(native):
    w = torch.randn(24, 16)
    lin = SmallBatchLinear(w, None, native)
    x = torch.randn(2, 3, 16)
    torch.testing.assert_close(lin(x), F.linear(x, w), rtol=1e-5, atol=1e-5)
    assert lin(torch.randn(0, 16)).shape == (0, 24)


def test_pack_picks_the_kernel_for_fp32_decode_weights_only(native, monkeypatch):
    monkeypatch.delenv("LONGHAUL_GEMM_PANEL", raising=False)
    w = torch.randn(32, 16)
    assert isinstance(pack(w)[0], SmallBatchLinear)
    assert pack(w)[0].weight.shape[2] == (16 if native.has_avx512() else 8)  # the widest panel this CPU runs
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", "8")  # any AVX2 CPU, AVX-512 ones too, takes the AVX2 panels
    assert pack(w)[0].weight.shape[2] == 8
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", "16")
    if native.has_avx512():
        assert pack(w)[0].weight.shape[2] == 16
    else:  # refused, not silently narrowed
        with pytest.raises(RuntimeError, match="need AVX-512"):
            pack(w)
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", "4")
    with pytest.raises(ValueError, match="LONGHAUL_GEMM_PANEL must be 8 or 16"):
        pack(w)
    monkeypatch.delenv("LONGHAUL_GEMM_PANEL")
    with pytest.raises(RuntimeError, match="8 or 16"):
        native.pack(w, 4)
    assert not isinstance(pack(w, few_rows=False)[0], SmallBatchLinear)  # big forwards keep oneDNN
    assert not isinstance(pack(w.bfloat16())[0], SmallBatchLinear)


# oneDNN's packed linears (`linear.PackedLinear`): every bf16 projection of the engine, and the fp32
# ones where the native kernels do not run. oneDNN picks its kernel by CPU (AMX on Sapphire
# Rapids, AVX512-BF16 on Zen 4/5; on an AVX2-only Zen 3 bf16 does not pack at all and `pack` keeps
# the plain weight for F.linear). ONEDNN_MAX_CPU_ISA caps that pick, and oneDNN reads it once, so
# each capped path runs in a fresh process, on every host whose CPU has its instructions.
_PACKED_LINEAR_CHECK = """
import importlib.util, json, sys, torch
spec = importlib.util.spec_from_file_location("linear", sys.argv[1])  # linear.py alone: no transformers import
linear = importlib.util.module_from_spec(spec)
spec.loader.exec_module(linear)
PackedLinear, pack = linear.PackedLinear, linear.pack
torch.set_num_threads(1)
eps, out = torch.finfo(torch.float32).eps, {}
for dtype in (torch.float32, torch.bfloat16):
    for m, n, k in ((1, 576, 576), (8, 1536, 576), (37, 100, 1536), (5, 13, 37), (128, 192, 64)):
        gen = torch.Generator().manual_seed(m * n + k)
        x, w, b = (torch.randn(s, generator=gen).to(dtype) for s in ((m, k), (n, k), (n,)))
        lin, rest = pack(w, b, few_rows=False)  # the oneDNN path, never the native kernel
        y = (lin(x) if callable(lin) else torch.nn.functional.linear(x, lin, rest)).double()
        ref = x.double() @ w.double().T + b.double()  # exact, from the same (rounded) inputs
        # an fp32 sum in any order (32 eps of the terms' absolute sum: 16x the worst seen), then
        # one rounding to the output dtype (its unit roundoff u): what bf16 products summed in
        # fp32 give on every path; an fp32 linear computed in bf16 or TF32 is far outside it
        u = 2.0 ** -8 if dtype == torch.bfloat16 else eps / 2
        bound = u * ref.abs() + 32 * eps * (x.double().abs() @ w.double().abs().T + b.double().abs())
        d = (y - ref).abs()
        out[f"{str(dtype)[6:]} {m}x{n}x{k}"] = [isinstance(lin, PackedLinear), (d / bound).max().item(), d.max().item()]
print(json.dumps(out))
"""


@pytest.mark.parametrize("isa,needs", [(None, None), ("AVX512_CORE_BF16", "avx512_bf16"), ("AVX512_CORE", "avx512"), ("AVX2", None)],
                         ids=["host", "avx512-bf16", "avx512", "avx2"])
def test_onednn_linear_equals_fp64_matmul_on_each_cpu_path(isa, needs):
    """host: what this CPU gets (AMX where present); avx512-bf16: the AVX512-BF16 kernels, without
    AMX; avx512: bf16 converted to fp32 (oneDNN's gemm); avx2: a Zen 3, where bf16 keeps the
    plain weight. fp32 and bf16 at decode and prefill shapes against the fp64 product."""
    import json

    if needs is not None and not getattr(torch.cpu, f"_is_{needs}_supported", lambda: False)():
        pytest.skip(f"this CPU has no {needs.upper().replace('_', '-')}: oneDNN cannot take that path here")
    env = {**os.environ, "ONEDNN_VERBOSE": "1"}
    env.pop("ONEDNN_MAX_CPU_ISA", None)
    if isa is not None:
        env["ONEDNN_MAX_CPU_ISA"] = isa
    from longhaul.ops import linear

    out = subprocess.run([sys.executable, "-c", _PACKED_LINEAR_CHECK, linear.__file__], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    lines = out.stdout.splitlines()
    impls = sorted({ln.split(",")[6] for ln in lines if ",exec,cpu,inner_product," in ln})  # e.g. brg_matmul:avx512_core_amx
    for case, (packed, ratio, diff) in json.loads(lines[-1]).items():
        assert ratio <= 1, f"{case} (oneDNN {impls}): max |diff| {diff:.3g} is {ratio:.3g}x the bound"
        if case.startswith("float32"):
            assert packed, case  # fp32 packs on every x86 CPU
        elif isa == "AVX2":
            assert not packed, case  # oneDNN has no bf16 path on AVX2: pack keeps the plain weight
        elif torch.cpu._is_avx512_supported():
            assert packed, case


@pytest.mark.parametrize("hq,hkv,d,lens", [(9, 3, 64, [1, 5, 17, 4, 32]), (4, 4, 16, [1, 5, 17, 4, 32]), (6, 2, 12, [1, 5, 17, 4, 32]),
                                            (9, 3, 64, [1500]), (6, 2, 12, [0, 700, 9, 1300]), (9, 3, 64, [100]), (9, 3, 64, [70, 0])])
def test_decode_attention_equals_sdpa_over_the_gathered_cache(native, hq, hkv, d, lens):
    """Short contexts (one task a sequence and KV head) and long ones, which the kernel splits over
    threads and merges by log-sum-exp (an empty context gives zeros); a lone sequence of a few
    blocks is split too, so its heads do not leave a thread idle."""
    kv, tables, ctx = cache_with(lens, hkv, d, seed=hq + d)
    q = torch.randn(len(lens), hq, d, generator=torch.Generator().manual_seed(hq * d))  # seeded: the same check every run
    got = native.decode_attention(q, kv.k[0], kv.v[0], tables, ctx, kv.block_size, d ** -0.5)
    k, v = kv.gather(0, tables)  # (B, L, Hkv, D)
    mask = (torch.arange(k.shape[1])[None, :] < ctx[:, None])[:, None, None, :]
    qd = q.reshape(len(lens), hkv, hq // hkv, d)
    ref = F.scaled_dot_product_attention(qd, k.transpose(1, 2), v.transpose(1, 2), attn_mask=mask).reshape(len(lens), hq, d)
    ref = ref.nan_to_num()  # SDPA over an empty context: NaN; the kernel gives zeros
    # each output is a softmax-weighted mean of unit-normal v: both sides round to a few fp32 eps
    # of |v| ~ 1 whatever SDPA's kernel (up to 0.31 of this tolerance over 150 random q)
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-6)


def test_decode_attention_refuses_a_length_past_its_blocks(native):
    kv, tables, ctx = cache_with([3, 5], 2, 8)
    with pytest.raises(RuntimeError, match="context length exceeds"):
        native.decode_attention(torch.randn(2, 2, 8), kv.k[0], kv.v[0], tables, ctx + 100, kv.block_size, 1.0)


@pytest.mark.parametrize("n,e", [(1, 576), (8, 64), (3, 13)])
def test_rms_norm_equals_torch(native, n, e):
    x, w = torch.randn(n, e) * 3, torch.randn(e)
    torch.testing.assert_close(native.rms_norm(x, w, 1e-5), F.rms_norm(x, (e,), w, 1e-5), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2"])
def test_runner_logits_with_and_without_the_kernels_agree(native, panel_width, monkeypatch, name):
    """Prefill chunks, then decodes of sequences of different lengths in one batch: the native
    path (GEMM, paged attention, RMSNorm) equals torch's ops (oneDNN, gather + SDPA) to fp32
    rounding, with the GEMM's AVX2 panels on every host and its AVX-512 ones where they run."""
    monkeypatch.setenv("LONGHAUL_GEMM_PANEL", str(panel_width))
    model, _ = load_policy(name)
    runners, outs = runner_pair(model, torch.float32)
    assert runners[0].native is not None and runners[1].native is None
    assert {e[1].weight.shape[2] for e in runners[0]._exec} == {panel_width}  # the qkv projections
    torch.testing.assert_close(outs[0], outs[1], rtol=1e-5, atol=1e-5)


def test_kernels_stay_off_on_a_cpu_without_avx2_or_when_asked(monkeypatch):
    """The capability check, forced on any host (ATen's pick: AVX512 and AVX2 run the kernels)."""
    monkeypatch.delenv("LONGHAUL_KERNELS", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "DEFAULT")
    assert kernels._missing_requirement() == "the CPU has DEFAULT, the kernel needs AVX2 and FMA"
    monkeypatch.setenv("LONGHAUL_KERNELS", "0")
    assert kernels._missing_requirement() == "LONGHAUL_KERNELS=0"


def test_without_a_compiler_the_engine_says_why_and_keeps_torch_ops(tmp_path):
    """A machine without the toolchain: one stderr line naming the fix, no kernels, and the
    engine still runs (in a fresh process, so the cached module of this one is not reused)."""
    code = ("from longhaul.inference import LLMEngine; from longhaul.ops import kernels; assert kernels.native() is None; "
            "e = LLMEngine('tiny-llama'); assert e.runner.native is None; print(len(e.generate(['hi'])[0].token_ids))")
    env = {**os.environ, "CXX": "no-such-compiler", "PATH": str(tmp_path), "LONGHAUL_KERNEL_CACHE": str(tmp_path / "k")}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "native decode kernels off (no C++ compiler; apt-get install g++)" in out.stderr
    assert int(out.stdout.strip()) > 0


def test_prune_builds_keeps_the_current_and_the_most_recently_used(tmp_path):
    dirs = [tmp_path / f"torch2.0.0-{i:012x}" for i in range(6)]
    for age, d in enumerate(dirs):  # dirs[0] used last ... dirs[5] first
        d.mkdir()
        (d / ("lock" if age == 4 else "longhaul_cpu_kernels.so")).write_bytes(b"")  # dirs[4]: being built
        os.utime(d, (1_000_000 - age * 1000,) * 2)
    (tmp_path / "unrelated").mkdir()
    current = dirs[5]  # the oldest, now loaded: marked used, never removed
    removed = kernels.prune_builds(current, keep=2)
    assert sorted(removed) == sorted([dirs[2], dirs[3]])
    assert all(d.exists() for d in (dirs[0], dirs[1], dirs[4], current, tmp_path / "unrelated"))
    assert current.stat().st_mtime > dirs[0].stat().st_mtime
    assert kernels.prune_builds(tmp_path / "gone") == []  # a vanished cache is not an error


def test_a_build_compiles_its_own_copy_of_the_sources(native):
    # another checkout of the same sources then finds the same build file and rebuilds nothing
    out = kernels.build_dir(sorted(kernels.CSRC.glob("*.cpp")))
    ninja = (out / "build.ninja").read_text()
    assert str(out / "src" / "module.cpp") in ninja and str(kernels.CSRC) not in ninja
    for f in kernels.CSRC.glob("*.[ch]*"):
        assert (out / "src" / f.name).read_bytes() == f.read_bytes()


def test_a_lock_left_by_a_killed_loader_is_removed_by_the_next_once_old(tmp_path, monkeypatch):
    lock = tmp_path / "lock"  # torch's lock file, as a loader killed mid-load leaves it
    lock.write_bytes(b"")
    os.utime(lock, (time.time() - 2,) * 2)
    monkeypatch.setattr(kernels, "DEAD_LOCK_S", 3.0)  # fresh: a compiler of the dead loader may still write
    t0 = time.monotonic()
    with kernels._builder(tmp_path):
        assert not lock.exists()
    assert time.monotonic() - t0 >= 0.5, "a fresh lock is waited on until it is DEAD_LOCK_S old"


HOLD = ("import sys, time; from pathlib import Path; from longhaul.ops import kernels\n"
        "with kernels._builder(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(120)")


def test_the_builder_lock_is_exclusive_and_released_when_its_holder_dies(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(tmp_path)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        fd = os.open(tmp_path / kernels.LOCKING, os.O_RDWR)
        try:
            with pytest.raises(BlockingIOError):
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            holder.kill()
            holder.wait(timeout=30)
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # the kernel let go of the dead holder's lock
        finally:
            os.close(fd)
    finally:
        holder.kill()
        holder.wait()


def test_prune_leaves_a_build_that_a_loader_holds(tmp_path):
    (tmp_path / "current").mkdir()
    held, free = tmp_path / "torch2-held", tmp_path / "torch2-free"
    for d in (held, free):
        d.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(held)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        assert kernels.prune_builds(tmp_path / "current", keep=0) == [free]
        assert held.is_dir() and not free.exists()
    finally:
        holder.kill()
        holder.wait()


@pytest.mark.parametrize("v", [49152, 1001, 7])
@pytest.mark.parametrize("with_entropy,write_probs", [(False, False), (True, False), (False, True), (True, True)])
def test_softmax_stats_equal_log_softmax(native, v, with_entropy, write_probs):
    gen = torch.Generator().manual_seed(v)
    z = torch.randn(5, v, generator=gen) * 8
    z[1] += 300  # a large offset: the max subtraction must keep it finite
    z[2, : v // 2] = -1e4  # very unlikely tokens underflow to 0 probability
    targets = torch.randint(0, v, (5,), generator=gen)
    ref = z.double().log_softmax(-1)
    work = z.clone()
    logp, ent = native.softmax_stats(work, targets, with_entropy, write_probs)
    torch.testing.assert_close(logp.double(), ref.gather(1, targets[:, None]).squeeze(1), rtol=1e-5, atol=1e-5)
    if with_entropy:
        torch.testing.assert_close(ent.double(), -(ref.exp() * ref).sum(-1), rtol=1e-5, atol=1e-5)
    else:
        assert ent.numel() == 0
    if write_probs:
        torch.testing.assert_close(work.double(), ref.exp(), rtol=1e-5, atol=1e-7)
    else:
        assert torch.equal(work, z)


def test_softmax_stats_refuses_a_target_outside_the_vocabulary(native):
    with pytest.raises(RuntimeError, match="outside the vocabulary"):
        native.softmax_stats(torch.randn(2, 10), torch.tensor([3, 10]), False, False)


def test_rope_and_cache_equals_apply_rope_and_write(native):
    from longhaul.ops.rope import apply_rope

    hq, hkv, d, n = 6, 2, 16, 5
    qkv = torch.randn(n, hq + 2 * hkv, d)
    angles = torch.rand(n, d // 2) * 10
    cos, sin = torch.cat([angles.cos()] * 2, -1), torch.cat([angles.sin()] * 2, -1)
    slots = torch.tensor([7, 0, 3, 12, 5])
    ours, ref = KVCache(1, 4, 4, hkv, d), KVCache(1, 4, 4, hkv, d)
    q = native.rope_and_cache(qkv, cos, sin, ours.k[0], ours.v[0], slots, hq)
    qk = apply_rope(qkv[:, :hq + hkv], cos, sin)
    ref.write(0, slots, qk[:, hq:], qkv[:, hq + hkv:])
    torch.testing.assert_close(q, qk[:, :hq], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(ours.k, ref.k, rtol=1e-6, atol=1e-6)
    assert torch.equal(ours.v, ref.v)
    with pytest.raises(RuntimeError, match="outside the cache"):
        native.rope_and_cache(qkv, cos, sin, ours.k[0], ours.v[0], slots + 100, hq)


@pytest.mark.parametrize("n,e", [(1, 576), (130, 64), (3, 13)])
def test_rms_norm_backward_equals_autograd(native, n, e):
    gen = torch.Generator().manual_seed(n * 1000 + e)
    x, w, g = torch.randn(n, e, generator=gen) * 2, torch.randn(e, generator=gen), torch.randn(n, e, generator=gen)
    x64, w64 = x.double().requires_grad_(), w.double().requires_grad_()
    F.rms_norm(x64, (e,), w64, 1e-6).backward(g.double())  # the exact gradient: autograd in fp64
    dx, dw = native.rms_norm_backward(g, x, w, 1e-6)
    torch.testing.assert_close(dx.double(), x64.grad, rtol=1e-5, atol=1e-5)
    # dw sums n rows' g * x * rstd of both signs: its rounding is a few fp32 ulps of the terms'
    # absolute sum, not of |dw| (up to 1.8 eps of it over 300 seeds; torch's fp32 autograd, the
    # old reference, is as far off, and against it an rtol/atol of 1e-5 had a 1.6x margin)
    rstd = (x64.detach().pow(2).mean(-1, keepdim=True) + 1e-6).rsqrt()
    terms = (g.double() * x64.detach() * rstd).abs().sum(0)
    off = ((dw.double() - w64.grad).abs() / terms).max().item() / torch.finfo(torch.float32).eps
    assert off < 8, f"dw off by {off:.2f} fp32 eps of sum |terms|"


def test_mm_into_writes_the_given_rows(native, panel_width):
    gen = torch.Generator().manual_seed(3)
    w, x = torch.randn(40, 24, generator=gen), torch.randn(5, 24, generator=gen)
    lin = SmallBatchLinear(w, None, native, panel_width)
    store = torch.full((9, 40), 7.0)
    got = lin(x, out=store[2:7])
    assert got.data_ptr() == store[2:7].data_ptr()
    torch.testing.assert_close(store[2:7], lin(x), rtol=0, atol=0)  # the same kernel either way
    assert (store[:2] == 7).all() and (store[7:] == 7).all()  # rows outside untouched
    with pytest.raises(RuntimeError, match="mm_into"):
        lin(x, out=torch.empty(5, 41))
    with pytest.raises(RuntimeError, match="mm_into"):
        lin(x, out=torch.empty(5, 80)[:, ::2])  # not contiguous


@pytest.mark.parametrize("fused", [False, True])
def test_swiglu_and_its_gradient_equal_autograd(native, fused):
    gen = torch.Generator().manual_seed(5)
    n, f = 37, 203  # F not a multiple of 8: the scalar tail too
    gu = (torch.randn(n, 2 * f, generator=gen) * 4).double()  # wide range: both sigmoid tails
    gu[0, :8], gu[1, :8] = 100.0, -100.0  # past the AVX2 exp's clamp at +-87
    gate, up = gu[:, :f], gu[:, f:]
    ref = F.silu(gate) * up  # in fp64
    dout = torch.randn(n, f, generator=gen).double()
    gu64 = gu.detach().clone().requires_grad_()
    (F.silu(gu64[:, :f]) * gu64[:, f:]).backward(dout)
    g_ref = gu64.grad
    g32 = gu.detach().float()
    if fused:  # views of one (N, 2F) tensor (row stride 2F), the gradient into one buffer
        gate32, up32 = g32[:, :f], g32[:, f:]
        dgu = torch.empty(n, 2 * f)
        dgate, dup = dgu[:, :f], dgu[:, f:]
    else:  # two tensors of their own (row stride F)
        gate32, up32 = g32[:, :f].clone(), g32[:, f:].clone()
        dgate, dup = torch.empty(n, f), torch.empty(n, f)
    out = native.swiglu(gate32, up32)
    torch.testing.assert_close(out.double(), ref.detach(), rtol=1e-5, atol=1e-5)
    native.swiglu_backward(dout.float(), gate32, up32, dgate, dup)
    torch.testing.assert_close(torch.cat([dgate, dup], dim=1).double(), g_ref, rtol=1e-5, atol=1e-5)
    with pytest.raises(RuntimeError, match="swiglu"):
        native.swiglu(gate32, up32[:, 1:])


def _layout(seed=0):
    """A pack_shared layout: a prompt of 5 and completions of 4, 1 and 6 tokens."""
    from longhaul.rl.packed_forward import pack_shared

    gen = torch.Generator().manual_seed(seed)
    tok = lambda k: torch.randint(10, 90, (k,), generator=gen).tolist()  # noqa: E731
    return pack_shared(tok(5), [tok(4), tok(1), tok(6)], 0)


@pytest.mark.parametrize("hq,hkv,d", [(4, 2, 8), (6, 3, 64), (2, 2, 16)])
def test_attention_pack_and_unpack_equal_the_torch_layout_and_their_gradients_equal_autograd(native, hq, hkv, d):
    from longhaul.ops.rope import rotate_half

    b = _layout()
    n = b.input_ids.numel()
    gen = torch.Generator().manual_seed(hq * 100 + d)
    R, Tq = b.q_index.shape
    Lk, g = b.kv_index.shape[1], hq // hkv
    ang = b.positions[:, None].double() * torch.rand(d // 2, generator=gen).double()[None]
    cos, sin = torch.cat([ang.cos()] * 2, 1), torch.cat([ang.sin()] * 2, 1)
    qkv = torch.randn(n, (hq + 2 * hkv) * d, generator=gen).double().requires_grad_()
    q, k, v = qkv.split([hq * d, hkv * d, hkv * d], dim=1)
    rope = lambda x: x * cos[:, None] + rotate_half(x) * sin[:, None]  # noqa: E731
    qr, kr, vr = rope(q.view(n, hq, d)), rope(k.view(n, hkv, d)), v.view(n, hkv, d)
    # the reference layout, by index_select (as `packed_forward._attention`), pads zeroed
    qp = qr.index_select(0, b.q_index.reshape(-1)).view(R, Tq, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(R, hkv, g * Tq, d)
    kp = kr.index_select(0, b.kv_index.reshape(-1)).view(R, Lk, hkv, d).transpose(1, 2)
    vp = vr.index_select(0, b.kv_index.reshape(-1)).view(R, Lk, hkv, d).transpose(1, 2)
    qpad = (torch.arange(Tq)[None] < b.q_len[:, None]).repeat(1, g)[:, None, :, None]  # (R, 1, G Tq, 1)
    kpad = (torch.arange(Lk)[None] < b.kv_len[:, None])[:, None, :, None]
    qp, kp, vp = qp * qpad, kp * kpad, vp * kpad
    x32 = qkv.detach().float()
    views = [x32[:, :hq * d].view(n, hq, d), x32[:, hq * d:(hq + hkv) * d].view(n, hkv, d), x32[:, (hq + hkv) * d:].view(n, hkv, d)]
    got = native.attention_pack(*views, cos.float(), sin.float(), b.q_index, b.q_len, b.kv_index, b.kv_len)
    for have, want in zip(got, (qp, kp, vp)):
        assert have.shape == want.shape and have.is_contiguous()
        torch.testing.assert_close(have.double(), want.detach(), rtol=1e-5, atol=1e-5)
    # backward: random upstream gradients at the real entries (pads get none from SDPA)
    dqp, dkp, dvp = (torch.randn(t.shape, generator=gen).double() * m for t, m in ((qp, qpad), (kp, kpad), (vp, kpad)))
    want = torch.autograd.grad((qp * dqp).sum() + (kp * dkp).sum() + (vp * dvp).sum(), qkv)[0]
    whole = torch.full((n, (hq + 2 * hkv) * d), float("nan"))  # every entry must be written
    parts = [whole[:, :hq * d].view(n, hq, d), whole[:, hq * d:(hq + hkv) * d].view(n, hkv, d), whole[:, (hq + hkv) * d:].view(n, hkv, d)]
    native.attention_pack_backward(dqp.float(), dkp.float().transpose(1, 2).contiguous().transpose(1, 2), dvp.float(), cos.float(),
                                   sin.float(), b.out_index, b.kv_index, b.kv_len, *parts)
    torch.testing.assert_close(whole.double(), want, rtol=1e-5, atol=1e-5)
    # unpack: flat row n's heads from its query slot, and back
    o = torch.randn(R, hkv, g * Tq, d, generator=gen)
    ref = o.view(R, hkv, g, Tq, d).permute(0, 3, 1, 2, 4).reshape(R * Tq, hq * d).index_select(0, b.out_index)
    torch.testing.assert_close(native.attention_unpack(o, b.out_index, hq), ref, rtol=0, atol=0)
    gflat = torch.randn(n, hq * d, generator=gen)
    o64 = o.double().requires_grad_()
    ref64 = o64.view(R, hkv, g, Tq, d).permute(0, 3, 1, 2, 4).reshape(R * Tq, hq * d).index_select(0, b.out_index)
    want_o = torch.autograd.grad(ref64, o64, gflat.double())[0]
    torch.testing.assert_close(native.attention_unpack_backward(gflat, b.out_index, R, Tq, hkv, hq).double(), want_o, rtol=0, atol=0)


def test_attention_pack_refuses_indices_outside_the_rows(native):
    b = _layout()
    n = b.input_ids.numel()
    q, kv = torch.randn(n, 4, 8), torch.randn(n, 2, 8)
    cs = torch.randn(n, 8)
    bad = b.kv_index.clone()
    bad[0, 0] = n
    with pytest.raises(RuntimeError, match="key index"):
        native.attention_pack(q, kv, kv, cs, cs, b.q_index, b.q_len, bad, b.kv_len)
    with pytest.raises(RuntimeError, match="out of range"):
        native.attention_unpack(torch.randn(1, 2, 2, 8), b.out_index, 4)


def test_each_torch_install_builds_into_its_own_directory(monkeypatch, tmp_path):
    """Two venvs on one machine compile against different torch include paths: sharing one build
    directory made each rebuild the other's and wait on its lock."""
    from longhaul.ops import kernels

    monkeypatch.setenv("LONGHAUL_KERNEL_CACHE", str(tmp_path))
    sources = sorted(kernels.CSRC.glob("*.cpp"))
    here = kernels.build_dir(sources)
    assert here == kernels.build_dir(sources), "the same install: the same build"
    monkeypatch.setattr(torch, "__file__", str(tmp_path / "other-venv" / "torch" / "__init__.py"))
    assert kernels.build_dir(sources) != here
