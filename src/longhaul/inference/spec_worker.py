"""Speculative decoding inside `LLMEngine`: propose k tokens, score k + 1 positions in one
target forward, verify, roll back the rejected K/V.

Owns `SpeculativeConfig`, the draft-model proposer (a second model with its own runner, KV
pool and block tables; the n-gram proposer is `spec_decode.NgramProposer`) and
`SpecDecoder.step`, which stands in for the plain forward + sample of one engine step. Does
not own the maths (`spec_decode`), nor the target's scheduling, blocks or runner (`engine`).

Engine hook: in `LLMEngine._step`, right after `batch = self.scheduler.schedule()` (and the
empty check), `if self.spec is not None: return self.spec.step(batch)`; `self.spec` is
`SpecDecoder(self, config)` when a `SpeculativeConfig` is given, else None. Until that lands,
`SpecDecoder(engine, config).attach()` routes one engine's steps here.

A sequence speculates when it is decoding (its only uncomputed token is its last). Its step
computes `[last token] + drafts` over its cache with `num_logits = 1 + len(drafts)`; a
prefill chunk in the same batch runs as usual, and a finished prompt samples its first token
through the same verification with no drafts (rejection sampling with q = 0 is plain
sampling).

Deviations from vLLM:
- drafted tokens are not charged to `max_num_batched_tokens`, and the draft model catches up
  on a prompt in one chunk; a sequence whose blocks cannot grow by k decodes one token;
- sampled rows draw k' + 1 uniforms a step from the request's generator (k' its drafts), so
  a seeded request is reproducible whatever shares its batch, but does not repeat the tokens
  the same seed gives without speculation (greedy output is identical).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch
from pydantic import BaseModel, ConfigDict, Field, model_validator

from longhaul.errors import LonghaulError
from longhaul.inference.block_manager import BlockManager
from longhaul.inference.kv_cache import KVCache
from longhaul.inference.model_runner import BatchItem, ModelRunner
from longhaul.inference.sampling import process_logits, sample_from
from longhaul.inference.sequence import Status, detokenizer
from longhaul.inference.spec_decode import NgramProposer, SpecCounters, rejection_sample
from longhaul.models import load_policy


class SpeculativeConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", protected_namespaces=())

    method: Literal["draft", "ngram"] = "ngram"  # ngram needs no second model and wins on repetitive text (code edits, RAG)
    draft_model: str | None = None  # built-in name, HF directory or .gguf; must share the target's vocabulary
    num_speculative_tokens: int = Field(4, ge=1)  # k; past ~5 the extra drafts are mostly rejected
    ngram_min: int = Field(1, ge=1)  # shortest suffix looked up (vLLM's prompt_lookup_min)
    ngram_max: int = Field(4, ge=1)  # longest suffix, tried first (vLLM's prompt_lookup_max)
    draft_num_kv_blocks: int | None = Field(None, ge=1)  # None: as many blocks as the target's pool

    @model_validator(mode="after")
    def _check(self):
        if self.ngram_min > self.ngram_max:
            raise ValueError(f"ngram_min ({self.ngram_min}) must be <= ngram_max ({self.ngram_max})")
        return self


def _banned(logits: torch.Tensor, seqs, offsets: list[int]) -> torch.Tensor:
    """Row r is scored for seqs[r]'s output token number num_output + offsets[r]: EOS and stop
    tokens are -inf there while that is before min_tokens."""
    out = logits
    for r, (seq, j) in enumerate(zip(seqs, offsets)):
        if seq.num_output_tokens + j < seq.params.min_tokens:
            out = out.clone() if out is logits else out
            out[r, sorted(seq.eos_token_ids | seq.stop_token_ids)] = float("-inf")
    return out


@dataclass
class _DraftState:
    """A request's place in the draft model's cache, duck-typed for `BlockManager`."""

    generator: torch.Generator
    block_table: list[int] = field(default_factory=list)
    num_computed_tokens: int = 0
    block_hashes: list[int] = field(default_factory=list)
    num_cached_blocks: int = 0


class DraftModelProposer:
    """Runs a small draft model autoregressively k steps a sequence, sampling with the
    request's own params from a generator derived from its seed."""

    def __init__(self, model, engine, num_blocks: int | None = None):
        cfg, ecfg = model.config, engine.config
        num_blocks = num_blocks or engine.block_manager.num_blocks
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        self.kv = KVCache(cfg.num_hidden_layers, num_blocks, ecfg.block_size, cfg.num_key_value_heads, head_dim,
                          ecfg.torch_dtype, ecfg.device)
        self.runner = ModelRunner(model, self.kv, ecfg.torch_dtype, ecfg.device)
        if self.runner.embed.shape[0] != engine.vocab_size:
            raise LonghaulError(f"draft model has {self.runner.embed.shape[0]} tokens but the target has {engine.vocab_size}; "
                                f"use a draft of the target's tokenizer family")
        self.bm = BlockManager(num_blocks, ecfg.block_size, enable_prefix_caching=False)
        self.states: dict[str, _DraftState] = {}

    def release(self, request_id: str) -> None:
        """Free a request's draft cache (it finished); a no-op for a request without one."""
        st = self.states.pop(request_id, None)
        if st is not None:
            self.bm.free_blocks(st)

    def release_idle(self, live: dict) -> None:
        """Free the draft cache of requests that were aborted, left the engine or were preempted."""
        for rid in [r for r in self.states if r not in live or live[r].status is not Status.RUNNING]:
            self.release(rid)

    def propose(self, seqs, ks: list[int]) -> tuple[list[list[int]], torch.Tensor]:
        """Up to ks[b] drafts for seqs[b] (fewer only when the draft pool is full) and their
        draft probabilities q (B, max ks, V), zero past a row's drafts."""
        ks = list(ks)
        catch = []
        for b, seq in enumerate(seqs):
            st = self.states.get(seq.request_id)
            if st is None:
                st = self.states[seq.request_id] = _DraftState(torch.Generator().manual_seed(seq.generator.initial_seed() ^ 0x5BD1E995))
            catch.append(seq.token_ids[st.num_computed_tokens:])
            need = len(catch[b]) + ks[b] - 1  # the last draft is never fed back
            if ks[b] and self.bm.can_append(st, need):
                self.bm.append(st, need)
            else:
                ks[b] = 0
        K, V = max(ks, default=0), self.runner.embed.shape[0]
        drafts: list[list[int]] = [[] for _ in seqs]
        q = torch.zeros((len(seqs), K, V), dtype=torch.float32, device=self.runner.device)
        for j in range(K):
            rows = [b for b in range(len(seqs)) if ks[b] > j]
            states = [self.states[seqs[b].request_id] for b in rows]
            items = [BatchItem(catch[b] if j == 0 else drafts[b][-1:], st.num_computed_tokens, st.block_table)
                     for b, st in zip(rows, states)]
            logits = self.runner.forward(self.runner.prepare(items))
            for it, st in zip(items, states):
                st.num_computed_tokens += len(it.token_ids)
            row_seqs = [seqs[b] for b in rows]
            logp = process_logits(_banned(logits, row_seqs, [j] * len(rows)), [s.params for s in row_seqs]).log_softmax(-1)
            tokens = logp.argmax(-1)
            sampled = [r for r, s in enumerate(row_seqs) if not s.params.greedy]
            if sampled:
                idx = torch.tensor(sampled, device=logp.device)
                tokens[idx] = sample_from(logp[idx], [states[r].generator for r in sampled])
            q[rows, j] = logp.exp()
            for r, b in enumerate(rows):
                drafts[b].append(int(tokens[r]))
        return drafts, q

    def rollback(self, request_id: str, num_tokens: int) -> None:
        """Keep the draft K/V of the request's first num_tokens tokens."""
        self.bm.truncate(self.states[request_id], num_tokens)


class SpecDecoder:
    """Speculative decoding for one `LLMEngine`; `counters` accumulate over its life."""

    def __init__(self, engine, config: SpeculativeConfig, draft_model=None):
        """draft_model: an HF model object for method "draft" (else `config.draft_model` is loaded)."""
        self.engine, self.config, self.k = engine, config, config.num_speculative_tokens
        self.counters = SpecCounters()
        self.ngram = self.draft = None
        if config.method == "ngram":
            self.ngram = NgramProposer(config.ngram_min, config.ngram_max, self.k)
        else:
            if draft_model is None:
                if not config.draft_model:
                    raise LonghaulError("speculative method 'draft' needs a draft model; set draft_model to a model name, HF directory or .gguf")
                draft_model = load_policy(config.draft_model)[0]
            self.draft = DraftModelProposer(draft_model.eval(), engine, config.draft_num_kv_blocks)

    def attach(self) -> SpecDecoder:
        """Interim, until `LLMEngine._step` calls `step` itself: route this engine's steps here."""
        eng = self.engine

        def _step():
            with eng._step_lock:
                if eng._paused:
                    return []
                batch = eng.scheduler.schedule()
                return self.step(batch) if batch else []

        eng._step, eng.spec = _step, self
        return self

    def stats(self) -> dict[str, float]:
        return self.counters.as_metrics()

    def _plan(self, batch) -> list[int]:
        """Drafts each scheduled sequence may get: k for a decoding sequence whose blocks can
        grow by k + 1 (grown here; unused blocks go back in the rollback), fewer near
        max_tokens, 0 for prefill chunks."""
        bm, ks = self.engine.block_manager, []
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            decoding = n == 1 and seq.num_computed_tokens + 1 == seq.num_tokens
            k = min(self.k, seq.max_tokens - seq.num_output_tokens - 1) if decoding else 0
            if k > 0 and bm.can_append(seq, 1 + k):
                bm.append(seq, 1 + k)
            else:
                k = 0
            ks.append(k)
        return ks

    def _propose(self, seqs, ks: list[int]) -> tuple[list[list[int]], torch.Tensor | None]:
        """Drafts per sequence (at most ks[b]) and q (B, max ks, V), or None for n-gram drafts."""
        if self.draft is None:
            return [self.ngram.propose(s.token_ids)[:k] if k else [] for s, k in zip(seqs, ks)], None
        self.draft.release_idle(self.engine.requests)
        idx = [b for b, k in enumerate(ks) if k]
        got, q_some = self.draft.propose([seqs[b] for b in idx], [ks[b] for b in idx])
        drafts: list[list[int]] = [[] for _ in seqs]
        q = torch.zeros((len(seqs), max(ks), q_some.shape[-1]), device=q_some.device)
        for r, b in enumerate(idx):
            drafts[b] = got[r]
            q[b, :q_some.shape[1]] = q_some[r]
        return drafts, q

    @torch.inference_mode()
    def step(self, batch) -> list:
        """Run one scheduled batch with speculation; returns the sequences that got tokens."""
        eng, seqs = self.engine, batch.seqs
        ks = self._plan(batch)
        drafts, q = self._propose(seqs, ks) if any(ks) else ([[] for _ in seqs], None)
        items = []
        for seq, n, k, d in zip(seqs, batch.num_new_tokens, ks, drafts):
            c = seq.num_computed_tokens
            if k:  # the last token and its drafts, scored at every position
                items.append(BatchItem([seq.token_ids[-1]] + d, c, seq.block_table, 1 + len(d)))
            else:
                items.append(BatchItem(seq.token_ids[c:c + n], c, seq.block_table, int(c + n == seq.num_tokens)))
        logits = eng.runner.forward(eng.runner.prepare(items))  # (sum of num_logits, V)
        starts = [seq.num_tokens for seq in seqs]  # tokens before this step's output
        for seq, it in zip(seqs, items):
            seq.num_computed_tokens += len(it.token_ids)
        sampling = [b for b, it in enumerate(items) if it.num_logits]
        for b in range(len(seqs)):
            if not items[b].num_logits:
                eng.block_manager.cache_blocks(seqs[b])
        if not sampling:
            return []
        svs = [seqs[b] for b in sampling]
        out, n_acc, chosen, tops = self._verify(logits, svs, [drafts[b] for b in sampling],
                                                None if q is None else q[sampling])
        at, tok = 0, detokenizer(eng.tokenizer)
        for r, (b, seq) in enumerate(zip(sampling, svs)):
            if ks[b]:  # keep the last token and the accepted drafts; also frees unused blocks
                eng.truncate(seq.request_id, starts[b] + n_acc[r])
                if self.draft is not None and drafts[b]:  # the draft never computed its last draft
                    self.draft.rollback(seq.request_id, starts[b] + min(n_acc[r], len(drafts[b]) - 1))
            if seq.num_output_tokens == 0:
                eng.prompt_tokens_total += seq.num_prompt_tokens
            for j in range(n_acc[r] + 1):
                seq.append_token(out[r][j], chosen[at + j], tops[at + j], eng.weight_version, tok)
                eng.generation_tokens_total += 1
                if seq.finish_reason is not None:
                    eng.scheduler.finish(seq, seq.finish_reason)
                    if self.draft is not None:
                        self.draft.release(seq.request_id)
                    break
            at += n_acc[r] + 1
            if not seq.finished:
                eng.block_manager.cache_blocks(seq)
        return svs

    def _verify(self, logits: torch.Tensor, seqs, drafts: list[list[int]], q: torch.Tensor | None):
        """Rejection-sample every sampling sequence's drafts against the target logits (rows in
        item order, 1 + len(drafts[r]) each). Returns output tokens (S, K+1) and num_accepted
        (S,) as lists, and the logprob records of the emitted tokens, in order."""
        dev, S = logits.device, len(seqs)
        lens = [len(d) for d in drafts]
        K = max(lens)
        first = torch.tensor([0] + [n + 1 for n in lens]).cumsum(0)[:-1]
        pos = torch.minimum(torch.arange(K + 1)[None, :], torch.tensor(lens)[:, None])  # pad by repeating the last row
        raw = logits.index_select(0, (first[:, None] + pos).reshape(-1).to(dev))  # (S * (K+1), V)
        rep = [s for s in seqs for _ in range(K + 1)]
        params = [s.params for s in rep]
        logp = process_logits(_banned(raw, rep, list(range(K + 1)) * S), params).log_softmax(-1)
        x = torch.tensor([d + [-1] * (K - len(d)) for d in drafts], dtype=torch.long).view(S, K)
        out, n_acc = rejection_sample(x.to(dev), None if q is None else q[:, :K], logp.exp().view(S, K + 1, -1),
                                      [s.generator for s in seqs], draft_lens=torch.tensor(lens),
                                      greedy=torch.tensor([s.params.greedy for s in seqs]))
        self.counters.record(lens, n_acc)
        out, n_acc = out.tolist(), n_acc.tolist()
        rows = [r * (K + 1) + j for r in range(S) for j in range(n_acc[r] + 1)]
        chosen, tops = _logprobs(logp, raw, params, rows, [out[r][j] for r in range(S) for j in range(n_acc[r] + 1)])
        return out, n_acc, chosen, tops


def _logprobs(logp: torch.Tensor, raw: torch.Tensor, params: list, rows: list[int], tokens: list[int]):
    """The engine sampler's logprob records (as `sampling.sample` makes them) for tokens
    emitted at `rows` of the (R, V) processed log-probs and raw logits; params (R,)."""
    idx = torch.tensor(rows, device=logp.device)
    tok = torch.tensor(tokens, device=logp.device)[:, None]
    lp = logp.index_select(0, idx)
    ps = [params[i] for i in rows]
    any_raw = any(p.logprobs_mode == "raw" for p in ps)
    rlp = raw.index_select(0, idx).log_softmax(-1) if any_raw else lp
    cp, cr = lp.gather(-1, tok).squeeze(-1).tolist(), rlp.gather(-1, tok).squeeze(-1).tolist()
    chosen = [cr[i] if p.logprobs_mode == "raw" else cp[i] for i, p in enumerate(ps)]
    tops: list[dict[int, float] | None] = [None] * len(rows)
    for i, p in enumerate(ps):
        if p.logprobs:
            vals, ids = (rlp if p.logprobs_mode == "raw" else lp)[i].topk(p.logprobs)
            tops[i] = dict(zip(ids.tolist(), vals.tolist()))
            tops[i].setdefault(tokens[i], chosen[i])
    return chosen, tops
