"""One request inside the engine: its tokens, progress through the cache, and when it stops.

Owns a request's state (prompt and generated tokens, how many have K/V in the cache, block
table, per-token logprobs and weight versions, timings), incremental detokenization and the
stop rules (EOS, stop tokens, stop strings, max_tokens, the model's length). Does not own
scheduling, blocks or sampling.

Stop rules follow vLLM: EOS and stop tokens are kept in `output_token_ids` (and kept out of
`text`); a stop string ends the text where it starts (unless `include_stop_str_in_output`)
and the token that completed it is the last token; none of them applies before `min_tokens`.
"""

from __future__ import annotations

import enum
import time

import torch

from longhaul.inference.sampling import SamplingParams


def detokenizer(tok):
    """What `Sequence.append_token` decodes with: a fast HF tokenizer's own Rust tokenizer where
    the HF wrapper would only pass the call on (its decode not overridden, no clean-up of
    spaces), else tok itself. The wrapper's Python costs more than the decode between two weight
    streams."""
    raw = getattr(tok, "_tokenizer", None)
    if raw is None or getattr(tok, "clean_up_tokenization_spaces", True) is not False:
        return tok
    import transformers

    cls = type(tok)
    plain = getattr(cls, "_decode", None) is transformers.PreTrainedTokenizerFast._decode \
        and getattr(cls, "decode", None) is transformers.PreTrainedTokenizerBase.decode
    return raw if plain and callable(getattr(raw, "decode", None)) else tok


class Status(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED = "finished"


class Sequence:
    def __init__(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams, eos_token_ids: set[int],
                 seed: int, max_model_len: int, prompt: str | None = None):
        self.request_id, self.params, self.prompt = request_id, params, prompt
        self.prompt_token_ids = list(prompt_token_ids)
        self.token_ids = list(prompt_token_ids)  # prompt + output, the tokens the cache follows
        self.num_prompt_tokens = len(prompt_token_ids)
        self.eos_token_ids = set() if params.ignore_eos else set(eos_token_ids)
        self.stop_token_ids = set(params.stop_token_ids)
        limit = max_model_len - self.num_prompt_tokens
        self.max_tokens = min(params.max_tokens or limit, limit)
        self.generator = torch.Generator().manual_seed(seed)
        self.status = Status.WAITING
        self.num_computed_tokens = 0  # tokens whose K/V are in the cache
        self.block_table: list[int] = []
        self.block_hashes: list[int] = []  # chain hashes of full blocks (filled by the block manager)
        self.lora = 0  # the LoRA adapter slot it runs with (0: the base weights)
        self.cache_root: int | None = None  # the parent of its first block's hash: an adapter's K/V is its own
        self.num_cached_blocks = 0  # of block_table, registered in the prefix cache
        self.kv_stale = False  # its K/V spans a weight update (kept in flight): never shared through the prefix cache
        self.num_cached_tokens: int | None = None  # prefix-cache hit of the first schedule
        self.logprobs: list[float] = []
        self.top_logprobs: list[dict[int, float] | None] = []
        self.weight_versions: list[int] = []
        self.finish_reason: str | None = None
        self.text, self._prefix_offset, self._read_offset = "", len(prompt_token_ids), len(prompt_token_ids)
        self.arrival_time = time.perf_counter()
        self.first_token_time: float | None = None
        self.finished_time: float | None = None

    # ---- views ---------------------------------------------------------------------------
    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens:]

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def finished(self) -> bool:
        return self.status is Status.FINISHED

    def banned_tokens(self) -> list[int]:
        """Tokens the sampler must not pick yet: EOS and stop tokens before min_tokens."""
        if self.num_output_tokens >= self.params.min_tokens:
            return []
        return sorted(self.eos_token_ids | self.stop_token_ids)

    # ---- progress ------------------------------------------------------------------------
    def append_token(self, token: int, logprob: float, top: dict[int, float] | None, version: int, tok) -> None:
        """Record a sampled token, detokenize it and apply the stop rules."""
        self.token_ids.append(token)
        self.logprobs.append(logprob)
        self.top_logprobs.append(top)
        self.weight_versions.append(version)
        if self.first_token_time is None:
            self.first_token_time = time.perf_counter()
        new_text = self._detokenize(tok)
        self.finish_reason = self._stop_reason(token, new_text)

    def _detokenize(self, tok) -> str:
        """Append the text the new token completes. Decoding a window that starts a few tokens
        back keeps multi-byte characters and leading spaces right (TGI's / vLLM's scheme)."""
        if tok is None:
            return ""
        skip = self.params.skip_special_tokens
        prefix = tok.decode(self.token_ids[self._prefix_offset:self._read_offset], skip_special_tokens=skip)
        full = tok.decode(self.token_ids[self._prefix_offset:], skip_special_tokens=skip)
        if len(full) > len(prefix) and not full.endswith("\ufffd"):
            new = full[len(prefix):]
            self._prefix_offset, self._read_offset = self._read_offset, len(self.token_ids)
            self.text += new
            return new
        return ""

    def _stop_reason(self, token: int, new_text: str) -> str | None:
        n = self.num_output_tokens
        if n >= self.params.min_tokens:
            if token in self.eos_token_ids or token in self.stop_token_ids:
                return "stop"
            if new_text and self._match_stop_string(len(new_text)):
                return "stop"
        if n >= self.max_tokens:
            return "length"
        return None

    def _match_stop_string(self, new_chars: int) -> bool:
        best = -1
        for s in self.params.stop_strings:
            i = self.text.find(s, max(0, len(self.text) - new_chars - len(s) + 1))
            if i >= 0 and (best < 0 or i < best):
                best, end = i, i + (len(s) if self.params.include_stop_str_in_output else 0)
        if best < 0:
            return False
        self.text = self.text[:end]
        return True

    def finish(self, reason: str) -> None:
        self.status, self.finish_reason = Status.FINISHED, reason
        self.finished_time = time.perf_counter()
