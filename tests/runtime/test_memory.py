"""The memory breakdown: each part against the bytes its holder is known to hold, every storage
counted once, and the parts against the kernel's resident figure."""

from concurrent.futures import ProcessPoolExecutor
import multiprocessing as mp

import pytest
import torch

from longhaul.inference import make_engine
from longhaul.inference.sampling import SamplingParams
from longhaul.models import load_policy
from longhaul.ops.linear import pack
from longhaul.rl.grpo import frozen_copy
from longhaul.runtime.memory import PARTS, measure


def _in_a_fresh_process(body):
    """Runs `body` in a new interpreter: the resident figure is the whole process's, and a test
    runner that has imported and freed what a thousand tests needed is not what a training process
    holds (its leftover arenas and mappings would land in `unaccounted`)."""
    with ProcessPoolExecutor(max_workers=1, mp_context=mp.get_context("spawn")) as pool:
        pool.submit(body).result()  # an assertion in the child is raised here with its message


class _Trainer:
    def __init__(self, policy):
        self.optimizer = torch.optim.AdamW(policy.parameters(), lr=1e-3)
        self.ref = frozen_copy(policy)


def test_each_part_is_what_its_holder_holds_and_all_add_up_to_the_resident_figure():
    _in_a_fresh_process(_each_part_adds_up)


def _each_part_adds_up():
    policy, tok = load_policy("tiny-llama")
    params = sum(p.numel() * p.element_size() for p in policy.parameters())
    trainer = _Trainer(policy)
    before = measure(policy, trainer)
    assert before.parts["gradients"] == 0 and before.parts["optimizer"] == 0, "nothing before the first step"
    policy(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    trainer.optimizer.step()
    engine = make_engine(policy, tok, "float32", max_model_len=256)
    b = measure(policy, trainer, engine)
    assert set(b.parts) == set(PARTS)
    assert params <= b.parts["weights"] <= params * 1.05  # parameters and buffers (rotary frequencies)
    assert b.parts["gradients"] == params
    assert 2 * params <= b.parts["optimizer"] <= 2 * params + 4096  # Adam's two moments and a step counter each
    assert b.parts["reference"] == b.parts["weights"]
    kv = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
          for t in (getattr(engine.kv, k) for k in vars(engine.kv)) if isinstance(t, torch.Tensor)}
    assert b.parts["kv_pool"] == sum(kv.values()) > 0
    assert b.parts["sampler"] > 0 and b.parts["files"] > 0
    assert b.peak >= b.resident > 0
    # what no part names: Python's object arenas, thread stacks, libraries' static data; a fixed
    # few hundred MB however large the model (a training process is gigabytes)
    assert abs(b.unaccounted) < 300e6, b.table()
    m = b.metrics()
    assert m["memory/resident_gb"] == round(b.resident / 1e9, 4) and "memory/kv_pool_gb" in m


def test_a_storage_shared_by_two_holders_is_counted_once():
    policy, _ = load_policy("tiny-llama")

    class Shares:
        optimizer = None
        ref = policy  # the same modules as the policy: nothing new

    assert measure(policy, Shares()).parts["reference"] == 0


def test_a_bf16_engine_with_onednn_packed_weights_is_measured():
    """oneDNN's packed weights (the bf16 engine where the native kernel does not take them) keep
    their storage opaque: counted by their size, on every host, not refused."""
    policy, tok = load_policy("tiny-llama")
    engine = make_engine(policy, tok, "bfloat16", max_model_len=256)
    engine.runner.pack_weights(lambda w, b: pack(w, b, few_rows=False))  # oneDNN's packing on any CPU that has it
    packed = [e[1] for e in engine.runner._exec if callable(e[1]) and getattr(e[1], "weight", None) is not None]
    b = measure(policy, None, engine)
    assert b.parts["sampler"] > 0
    if packed and packed[0].weight.is_mkldnn:
        assert b.parts["sampler"] >= sum(p.weight.numel() * 2 for p in packed)


def test_bound_free_heap_hands_kept_memory_back_once_over_the_limit():
    """With freed memory kept (`keep_freed_memory`), 400 MB of freed tensors stay resident; under
    a limit above them nothing happens, under one below them malloc_trim gives them back."""
    import os
    import subprocess
    import sys

    code = """
import pytest
import torch
from longhaul.malloc import bound_free_heap, heap, keep_freed_memory
if heap() is None or not keep_freed_memory():
    print("skip"); raise SystemExit
xs = [torch.ones(50 << 20, dtype=torch.uint8) for _ in range(8)]
del xs
print(bound_free_heap(1 << 40), bound_free_heap(0))
"""
    env = {**os.environ, "LONGHAUL_MALLOC": "keep"}  # the suite runs with the system allocator (conftest)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env).stdout.split()
    if out == ["skip"]:
        pytest.skip("not glibc's malloc: nothing to trim")
    above, below = map(int, out)
    assert above == 0 and below > 300 << 20, out


def test_free_limit_defaults_to_a_bound_and_reads_its_variable(monkeypatch):
    from longhaul.errors import LonghaulError
    from longhaul.malloc import FREE_GB, free_limit

    monkeypatch.delenv("LONGHAUL_MALLOC_FREE_GB", raising=False)
    assert free_limit() == int(FREE_GB * 1e9)  # every training process is bounded unless told otherwise
    monkeypatch.setenv("LONGHAUL_MALLOC_FREE_GB", "1.5")
    assert free_limit() == 1_500_000_000
    monkeypatch.setenv("LONGHAUL_MALLOC_FREE_GB", "off")
    assert free_limit() is None
    monkeypatch.setenv("LONGHAUL_MALLOC_FREE_GB", "two")
    with pytest.raises(LonghaulError, match="not a size in GB"):
        free_limit()


def test_the_cli_refuses_a_bad_free_heap_bound_before_any_work(monkeypatch, capsys):
    from longhaul.cli import main

    monkeypatch.setenv("LONGHAUL_MALLOC_FREE_GB", "lots")
    with pytest.raises(SystemExit) as e:
        main(["env"])
    err = capsys.readouterr().err
    assert e.value.code != 0 and "LONGHAUL_MALLOC_FREE_GB='lots' is not a size in GB" in err and "Traceback" not in err


def test_a_sleeping_engine_s_pool_counts_only_its_pages_in_memory():
    policy, tok = load_policy("tiny-llama")
    engine = make_engine(policy, tok, "float32", max_model_len=256, num_kv_blocks=8192)
    engine.generate([tok.encode("hello there")], SamplingParams(max_tokens=4))
    awake = measure(policy, None, engine)
    pool = engine.kv.nbytes()
    assert awake.parts["kv_pool"] == pool > 50e6
    engine.sleep()
    asleep = measure(policy, None, engine)
    assert asleep.parts["kv_pool"] < 0.01 * pool
    # the pool's discarded pages leave the resident figure, not moved to another part
    assert abs(asleep.unaccounted - awake.unaccounted) < 0.1 * pool, (awake.table(), asleep.table())
    assert awake.resident - asleep.resident > 0.8 * pool


def test_weights_mapped_from_a_file_count_once_and_not_as_heap(tmp_path):
    """Weights mapped from a file (as a model's safetensors load) are resident as the file's pages
    until written and as anonymous memory after: counted in `weights` either way, not again in
    `files`, and not taken off the heap's use either."""
    from longhaul.runtime.memory import _status

    torch.save({"w": torch.randn(64 << 18)}, tmp_path / "w.pt")  # 64 MB
    policy = torch.nn.Linear(1, 1)
    base, file_pages = measure(policy), _status()["RssFile"]
    mapped = torch.load(tmp_path / "w.pt", mmap=True)["w"]
    policy.w = torch.nn.Parameter(mapped, requires_grad=False)
    assert float(mapped.sum()) != 0  # read: every page resident, still the file's
    before = measure(policy)
    assert _status()["RssFile"] - file_pages > 60e6  # the kernel counts them as the file's
    assert before.parts["weights"] - base.parts["weights"] == 64 << 20
    assert before.parts["files"] - base.parts["files"] < 10e6, (base.table(), before.table())
    assert abs(before.unaccounted - base.unaccounted) < 20e6, (base.table(), before.table())
    with torch.no_grad():
        mapped.mul_(2.0)  # written: the pages become this process's own (copy on write)
    after = measure(policy)
    assert after.parts["weights"] == before.parts["weights"] and after.parts["files"] - base.parts["files"] < 10e6
    assert abs(after.unaccounted - base.unaccounted) < 20e6, (base.table(), after.table())


def test_heap_allocated_but_not_resident_is_not_counted_as_resident():
    _in_a_fresh_process(_discarded_heap_is_not_resident)


def _discarded_heap_is_not_resident():
    """A buffer allocated and then discarded (an idle pool nobody measures) stays in the heap's
    use but not in memory: heap_other is capped at what the resident figure leaves, so the parts
    never add up to more than resident (it may take what was unaccounted, not the whole buffer)."""
    from longhaul.malloc import discard

    before = measure()
    idle = torch.ones(256 << 20, dtype=torch.uint8)  # 256 MB, then handed back but kept allocated
    discard(idle.data_ptr(), idle.numel())
    after = measure()
    assert after.unaccounted > -5e6, after.table()
    # uncapped, heap_other would grow by the whole 256 MB; capped, it may take what was unaccounted
    # or what the allocator's free list held before (both are resident memory the parts share)
    heap = lambda m: m.parts["heap_other"] + m.parts.get("allocator_free", 0)  # noqa: E731
    assert heap(after) - heap(before) < 0.75 * (256 << 20), (before.table(), after.table())
    del idle


def test_the_sampler_part_holds_the_engine_s_packed_weights():
    """The runner reaches itself through its weight table before its packed layers: a walk that
    marked objects seen at a shallower depth stopped there and missed the packed weights."""
    from longhaul.ops.linear import SmallBatchLinear
    from longhaul.runtime.memory import _tensors

    policy, tok = load_policy("tiny-llama")
    engine = make_engine(policy, tok, "float32", max_model_len=256, num_kv_blocks=64)
    runner = engine.runner
    packed = {w.weight.untyped_storage().data_ptr() for row in runner._exec for w in row if isinstance(w, SmallBatchLinear)}
    assert len(packed) == 4 * len(runner.layers) or runner.native is None
    found = {t.untyped_storage().data_ptr() for t in _tensors({k: v for k, v in vars(runner).items() if k != "recorder"})}
    assert packed <= found
