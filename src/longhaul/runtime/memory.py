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
- heap_other: the rest of the C heap in use (Python objects, tokenizers, tensors held elsewhere),
  at most what the resident figure leaves once the parts above are counted;
- allocator_free: heap the allocator holds free for reuse (a step's activations and logits
  after it ended: longhaul keeps freed memory, `longhaul.malloc`), at most what the other parts
  leave of the resident figure: free chunks whose pages were handed back (`bound_free_heap`)
  stay in the allocator's count but are not resident;
- files: mapped files (shared libraries) and shared memory, less the pages of mapped weights
  that a part above already counts (a model's safetensors mapped rather than read: its pages
  still the file's are in the kernel's RssFile, those written since in RssAnon).
`resident` is the kernel's VmRSS, `peak` its VmHWM; `unaccounted` is resident minus the
parts: memory outside the C heap that no part names (Python's object arenas, thread stacks,
libraries' static data: a fixed one or two hundred MB), less free heap the kernel has not paged in.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field

import torch

from longhaul.malloc import allocator, heap as malloc_heap, resident_bytes

PARTS = ("weights", "gradients", "optimizer", "reference", "sampler", "kv_pool", "activations",
         "heap_other", "allocator_free", "files")


def _tensors(obj, depth: int = 4, seen: dict | None = None):
    """Every tensor reachable from `obj` through modules, containers and attributes, `depth` deep
    (an object met again is walked again only when more depth is left than the first time, so a
    shallow path to it cannot hide what a deeper one reaches)."""
    seen = {} if seen is None else seen
    if obj is None or seen.get(id(obj), -1) >= depth or isinstance(obj, (str, bytes, int, float, bool)):
        return
    seen[id(obj)] = depth
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


def _file_mappings() -> list[tuple[int, int, int]]:
    """This process's file-backed mappings of at least 1 MB, sorted: (start, end, bytes of their
    pages resident and still the file's, i.e. not written since: counted in RssFile/RssShmem)."""
    out, cur = [], None
    try:
        with open("/proc/self/smaps") as f:
            for line in f:
                head = line.split(None, 6)
                if len(head) >= 5 and "-" in head[0] and len(head[1]) == 4:  # a mapping's first line
                    a, _, b = head[0].partition("-")
                    start, end = int(a, 16), int(b, 16)
                    cur = [start, end, 0, 0] if head[4] != "0" and end - start >= 1 << 20 else None
                    if cur is not None:
                        out.append(cur)
                elif cur is not None and head[0] in ("Rss:", "Anonymous:"):
                    cur[2 if head[0] == "Rss:" else 3] = int(head[1]) * 1024
    except OSError:
        return []
    return sorted((start, end, max(0, rss - anon)) for start, end, rss, anon in out)


class _Census:
    """The storages counted so far, each once, and where they live: in a file's private or shared
    mapping (a model's safetensors mapped rather than read; shared-memory weights), or elsewhere
    (the C heap, buffers a library mapped)."""

    def __init__(self):
        self.counted: set[int] = set()
        self.maps = _file_mappings()
        self._starts = [m[0] for m in self.maps]
        self.in_maps: set[int] = set()  # indices of mappings that hold a counted storage
        self.heap = 0  # bytes counted outside file mappings
        self.absent = 0  # bytes of those counted by their resident pages that are not resident

    def _mapping(self, address: int) -> int | None:
        i = bisect.bisect_right(self._starts, address) - 1
        return i if i >= 0 and address < self.maps[i][1] else None

    def add(self, tensors, resident: bool = False) -> int:
        """Bytes of the storages behind `tensors` not yet counted; with `resident`, only their
        pages in memory now (a sleeping engine's KV pool holds few)."""
        total = 0
        for t in tensors:
            if t.device.type != "cpu" or t.is_meta:
                continue
            if t.is_mkldnn:  # oneDNN's packed weights (`ops.linear.PackedLinear`) hide their storage
                if id(t) not in self.counted:
                    self.counted.add(id(t))
                    total += t.numel() * t.element_size()
                    self.heap += t.numel() * t.element_size()
                continue
            st = t.untyped_storage()
            key, size = st.data_ptr(), st.nbytes()
            if not key or key in self.counted:
                continue
            self.counted.add(key)
            m = self._mapping(key)
            if m is not None:  # all its bytes: a page not yet read in is read at the first forward
                self.in_maps.add(m)
                total += size
                continue
            n = resident_bytes(key, size) if resident else size
            self.heap += n
            self.absent += size - n
            total += n
        return total

    def clean_mapped(self) -> int:
        """Resident bytes of the mappings holding counted storages that RssFile/RssShmem count too."""
        return sum(self.maps[i][2] for i in self.in_maps)


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
    census = _Census()
    parts = dict.fromkeys(PARTS, 0)
    params = list(policy.parameters()) if policy is not None else []
    parts["weights"] = census.add([*params, *(policy.buffers() if policy is not None else [])])
    parts["gradients"] = census.add([p.grad for p in params if p.grad is not None])
    if trainer is not None:
        parts["optimizer"] = census.add(_tensors(getattr(trainer, "optimizer", None)))
        parts["reference"] = census.add(_tensors(getattr(trainer, "ref", None)))
    if sampler is not None:
        runner = getattr(sampler, "runner", None)
        if runner is not None:  # the paged engine
            recorder = getattr(runner, "recorder", None)
            parts["kv_pool"] = census.add(_tensors(getattr(sampler, "kv", None)), resident=True)
            parts["activations"] = census.add(_tensors(recorder))
            parts["sampler"] = census.add(_tensors({k: v for k, v in vars(runner).items() if k != "recorder"}))
        else:
            parts["sampler"] = census.add(_tensors(sampler))
    heap = malloc_heap()
    st = _status()
    # mapped files' pages, less those of the mapped weights already counted in their parts
    parts["files"] = max(0, st.get("RssFile", 0) + st.get("RssShmem", 0) - census.clean_mapped())
    if heap is not None:
        in_use, free = heap
        # the heap in use holds the storages counted outside file mappings (all their bytes,
        # resident or not) and what no part names, of which at most what the resident figure
        # leaves is in memory (buffers allocated but never touched, or discarded, are not)
        rss_left = st.get("VmRSS", 0) - sum(parts.values())
        parts["heap_other"] = max(0, min(in_use - census.heap - census.absent, rss_left))
        parts["allocator_free"] = min(free, max(0, st.get("VmRSS", 0) - sum(parts.values())))
    return Breakdown(parts, st.get("VmRSS", 0), st.get("VmHWM", 0))
