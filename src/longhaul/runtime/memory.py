"""Where a training process's resident memory goes, measured: `Breakdown`.

Owns the accounting, not the memory: it reads tensors the trainer and the sampler already hold,
the C allocator's own counters (glibc's `mallinfo2`, jemalloc's statistics) and the kernel's (`/proc/self/status`).

Parts, each counted once (a storage shared by two holders goes to the first in this order):
- weights: the policy's parameters and buffers;
- gradients: the `.grad` of those parameters that have one now;
- optimizer: the optimizer's state (Adam's two moments);
- reference: a frozen reference model's weights;
- sampler: the rollout engine's own weight copy;
- kv_pool: the engine's paged KV cache, its pages in memory (after `LLMEngine.sleep`, only
  those written since);
- activations: rollout activations kept for the training forward (`RolloutActivations`);
- heap_other: the rest of the C heap in use (Python objects, tokenizers, tensors held elsewhere);
- allocator_free: heap the allocator holds free for reuse (a step's activations and logits
  after it ended: longhaul keeps freed memory, `longhaul.malloc`), at most what the other parts
  leave of the resident figure: free chunks whose pages were handed back (`bound_free_heap`)
  stay in the allocator's count but are not resident;
- files: mapped files (shared libraries, the model file) and shared memory.
`resident` is the kernel's VmRSS, `peak` its VmHWM; `unaccounted` is resident minus the
parts: memory outside the C heap that no part names (Python's object arenas, thread stacks,
libraries' static data: a fixed one or two hundred MB), less free heap the kernel has not paged in.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from longhaul.malloc import allocator, heap as malloc_heap, resident_bytes

PARTS = ("weights", "gradients", "optimizer", "reference", "sampler", "kv_pool", "activations",
         "heap_other", "allocator_free", "files")


def _tensors(obj, depth: int = 4, seen: set | None = None):
    """Every tensor reachable from `obj` through modules, containers and attributes, `depth` deep."""
    seen = set() if seen is None else seen
    if obj is None or id(obj) in seen or isinstance(obj, (str, bytes, int, float, bool)):
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
        return
    if isinstance(obj, torch.nn.Module):
        yield from obj.parameters()
        yield from obj.buffers()
        return
    if depth <= 0:
        return
    if isinstance(obj, dict):
        items = obj.values()
    elif isinstance(obj, (list, tuple, set)):
        items = obj
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith(("longhaul", "torch.optim")):
        items = vars(obj).values()  # longhaul's own objects and torch's optimizers; not tokenizers or libraries
    else:
        return
    for item in items:
        yield from _tensors(item, depth - 1, seen)


def _storage_bytes(tensors, counted: set[int], resident: bool = False) -> int:
    """Bytes of the storages behind `tensors` not yet in `counted` (which this extends); with
    `resident`, only their pages in memory now (a sleeping engine's KV pool holds few)."""
    total = 0
    for t in tensors:
        if t.device.type != "cpu" or t.is_meta:
            continue
        if t.is_mkldnn:  # oneDNN's packed weights (`ops.linear.PackedLinear`) hide their storage
            if id(t) not in counted:
                counted.add(id(t))
                total += t.numel() * t.element_size()
            continue
        s = t.untyped_storage()
        key = s.data_ptr()
        if key and key not in counted:
            counted.add(key)
            total += resident_bytes(key, s.nbytes()) if resident else s.nbytes()
    return total


def _status() -> dict[str, int]:
    """The memory lines of /proc/self/status, in bytes."""
    out = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, rest = line.partition(":")
                if key.startswith(("Vm", "Rss")) and rest.strip().endswith("kB"):
                    out[key] = int(rest.split()[0]) * 1024
    except OSError:
        pass
    return out


@dataclass
class Breakdown:
    parts: dict[str, int] = field(default_factory=dict)
    resident: int = 0
    peak: int = 0

    @property
    def unaccounted(self) -> int:
        return self.resident - sum(self.parts.values())

    def metrics(self, prefix: str = "memory/") -> dict[str, float]:
        """The figures in GB, for metrics.jsonl."""
        gb = {**self.parts, "resident": self.resident, "peak": self.peak, "unaccounted": self.unaccounted}
        return {f"{prefix}{k}_gb": round(v / 1e9, 4) for k, v in gb.items()}

    def table(self) -> str:
        """One line: each part that holds memory, then resident and peak."""
        held = [f"{k} {v / 1e9:.2f}" for k, v in self.parts.items() if v >= 5e6]
        return (f"memory (GB): {', '.join(held)}; resident {self.resident / 1e9:.2f} "
                f"(unaccounted {self.unaccounted / 1e9:+.2f}), peak {self.peak / 1e9:.2f}; allocator {allocator()}")


def measure(policy=None, trainer=None, sampler=None) -> Breakdown:
    """This process's memory by part: `policy` (an nn.Module), `trainer` (whatever holds the
    optimizer and a reference as `.optimizer` / `.ref`), `sampler` (an `LLMEngine`, or an HF
    model used as one)."""
    counted: set[int] = set()
    parts = dict.fromkeys(PARTS, 0)
    absent = 0
    params = list(policy.parameters()) if policy is not None else []
    parts["weights"] = _storage_bytes([*params, *(policy.buffers() if policy is not None else [])], counted)
    parts["gradients"] = _storage_bytes([p.grad for p in params if p.grad is not None], counted)
    if trainer is not None:
        parts["optimizer"] = _storage_bytes(_tensors(getattr(trainer, "optimizer", None)), counted)
        parts["reference"] = _storage_bytes(_tensors(getattr(trainer, "ref", None)), counted)
    if sampler is not None:
        runner = getattr(sampler, "runner", None)
        if runner is not None:  # the paged engine
            recorder = getattr(runner, "recorder", None)
            pool = list(_tensors(getattr(sampler, "kv", None)))
            before = set(counted)
            parts["kv_pool"] = _storage_bytes(pool, counted, resident=True)
            absent = _storage_bytes(pool, before) - parts["kv_pool"]  # in the heap's use, not in memory
            parts["activations"] = _storage_bytes(_tensors(recorder), counted)
            parts["sampler"] = _storage_bytes(_tensors({k: v for k, v in vars(runner).items() if k != "recorder"}), counted)
        else:
            parts["sampler"] = _storage_bytes(_tensors(sampler), counted)
    heap = malloc_heap()
    st = _status()
    parts["files"] = st.get("RssFile", 0) + st.get("RssShmem", 0)
    if heap is not None:
        in_use, free = heap
        parts["heap_other"] = max(0, in_use - absent - sum(parts.values()) + parts["files"])
        parts["allocator_free"] = min(free, max(0, st.get("VmRSS", 0) - sum(parts.values())))
    return Breakdown(parts, st.get("VmRSS", 0), st.get("VmHWM", 0))
