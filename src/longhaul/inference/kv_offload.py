"""The KV offload tiers under the prefix cache: host memory, then disk.

Owns the K/V of full, cached blocks that the pool has evicted: a block handed out again by
the free queue (`block_manager`) is copied here first, keyed by its chain hash and checked by
its tokens, and a later sequence whose prefix runs past the pool's cached blocks takes the rest
from here into fresh pool blocks instead of computing it again. So an agent's next turn after
a long tool call, or a second request over the same long document, skips most of its prefill
even when other traffic has since filled the pool.

Tier 1 keeps copies in host memory up to `host_bytes`, least recently used out first; what
leaves it goes to tier 2, one file a block in a directory, up to `disk_bytes` (this
process's files, oldest out first). Files are safetensors written to a temporary name and
renamed, so a reader (this process, or another engine process pointed at the same directory
and namespace) never sees half a block. The namespace names the weights, dtype and block size
the K/V belongs to: engines that load the same weights share files; an engine whose weights
changed (`update_weights`) moves to a namespace of its own and drops both tiers.

Does not own which block is evicted or when (`block_manager`), or the pool (`kv_cache`). Chain
hashes are stable across processes (`block_manager.chain_hash`), so a file's name is its key.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
import weakref
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

import torch

from longhaul.errors import LonghaulError


@dataclass(frozen=True)
class Offloaded:
    """A prefix-cache hit held by a tier, not the pool: `allocate` brings it back."""
    hash: int
    token_ids: tuple[int, ...]
    tier: str  # "host" or "disk"


class KVOffload:
    def __init__(self, kv, host_bytes: int = 0, disk_dir: str | Path | None = None, disk_bytes: int = 0,
                 namespace: str | None = None):
        if host_bytes <= 0 and (disk_dir is None or disk_bytes <= 0):
            raise LonghaulError("the KV offload tier needs host memory (kv_offload_memory_gb > 0) or a disk directory "
                                "(kv_offload_dir with kv_offload_disk_gb > 0)")
        if not getattr(kv, "offloadable", False):
            raise LonghaulError(f"the KV offload tier copies whole blocks of a plain KV pool; {type(kv).__name__} "
                                f"stores codes per row: use kv_cache_dtype auto with kv offload")
        self.kv, self.host_bytes, self.disk_bytes = kv, int(host_bytes), int(disk_bytes)
        self.host: OrderedDict[int, tuple[tuple[int, ...], list[torch.Tensor]]] = OrderedDict()
        self.host_used = 0
        self.root = Path(disk_dir) if disk_dir is not None and disk_bytes > 0 else None
        self.files: OrderedDict[int, int] = OrderedDict()  # hash -> bytes, the files this process wrote
        self.disk_used = 0
        sample = kv.read_block(0)
        self.layout = [(t.shape, t.dtype) for t in sample]
        self.block_nbytes = sum(t.numel() * t.element_size() for t in sample)
        self.stores = self.host_hits = self.disk_hits = 0  # blocks
        self._private: list[Path] = []  # this object's own namespace directory, removed with it
        self._set_namespace(namespace)
        weakref.finalize(self, _remove, self._private)

    # ---- the tiers -------------------------------------------------------------------------
    def put(self, h: int, token_ids: tuple[int, ...], block_id: int) -> None:
        """Keep an evicted pool block's K/V (called before the block is reused)."""
        self.stores += 1
        data = self.kv.read_block(block_id)
        if self.host_bytes > 0:
            old = self.host.pop(h, None)
            if old is not None:
                self.host_used -= self.block_nbytes
            self.host[h] = (token_ids, data)
            self.host_used += self.block_nbytes
            while self.host_used > self.host_bytes and self.host:
                oh, (otok, odata) = self.host.popitem(last=False)
                self.host_used -= self.block_nbytes
                self._write(oh, otok, odata)
        else:
            self._write(h, token_ids, data)

    def find(self, h: int, token_ids: tuple[int, ...]) -> Offloaded | None:
        """Where the block of chain hash h with these tokens is held, if anywhere."""
        entry = self.host.get(h)
        if entry is not None and entry[0] == token_ids:
            return Offloaded(h, token_ids, "host")
        if self.dir is not None and self._path(h).exists():
            return Offloaded(h, token_ids, "disk")
        return None

    def fetch(self, hit: Offloaded) -> list[torch.Tensor] | None:
        """The K/V of a hit, or None if it has gone since `find` (another process's files)."""
        if hit.tier == "host":
            entry = self.host.get(hit.hash)
            if entry is None or entry[0] != hit.token_ids:
                return None
            self.host.move_to_end(hit.hash)
            self.host_hits += 1
            return entry[1]
        data = self._read(hit.hash, hit.token_ids)
        if data is not None:
            self.disk_hits += 1
            if hit.hash in self.files:
                self.files.move_to_end(hit.hash)
        return data

    def load(self, block_id: int, data: list[torch.Tensor]) -> None:
        self.kv.write_block(block_id, data)

    def flush(self, namespace: str | None = None) -> None:
        """Drop both tiers (the weights changed); later blocks go to `namespace` (None: a new
        private one, removed when this object goes)."""
        self.host.clear()
        self.host_used = 0
        _remove(self._private)
        self.files.clear()
        self.disk_used = 0
        self._set_namespace(namespace)

    @staticmethod
    def no_stats() -> dict[str, int]:
        return dict.fromkeys(("kv_offload_stores_total", "kv_offload_host_hits", "kv_offload_disk_hits",
                              "kv_offload_host_bytes", "kv_offload_disk_bytes"), 0)

    def stats(self) -> dict[str, int]:
        bs = self.kv.block_size
        return {"kv_offload_stores_total": self.stores, "kv_offload_host_hits": self.host_hits * bs,
                "kv_offload_disk_hits": self.disk_hits * bs, "kv_offload_host_bytes": self.host_used,
                "kv_offload_disk_bytes": self.disk_used}

    # ---- disk --------------------------------------------------------------------------------
    def _set_namespace(self, namespace: str | None) -> None:
        self.dir = None
        if self.root is None:
            return
        if namespace is None:
            namespace = f"private-{os.getpid()}-{uuid.uuid4().hex[:12]}"
            self._private.append(self.root / namespace)
        self.dir = self.root / namespace
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise LonghaulError(f"kv_offload_dir {str(self.root)!r} cannot hold the offload tier ({e.strerror}); "
                                f"pass a writable directory") from None

    def _path(self, h: int) -> Path:
        return self.dir / f"{h & (2**64 - 1):016x}.safetensors"

    def _write(self, h: int, token_ids: tuple[int, ...], data: list[torch.Tensor]) -> None:
        if self.dir is None or h in self.files:
            return
        from safetensors.torch import save_file

        path = self._path(h)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tensors = {f"t{i}": t.contiguous() for i, t in enumerate(data)}
        tensors["token_ids"] = torch.tensor(token_ids, dtype=torch.int64)
        try:
            save_file(tensors, str(tmp))
            os.replace(tmp, path)
        except OSError:  # a full disk loses a cached block, never a request
            tmp.unlink(missing_ok=True)
            return
        size = path.stat().st_size
        self.files[h] = size
        self.disk_used += size
        while self.disk_used > self.disk_bytes and self.files:
            oh, osize = self.files.popitem(last=False)
            self._path(oh).unlink(missing_ok=True)
            self.disk_used -= osize

    def _read(self, h: int, token_ids: tuple[int, ...]) -> list[torch.Tensor] | None:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            tensors = load_file(str(self._path(h)))
        except (OSError, SafetensorError):
            return None
        if tuple(tensors.pop("token_ids").tolist()) != token_ids:
            return None
        data = [tensors.get(f"t{i}") for i in range(len(self.layout))]
        if any(t is None or (t.shape, t.dtype) != want for t, want in zip(data, self.layout)):
            return None
        return data


def _remove(private: list[Path]) -> None:
    while private:
        shutil.rmtree(private.pop(), ignore_errors=True)


def weights_namespace(source: str, *parts) -> str:
    """A namespace for the K/V of weights loaded from `source` (a built-in name or a path), under
    the engine settings in `parts` (dtype, quantization, block size, ...): the same files, the
    same settings, the same namespace. A path's files enter by name, size and modification time."""
    h = hashlib.sha256(repr((source, parts)).encode())
    p = Path(source).expanduser()
    if p.exists():
        files = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in files:
            if f.is_file():
                st = f.stat()
                h.update(f"{f.relative_to(p) if p.is_dir() else f.name}|{st.st_size}|{st.st_mtime_ns}\n".encode())
    return h.hexdigest()[:24]
