"""The scheduler: which sequences run in the next step, and how many tokens each.

Owns the waiting queue and the running list, the per-step token budget and preemption. Does
not own blocks (`block_manager`), the forward or sampling.

Like vLLM v1 there are no separate prefill and decode phases: every sequence has tokens with
K/V in the cache (`num_computed_tokens`) and tokens without, and a step gives each scheduled
sequence a share of the budget (`max_num_batched_tokens`). Running sequences go first (a
decode costs one token, an unfinished prompt its next chunk), then waiting sequences are
admitted in order while budget, blocks and `max_num_seqs` allow; a prompt longer than what is
left of the budget is prefilled in chunks over several steps (chunked prefill).

Prefix-aware admission: a waiting sequence whose next uncached block is being computed in
this very step by another sequence (RL groups submit one prompt n times; agent prompts share a
system prompt) waits one step and then takes that block from the prefix cache, instead of
computing the same K/V twice. vLLM v1 prefills such requests side by side.

Preemption is by recompute: when a running sequence needs a block and none is free, the most
recently admitted running sequence gives all its blocks back and returns to the front of the
waiting queue, keeping its generated tokens; it later re-prefills prompt + output (the prefix
cache usually still holds most of it) and continues exactly where it stopped. A step that
preempted admits nobody new.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from longhaul.inference.block_manager import BlockManager
from longhaul.inference.sequence import Sequence, Status


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)  # tokens each seq computes this step

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, block_manager: BlockManager, max_num_seqs: int, max_num_batched_tokens: int):
        self.bm = block_manager
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.num_preemptions_total = 0
        self.num_recomputed_total = 0  # running sequences sent back to prefill by a weight update

    def add(self, seq: Sequence) -> None:
        self.waiting.append(seq)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> ScheduledBatch:
        batch, budget, preempted = ScheduledBatch(), self.max_num_batched_tokens, False
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            n = min(seq.num_tokens - seq.num_computed_tokens, budget)
            if n <= 0:  # nothing to compute (cannot happen in plain decoding)
                i += 1
                continue
            while not self.bm.can_append(seq, n):
                victim = self.running.pop()  # the most recently admitted
                self.preempt(victim)
                preempted = True
                if victim is seq:
                    break
            else:
                self.bm.append(seq, n)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(n)
                budget -= n
                i += 1
                continue
            break  # seq itself was preempted: it was the last running sequence
        pending = self._pending_blocks(batch) if self.waiting else set()
        deferred = []
        while self.waiting and budget > 0 and not preempted and len(self.running) < self.max_num_seqs:
            seq = self.waiting[0]
            hit = self.bm.match_prefix(seq)
            if pending and self._next_block_pending(seq, hit, pending):
                deferred.append(self.waiting.popleft())
                continue
            n = min(seq.num_tokens - len(hit) * self.bm.block_size, budget)
            if not self.bm.can_allocate(seq, hit, n):
                break
            self.bm.allocate(seq, hit, n)
            if seq.num_cached_tokens is None:
                seq.num_cached_tokens = seq.num_computed_tokens
            self.waiting.popleft()
            seq.status = Status.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(n)
            budget -= n
            pending |= self._pending_blocks(ScheduledBatch([seq], [n]))
        self.waiting.extendleft(reversed(deferred))
        return batch

    def _pending_blocks(self, batch: ScheduledBatch) -> set[int]:
        """Chain hashes of the full blocks the batch's sequences complete in this step."""
        if not self.bm.enable_prefix_caching:
            return set()
        bs, out = self.bm.block_size, set()
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            first, end = seq.num_computed_tokens // bs, (seq.num_computed_tokens + n) // bs
            if end > first:
                out.update(self.bm.block_hashes(seq)[first:end])
        return out

    def _next_block_pending(self, seq: Sequence, hit: list[int], pending: set[int]) -> bool:
        hashes = self.bm.block_hashes(seq)
        return len(hashes) > len(hit) and hashes[len(hit)] in pending

    def preempt(self, seq: Sequence, count: bool = True) -> None:
        """Send a running seq back to the front of the waiting queue without its K/V."""
        self.bm.free_blocks(seq)
        seq.status = Status.WAITING
        self.waiting.appendleft(seq)
        self.num_preemptions_total += int(count)

    def preempt_all(self) -> None:
        """Drop every running sequence's K/V (new weights): all re-prefill, in their order."""
        while self.running:
            self.preempt(self.running.pop(), count=False)
            self.num_recomputed_total += 1

    def finish(self, seq: Sequence, reason: str) -> None:
        """Remove a finished or aborted seq from whichever queue holds it; free its blocks."""
        if seq.status is Status.RUNNING:
            self.running.remove(seq)
        elif seq.status is Status.WAITING:
            self.waiting.remove(seq)
        self.bm.free_blocks(seq)
        seq.finish(reason)
