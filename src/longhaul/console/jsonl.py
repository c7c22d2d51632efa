"""Append-only JSONL files read as they grow: `metrics.jsonl`, episode files, `buffer.jsonl`.

`JsonlFile` keeps the byte offset of every complete line and, on `refresh()`, reads only the
bytes written since; a line still being written (no newline yet) waits for the next refresh.
A file replaced or shortened (a resumed run rewrites `metrics.jsonl`; an evaluation replaces its
episodes file) is indexed again from the start, and `refresh()` says so. `JsonlCache` holds one
per path, so every request after the first costs only what was appended.

Owns reading lines and parsing them (a corrupt line is a warning naming it, never an
exception); not what the rows mean.
"""

from __future__ import annotations

import json
import math
import os
import threading
from collections import OrderedDict
from pathlib import Path


class JsonlFile:
    def __init__(self, path: Path):
        self.path = path
        self.lock = threading.Lock()  # requests run in a thread pool
        self._starts: list[int] = []  # byte offset of each complete line
        self._end = 0  # offset just past the last complete line
        self._inode: int | None = None
        self.generation = 0  # counts the times indexing started over, for caches built on the lines

    def __len__(self) -> int:
        return len(self._starts)

    def refresh(self) -> bool:
        """Index lines appended since the last call; True when the file was replaced or cut and
        indexing started over. Raises FileNotFoundError when the file is gone."""
        st = os.stat(self.path)
        reset = self._inode is not None and (st.st_ino != self._inode or st.st_size < self._end)
        if reset or self._inode is None:
            self._starts, self._end, self._inode = [], 0, st.st_ino
            self.generation += 1
        if st.st_size > self._end:
            with open(self.path, "rb") as f:
                f.seek(self._end)
                chunk = f.read(st.st_size - self._end)
            pos = 0
            while (nl := chunk.find(b"\n", pos)) >= 0:
                self._starts.append(self._end + pos)
                pos = nl + 1
            self._end += pos
        return reset

    def lines(self, first: int, last: int) -> list[bytes]:
        """Complete lines first..last-1 (0-based) as bytes, without their newlines."""
        last = min(last, len(self._starts))
        if first >= last:
            return []
        stop = self._starts[last] if last < len(self._starts) else self._end
        with open(self.path, "rb") as f:
            f.seek(self._starts[first])
            return f.read(stop - self._starts[first]).split(b"\n")[: last - first]


def parse_lines(lines: list[bytes], first: int, name: str, numbered: bool = False) -> tuple[list[tuple[int, dict]], list]:
    """(1-based line number, object) of each line that is a JSON object, and one warning per line
    that is not (blank lines are skipped silently); `numbered`: each warning as (line, warning)."""
    rows, warnings = [], []
    for n, raw in enumerate(lines, start=first + 1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            warnings.append((n, f"{name} line {n} is not valid JSON ({getattr(e, 'msg', e)}); skipped it"))
            continue
        if not isinstance(obj, dict):
            warnings.append((n, f"{name} line {n} is not a JSON object; skipped it"))
            continue
        if b"NaN" in raw or b"Infinity" in raw:  # Python's json writes them; JSON itself has no such values
            bad: list[str] = []
            obj = _finite(obj, "", bad)
            if bad:
                warnings.append((n, f"{name} line {n}: not a finite number: {', '.join(bad)}; shown as missing"))
        rows.append((n, obj))
    return rows, warnings if numbered else [w for _, w in warnings]


def _finite(v, key: str, bad: list[str]):
    """v with every NaN or infinity replaced by None, the keys (or paths) that held one added to `bad`."""
    if isinstance(v, float) and not math.isfinite(v):
        bad.append(f"{key or 'the value'} ({v})")
        return None
    if isinstance(v, dict):
        return {k: _finite(x, f"{key}.{k}" if key else str(k), bad) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x, f"{key}[{i}]", bad) for i, x in enumerate(v)]
    return v


class Derived:
    """State built from a file's lines (an index, columns), kept for the `size` files read last and
    built again when the file was rewritten: each item carries the `generation` it was built from."""

    def __init__(self, size: int):
        self.size = size
        self._items: OrderedDict[Path, object] = OrderedDict()

    def get(self, f: JsonlFile, make) -> tuple[object, bool]:
        """(f's item, whether an older one was dropped because f was rewritten); `make(generation)`
        builds a new item. Call it under `f.lock`, after `f.refresh()`."""
        item = self._items.pop(f.path, None)
        stale = item is not None and item.generation != f.generation
        if item is None or stale:
            item = make(f.generation)
        self._items[f.path] = item  # the most recently read last
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return item, stale


class JsonlCache:
    """One JsonlFile per path, for the life of the app."""

    def __init__(self):
        self._files: dict[Path, JsonlFile] = {}
        self._lock = threading.Lock()

    def get(self, path: Path) -> JsonlFile:
        with self._lock:
            return self._files.setdefault(path, JsonlFile(path))

    def drop(self, path: Path) -> None:
        with self._lock:
            self._files.pop(path, None)
