"""`pages.on_huge_pages`: packed weights copied into memory advised for transparent huge pages."""

import gc

import pytest
import torch

from longhaul.errors import LonghaulError
from longhaul.ops import pages
from longhaul.ops.linear import SmallBatchLinear


def test_a_large_tensor_is_copied_onto_a_huge_page_boundary_and_outlives_its_source(monkeypatch):
    monkeypatch.delenv("LONGHAUL_HUGEPAGES", raising=False)
    src = torch.randn(1024, 577, dtype=torch.float32)  # 2.3 MB, not a multiple of a page
    want = src.clone()
    got = pages.on_huge_pages(src)
    assert got.data_ptr() != src.data_ptr() and got.data_ptr() % pages.HUGE_PAGE == 0
    assert got.dtype == src.dtype and got.shape == src.shape and got.is_contiguous()
    del src
    gc.collect()
    assert torch.equal(got, want)  # the mapping lives as long as the tensor
    got.add_(1)  # and is writable
    assert torch.equal(got, want + 1)
    bf = pages.on_huge_pages(want.bfloat16())
    assert bf.dtype == torch.bfloat16 and torch.equal(bf, want.bfloat16())


def test_small_tensors_and_the_switch_off_keep_the_tensor(monkeypatch):
    small = torch.randn(64, 64)
    assert pages.on_huge_pages(small) is small
    big = torch.randn(1024, 1024)
    monkeypatch.setenv("LONGHAUL_HUGEPAGES", "0")
    assert pages.on_huge_pages(big) is big
    monkeypatch.setenv("LONGHAUL_HUGEPAGES", "yes")
    with pytest.raises(LonghaulError, match="LONGHAUL_HUGEPAGES must be 0 or 1"):
        pages.on_huge_pages(big)


def test_packed_decode_weights_live_on_huge_pages_and_compute_the_same(native, monkeypatch):
    w = torch.randn(1536, 576)
    x = torch.randn(3, 576)
    monkeypatch.setenv("LONGHAUL_HUGEPAGES", "0")
    plain = SmallBatchLinear(w, None, native)
    monkeypatch.setenv("LONGHAUL_HUGEPAGES", "1")
    huge = SmallBatchLinear(w, None, native)
    assert huge.weight.data_ptr() % pages.HUGE_PAGE == 0 and plain.weight.data_ptr() != huge.weight.data_ptr()
    assert torch.equal(huge(x), plain(x))
