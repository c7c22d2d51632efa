"""Weight sync: how a new policy version travels from the trainer to the rollout workers.

Three local transports, one interface: the trainer calls `publish(tensors, version)`; a worker
calls `fetch(have)` and gets `(tensors, version)` when something newer than `have` is there.
Each transport counts the seconds and bytes it moves (`stats`).

- `InProcessWeights`: workers are threads of the trainer's process; `publish` takes a copy (the
  trainer keeps updating its tensors in place) and `fetch` hands out that copy.
- `SharedMemoryWeights`: workers are child processes; two slots of shared-memory tensors are
  allocated once; `publish` writes the slot that is not current and then flips; a per-slot
  sequence number (a seqlock, no lock shared with readers) lets a reader discard a copy the
  writer touched, so it never keeps a half-written version.
- `FileWeights`: any process that sees the directory; one safetensors file per version, written
  to a temp name and renamed, read back by mmap; the newest two are kept.

Tensors are sent in `dtype` (the rollout engine's): rounding fp32 to bf16 here or in the engine
gives the same bits, and bf16 halves the bytes. The Ray object store transport lives in the Ray
backend (`runtime.ray_backend`). Not owned here: merging LoRA adapters (`inference.sync_weights`
does that before publishing).
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass
class SyncStats:
    publishes: int = 0
    fetches: int = 0
    bytes_published: int = 0
    bytes_fetched: int = 0
    publish_s: float = 0.0
    fetch_s: float = 0.0
    last_publish_s: float = 0.0
    last_fetch_s: float = 0.0

    def published(self, nbytes: int, seconds: float) -> None:
        self.publishes += 1
        self.bytes_published += nbytes
        self.publish_s += seconds
        self.last_publish_s = seconds

    def fetched(self, nbytes: int, seconds: float) -> None:
        self.fetches += 1
        self.bytes_fetched += nbytes
        self.fetch_s += seconds
        self.last_fetch_s = seconds


def nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def _cast(tensors: dict[str, torch.Tensor], dtype: torch.dtype | None) -> dict[str, torch.Tensor]:
    """Contiguous copies that the trainer's later in-place updates cannot touch; floating tensors
    in `dtype` (None keeps theirs)."""
    return {k: t.detach().to(dtype if dtype is not None and t.is_floating_point() else t.dtype, copy=True).contiguous()
            for k, t in tensors.items()}


class InProcessWeights:
    kind = "inprocess"

    def __init__(self, dtype: torch.dtype | None = None):
        self.dtype, self.stats = dtype, SyncStats()
        self._lock = threading.Lock()
        self._tensors: dict[str, torch.Tensor] | None = None
        self.version = -1

    def publish(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        copy = _cast(tensors, self.dtype)
        with self._lock:
            self._tensors, self.version = copy, int(version)
        self.stats.published(nbytes(copy), time.perf_counter() - t0)

    def fetch(self, have: int) -> tuple[dict[str, torch.Tensor], int] | None:
        with self._lock:
            if self._tensors is None or self.version <= have:
                return None
            tensors, version = self._tensors, self.version
        self.stats.fetched(nbytes(tensors), 0.0)  # handing over a reference moves nothing
        return tensors, version

    def latest(self) -> int:
        return self.version


class SharedMemoryWeights:
    """Create it in the trainer's process with the tensors' layout, pass it to child processes
    (torch.multiprocessing sends the shared storages by file descriptor), publish there, fetch here.

    No lock is shared with the readers (a reader killed while holding one would block every later
    publish): each slot carries a sequence number, odd while it is being written (a seqlock). A
    reader copies the current slot and keeps the copy only if that slot's number was even and
    unchanged around the copy; else it tries again."""
    kind = "shm"

    def __init__(self, like: dict[str, torch.Tensor], dtype: torch.dtype | None = None):
        self.dtype, self.stats = dtype, SyncStats()
        spec = {k: (t.shape, dtype if dtype is not None and t.is_floating_point() else t.dtype) for k, t in like.items()}
        self._slots = [{k: torch.empty(s, dtype=d).share_memory_() for k, (s, d) in spec.items()} for _ in range(2)]
        # [version * 2 + current slot (one 8-byte store, so never half-updated), seq of slot 0, seq of slot 1]; -1: none yet
        self._meta = torch.tensor([-1, 0, 0], dtype=torch.int64).share_memory_()

    def publish(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        t0 = time.perf_counter()
        packed = int(self._meta[0])
        nxt = 1 - (packed & 1) if packed >= 0 else 0
        slot = self._slots[nxt]
        missing = set(slot) - set(tensors)
        if missing:
            raise KeyError(f"published weights lack {sorted(missing)[:3]}; publish the same tensors the buffer was made for")
        self._meta[1 + nxt] += 1  # odd: being written
        with torch.no_grad():
            for k, dst in slot.items():
                dst.copy_(tensors[k])
        self._meta[1 + nxt] += 1  # even: whole
        self._meta[0] = int(version) * 2 + nxt  # readers that look from now on take this slot
        self.stats.published(nbytes(slot), time.perf_counter() - t0)

    def fetch(self, have: int, tries: int = 100) -> tuple[dict[str, torch.Tensor], int] | None:
        t0 = time.perf_counter()
        for _ in range(tries):
            packed = int(self._meta[0])
            if packed < 0 or packed >> 1 <= have:
                return None
            version, cur = packed >> 1, packed & 1
            seq = int(self._meta[1 + cur])
            if seq % 2 == 0:
                tensors = {k: v.clone() for k, v in self._slots[cur].items()}
                if int(self._meta[1 + cur]) == seq:  # nobody wrote this slot while we copied it
                    self.stats.fetched(nbytes(tensors), time.perf_counter() - t0)
                    return tensors, version
            time.sleep(0.001)
        return None  # a writer kept the slot busy; the next fetch tries again

    def latest(self) -> int:
        packed = int(self._meta[0])
        return packed >> 1 if packed >= 0 else -1


class FileWeights:
    kind = "files"

    def __init__(self, directory: str | Path, dtype: torch.dtype | None = None, keep: int = 2):
        self.dir, self.dtype, self.keep, self.stats = Path(directory), dtype, keep, SyncStats()
        self.dir.mkdir(parents=True, exist_ok=True)

    def publish(self, tensors: dict[str, torch.Tensor], version: int) -> None:
        from safetensors.torch import save_file

        t0 = time.perf_counter()
        data = _cast(tensors, self.dtype)
        final = self.dir / f"v{int(version)}.safetensors"
        tmp = self.dir / f".v{int(version)}.safetensors.tmp"
        save_file(data, str(tmp))
        os.replace(tmp, final)
        latest_tmp = self.dir / ".LATEST.tmp"
        latest_tmp.write_text(str(int(version)))
        os.replace(latest_tmp, self.dir / "LATEST")
        for old in sorted(self.dir.glob("v*.safetensors"), key=lambda p: int(p.stem[1:]))[:-self.keep]:
            old.unlink(missing_ok=True)
        self.stats.published(nbytes(data), time.perf_counter() - t0)

    def latest(self) -> int:
        try:
            return int((self.dir / "LATEST").read_text())
        except (FileNotFoundError, ValueError):
            return -1

    def fetch(self, have: int) -> tuple[dict[str, torch.Tensor], int] | None:
        from safetensors import safe_open

        version = self.latest()
        if version <= have:
            return None
        t0 = time.perf_counter()
        try:
            with safe_open(str(self.dir / f"v{version}.safetensors"), framework="pt") as f:  # mmap
                tensors = {k: f.get_tensor(k) for k in f.keys()}
        except FileNotFoundError:  # rotated away between reading LATEST and opening: the next fetch gets the newer one
            return None
        self.stats.fetched(nbytes(tensors), time.perf_counter() - t0)
        return tensors, version


TRANSPORTS = {"inprocess": InProcessWeights, "shm": SharedMemoryWeights, "files": FileWeights}
