"""Context-parallel attention (`longhaul.rl.context_parallel`) against plain attention over the
whole row in fp64: 2, 3 and 4 gloo ranks, ring and Ulysses, causal and packed rows (documents, and
prompts shared by several completions), MHA and GQA;
the output, the log-sum-exp and dq / dk / dv (the loss reaches both out and lse), each block
whole and in tiles of a few query rows. The zigzag
layout helpers, and the one-line errors for shapes the world size does not divide."""

import math
import socket

import pytest
import torch
import torch.multiprocessing as mp

from longhaul.errors import LonghaulError
from longhaul.rl.context_parallel import blocks
from longhaul.rl.context_parallel import (CONTEXT_ATTENTION, document_positions, mask_ids, zigzag_gather, zigzag_positions,
                                          zigzag_shard, zigzag_unshard)
from tests.rl.test_distributed import _gloo_group, _started

B, HQ, T, D = 2, 12, 48, 8  # 48 tokens: 2N equal zigzag chunks for N = 2, 3 and 4; 12 heads divide by each
DOCS = ((5, 17, 1, 13, 12), (20, 28))  # document lengths of each packed row: they cross chunk and rank boundaries
# shared prompts: which document each document also sees (-1: none): row 0 a prompt of 5 tokens with
# completions of 17 and 1, then a prompt of 13 with one of 12; row 1 a prompt of 20 with one of 28
SEEN = ((-1, 0, 0, -1, 3), (-1, 0))
CASES = {"causal": (12, None), "causal gqa": (3, None), "packed": (12, "docs"), "packed gqa": (4, "docs"),
         "shared prompts": (4, "shared")}  # (Hkv, layout)
# fp32 shards against the fp64 whole row (measured: at most 2.4e-6). Ulysses repeats K/V heads N does not
# divide: Hkv = 3 on 2 and 4 ranks, Hkv = 4 on 3 ranks
TOL = {"out": 1e-5, "lse": 1e-5, "dq": 3e-5, "dk": 3e-5, "dv": 3e-5}


def _inputs(hkv: int, layout: str | None):
    """q (B, HQ, T, D), k, v (B, hkv, T, D), mask ids (B, T) or None, and the loss's weights on out and lse."""
    g = torch.Generator().manual_seed(hkv * 2 + (layout is not None))
    q, k, v, dout = (torch.randn(B, h, T, D, generator=g) for h in (HQ, hkv, hkv, HQ))
    doc = None
    if layout is not None:
        doc = torch.stack([torch.repeat_interleave(torch.arange(len(n)), torch.tensor(n)) for n in DOCS])
        if layout == "shared":
            doc = mask_ids(doc, torch.stack([torch.tensor(seen)[d] for seen, d in zip(SEEN, doc)]))
    return q, k, v, doc, dout, torch.randn(B, HQ, T, generator=g)


def _sees(doc: torch.Tensor) -> torch.Tensor:
    """(B, T, T) which key each query's document sees besides its own, from the test's own tables."""
    own = doc % blocks.SEES
    seen = torch.stack([torch.tensor(s)[d] for s, d in zip(SEEN, own)]) if (doc >= blocks.SEES).any() else torch.full_like(own, -1)
    return seen[:, :, None] == own[:, None, :]


def _reference(q, k, v, doc, dout, dlse) -> dict:
    """Plain softmax attention over the whole row in fp64, K/V heads repeated, and its gradients."""
    q, k, v = (t.double().requires_grad_() for t in (q, k, v))
    g = HQ // k.shape[1]
    s = q @ k.repeat_interleave(g, 1).transpose(-1, -2) / math.sqrt(D)  # (B, HQ, T, T)
    pos = torch.arange(T)
    ok = (pos[None, :] <= pos[:, None])[None, None]
    if doc is not None:
        ok = ok & ((doc[:, :, None] == doc[:, None, :]) | _sees(doc))[:, None]
    s = s.masked_fill(~ok, float("-inf"))
    lse = s.logsumexp(-1)
    out = s.softmax(-1) @ v.repeat_interleave(g, 1)
    ((out * dout.double()).sum() + (lse * dlse.double()).sum()).backward()
    return {"out": out, "lse": lse, "dq": q.grad, "dk": k.grad, "dv": v.grad}


def _parallel(attend, rank: int, world: int, q, k, v, doc, dout, dlse) -> dict:
    """This rank's shard through `attend` and back; the results gathered whole onto every rank."""
    def cut(t, dim):
        return zigzag_shard(t, rank, world, dim)

    qs, ks, vs = (cut(t, -2).requires_grad_() for t in (q, k, v))
    out, lse = attend(qs, ks, vs, None if doc is None else cut(doc, -1))
    ((out * cut(dout, -2)).sum() + (lse * cut(dlse, -1)).sum()).backward()
    got = {"out": out, "lse": lse, "dq": qs.grad, "dk": ks.grad, "dv": vs.grad}
    return {name: zigzag_gather(t.detach(), -1 if name == "lse" else -2) for name, t in got.items()}


def _refusals(world: int) -> list[str]:
    """The errors for shards the world cannot take; both are raised before any message is sent."""
    said = []
    for attend, q, kv in [(CONTEXT_ATTENTION["ulysses"], torch.zeros(1, world + 1, 4, D), torch.zeros(1, 1, 4, D)),
                          (CONTEXT_ATTENTION["ring"], torch.zeros(1, 2, 3, D), torch.zeros(1, 2, 3, D))]:
        with pytest.raises(LonghaulError) as e:
            attend(q, kv, kv)
        said.append(str(e.value))
    return said


def _rank(rank: int, world: int, out) -> None:
    torch.set_num_threads(1)
    with _gloo_group(rank, world, "env://"):
        worst = {}
        for tile, label in ((blocks.TILE_SCORES, ""), (64, " tiled")):  # 64 scores: blocks of a few query rows a tile
            blocks.TILE_SCORES = tile
            for method, attend in CONTEXT_ATTENTION.items():
                for case, (hkv, layout) in CASES.items():
                    inputs = _inputs(hkv, layout)
                    got = _parallel(attend, rank, world, *inputs)
                    if rank == 0:
                        ref = _reference(*inputs)
                        worst[method + label, case] = {name: (got[name].double() - ref[name]).abs().max().item() for name in TOL}
        refusals = _refusals(world)
        if rank == 0:
            out.put((worst, refusals))
            out.close()
            out.join_thread()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ring_and_ulysses_equal_attention_over_the_whole_row(world, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(_free_port()))
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    worst, refusals = _started([ctx.Process(target=_rank, args=(r, world, out)) for r in range(world)], out, timeout=180)
    table = "\n".join(f"{m:14} {c:11} " + "  ".join(f"{n} {d:.2e}" for n, d in diffs.items())
                      for (m, c), diffs in worst.items())
    print(f"world {world}: max |parallel - fp64 reference|\n{table}")
    assert len(worst) == 4 * len(CASES)  # ring and Ulysses, whole blocks and tiled
    assert all(d < TOL[n] for diffs in worst.values() for n, d in diffs.items()), f"over {TOL}:\n{table}"
    assert refusals[0] == (f"Ulysses attention: {world + 1} query heads do not split over {world} ranks; use ring attention "
                           f"or a context-parallel size that divides {world + 1}")
    assert "pad each row to a multiple of" in refusals[1] and "\n" not in refusals[1]


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_zigzag_shards_balance_causal_work_and_gather_back(world):
    row = torch.arange(2 * T).view(2, T)
    shards = [zigzag_shard(row, r, world, -1) for r in range(world)]
    for r, s in enumerate(shards):
        assert torch.equal(s[0], zigzag_positions(T, r, world))
    assert torch.equal(zigzag_unshard(shards, -1), row)
    work = {int((s[0] + 1).sum()) for s in shards}  # keys a causal shard's queries see
    assert len(work) == 1, f"unequal causal work over ranks: {work}"


def test_document_positions_restart_at_each_document():
    doc = torch.tensor([[0, 0, 0, 1, 1, 2], [4, 4, 4, 4, 9, 9]])
    assert document_positions(doc).tolist() == [[0, 1, 2, 0, 1, 0], [0, 1, 2, 3, 0, 1]]


def test_a_row_that_does_not_split_into_zigzag_chunks_is_refused():
    with pytest.raises(LonghaulError, match=r"a row of 50 tokens does not split into 2 x 4 .* multiple of 8 tokens$"):
        zigzag_shard(torch.zeros(1, 50), 0, 4, -1)
