"""Packed weights on transparent huge pages.

A decode step streams every weight once. On 4 KiB pages each page costs a TLB walk and the
hardware prefetchers stop at its end; the native kernels' packed weights therefore live in
anonymous memory advised `MADV_HUGEPAGE`, which the kernel backs with 2 MiB pages where its
transparent-huge-page setting is `madvise` or `always` (with `never` the advice is ignored and
nothing changes). `LONGHAUL_HUGEPAGES=0` keeps ordinary pages.
"""

from __future__ import annotations

import mmap
import os

import torch

from longhaul.errors import LonghaulError

HUGE_PAGE = 2 << 20
MIN_BYTES = 1 << 20  # smaller tensors stay where they are: a huge page would be mostly empty


def enabled() -> bool:
    value = os.environ.get("LONGHAUL_HUGEPAGES", "1")
    if value not in ("0", "1"):
        raise LonghaulError(f"LONGHAUL_HUGEPAGES must be 0 or 1, not {value!r}: unset it, or set 0 to keep "
                            "the weights on ordinary pages")
    return value == "1" and hasattr(mmap, "MADV_HUGEPAGE")


def on_huge_pages(t: torch.Tensor) -> torch.Tensor:
    """A contiguous copy of CPU tensor `t` in memory advised for huge pages, starting on a huge-page
    boundary, or `t` itself when it is small, not on the CPU, or huge pages are off. The copy
    keeps its mapping alive for as long as any view of it lives."""
    nbytes = t.numel() * t.element_size()
    if t.device.type != "cpu" or nbytes < MIN_BYTES or t.is_sparse or not enabled():
        return t
    size = -(-nbytes // HUGE_PAGE) * HUGE_PAGE + HUGE_PAGE  # room to start on a boundary
    mapping = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    try:
        mapping.madvise(mmap.MADV_HUGEPAGE)
    except OSError:  # a kernel without transparent huge pages
        mapping.close()
        return t
    raw = torch.frombuffer(mapping, dtype=torch.uint8)  # the tensor's storage holds the mapping
    start = -raw.data_ptr() % HUGE_PAGE
    out = raw[start:start + nbytes].view(t.dtype).view(t.shape)
    out.copy_(t)
    return out
