"""Weight sync transports: every version arrives whole, in the engine's dtype, with bytes and time counted."""

import torch
import torch.multiprocessing as mp

from longhaul.runtime.weights import FileWeights, InProcessWeights, SharedMemoryWeights
from tests.waiting import DEADLINE_S


def _tensors(v: float) -> dict:
    return {"a.weight": torch.full((64, 32), v), "b.bias": torch.full((7,), -v), "steps": torch.tensor([int(v)])}


def test_inprocess_copies_so_later_trainer_updates_do_not_leak():
    t = InProcessWeights()
    src = _tensors(1.0)
    t.publish(src, 1)
    src["a.weight"].add_(5)  # the trainer keeps updating in place
    got, version = t.fetch(0)
    assert version == 1 and torch.equal(got["a.weight"], torch.full((64, 32), 1.0))
    assert t.fetch(1) is None
    assert t.stats.publishes == 1 and t.stats.bytes_published == (64 * 32 + 7) * 4 + 8


def test_bf16_on_the_wire_rounds_exactly_like_the_engine():
    w = {"w": torch.randn(128, 128)}
    t = InProcessWeights(torch.bfloat16)
    t.publish(w, 3)
    got, _ = t.fetch(-1)
    assert got["w"].dtype == torch.bfloat16 and torch.equal(got["w"], w["w"].to(torch.bfloat16))
    engine_side = torch.empty(128, 128, dtype=torch.bfloat16).copy_(w["w"])  # what the runner's copy_ does from fp32
    assert torch.equal(got["w"], engine_side)


def test_files_roundtrip_keeps_the_newest_two(tmp_path):
    t = FileWeights(tmp_path)
    for v in (1, 2, 3):
        t.publish(_tensors(float(v)), v)
    assert sorted(p.name for p in tmp_path.glob("v*.safetensors")) == ["v2.safetensors", "v3.safetensors"]
    got, version = t.fetch(1)
    assert version == 3 and all(torch.equal(got[k], _tensors(3.0)[k]) for k in got)
    assert FileWeights(tmp_path).fetch(3) is None
    assert not list(tmp_path.glob(".*tmp"))


def _reader(t: SharedMemoryWeights, last: int, out) -> None:
    """Fetch until `last`; every version seen must be whole (all tensors from one publish)."""
    have, seen = -1, []
    while have < last:
        got = t.fetch(have)
        if got is None:
            continue
        tensors, have = got
        vals = {float(tensors["a.weight"][0, 0]), float(tensors["a.weight"][-1, -1]), -float(tensors["b.bias"][3]),
                float(tensors["steps"][0])}
        seen.append((have, vals))
    out.put(seen)


def test_shared_memory_readers_in_another_process_never_see_a_torn_version():
    ctx = mp.get_context("spawn")
    t = SharedMemoryWeights(_tensors(0.0))
    t.publish(_tensors(0.0), 0)
    out = ctx.Queue()
    p = ctx.Process(target=_reader, args=(t, 40, out))
    p.start()
    for v in range(1, 41):
        t.publish(_tensors(float(v)), v)
    seen = out.get(timeout=DEADLINE_S)  # a spawned process imports torch first: slow on a loaded machine
    p.join(timeout=30)
    assert seen and seen[-1][0] == 40
    for version, vals in seen:
        assert vals == {float(version)}, (version, vals)
    assert t.stats.publishes == 41 and t.stats.bytes_published == 41 * ((64 * 32 + 7) * 4 + 8)


def _copy_forever(t: SharedMemoryWeights, started) -> None:
    t.fetch(-1)
    started.set()  # copying back to back from here on: a kill at any moment lands in (or between) copies
    while True:
        t.fetch(-1)


def test_a_reader_killed_mid_copy_never_blocks_the_writer():
    """The seqlock shares no lock with readers: SIGKILL a process while it copies, publish on."""
    import os
    import signal
    import threading

    ctx = mp.get_context("spawn")
    big = {"w": torch.zeros(4096, 1024)}
    t = SharedMemoryWeights(big)
    t.publish(big, 0)
    started = ctx.Event()
    p = ctx.Process(target=_copy_forever, args=(t, started))
    p.start()
    assert started.wait(DEADLINE_S)
    os.kill(p.pid, signal.SIGKILL)
    p.join(DEADLINE_S)
    writer = threading.Thread(target=lambda: [t.publish({"w": torch.full((4096, 1024), float(v))}, v) for v in range(1, 4)], daemon=True)
    writer.start()
    writer.join(DEADLINE_S)  # bounds a hang only: a writer waiting on the dead reader would never finish
    assert not writer.is_alive(), "a publish blocked on the killed reader"
    got, version = t.fetch(0)
    assert version == 3 and torch.equal(got["w"], torch.full((4096, 1024), 3.0))
