"""Scheduler: token budget mixing decodes and prefill chunks, admission limits, preemption."""

from longhaul.inference.block_manager import BlockManager
from longhaul.inference.sampling import SamplingParams
from longhaul.inference.scheduler import Scheduler
from longhaul.inference.sequence import Sequence, Status


def seq(name: str, n_prompt: int, max_tokens: int = 100) -> Sequence:
    return Sequence(name, list(range(1, n_prompt + 1)), SamplingParams(max_tokens=max_tokens), set(), 0, 10_000)


def advance(batch) -> None:
    """What the engine does after a forward: tokens computed; a finished chunk samples one token."""
    for s, n in zip(batch.seqs, batch.num_new_tokens):
        s.num_computed_tokens += n
        if s.num_computed_tokens == s.num_tokens:
            s.token_ids.append(0)


def plan(batch) -> list[tuple[str, int]]:
    return [(s.request_id, n) for s, n in zip(batch.seqs, batch.num_new_tokens)]


def test_budget_mixes_decodes_with_a_chunked_prefill():
    sch = Scheduler(BlockManager(64, 4, enable_prefix_caching=False), max_num_seqs=8, max_num_batched_tokens=10)
    a, b = seq("a", 3), seq("b", 25)
    sch.add(a), sch.add(b)
    first = sch.schedule()
    assert plan(first) == [("a", 3), ("b", 7)]  # b's prompt is chunked to what is left
    advance(first)
    second = sch.schedule()
    assert plan(second) == [("a", 1), ("b", 9)]  # running first: a's decode, then b's next chunk
    advance(second)
    third = sch.schedule()
    assert plan(third) == [("a", 1), ("b", 9)]
    advance(third)
    assert b.num_computed_tokens == 25 and b.num_output_tokens == 1  # b sampled only at its prompt's end
    assert plan(sch.schedule()) == [("a", 1), ("b", 1)]


def test_max_num_seqs_caps_admission():
    sch = Scheduler(BlockManager(64, 4), max_num_seqs=2, max_num_batched_tokens=100)
    for i in range(3):
        sch.add(seq(str(i), 2))
    batch = sch.schedule()
    assert [s.request_id for s in batch.seqs] == ["0", "1"] and len(sch.waiting) == 1


def test_preemption_takes_the_latest_and_requeues_it_first():
    bm = BlockManager(4, 2, enable_prefix_caching=False)  # 8 slots
    sch = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    a, b, c = seq("a", 2), seq("b", 2), seq("c", 5)
    for s in (a, b, c):
        sch.add(s)
    batch = sch.schedule()
    assert plan(batch) == [("a", 2), ("b", 2)]  # c needs 3 blocks, 2 are free: it waits
    advance(batch)
    while not sch.num_preemptions_total:  # a and b grow to 5 tokens each, then a needs a 3rd block
        batch = sch.schedule()
        advance(batch)
    assert plan(batch) == [("a", 1)]
    assert b.status is Status.WAITING and list(sch.waiting) == [b, c] and b.block_table == [] and b.num_computed_tokens == 0
    assert b.num_output_tokens == 3 and a.num_output_tokens == 4  # b keeps its generated tokens
    assert sch.running == [a]


def test_a_preempting_step_admits_nobody_and_recompute_resumes():
    bm = BlockManager(3, 2, enable_prefix_caching=False)
    sch = Scheduler(bm, max_num_seqs=8, max_num_batched_tokens=100)
    a, b = seq("a", 1), seq("b", 1)
    sch.add(a), sch.add(b)
    advance(sch.schedule())
    advance(sch.schedule())  # both fill their first block: 3 tokens, 2 computed
    batch = sch.schedule()  # each needs a second block, one is free: b is preempted
    assert plan(batch) == [("a", 1)] and sch.waiting[0] is b and sch.num_preemptions_total == 1
    advance(batch)
    sch.finish(a, "length")
    assert bm.num_free_blocks == 3
    assert plan(sch.schedule()) == [("b", 3)]  # recompute: the prompt and both generated tokens
