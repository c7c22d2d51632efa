"""Engine logprobs -> OpenAI's two shapes, with each token's exact text bytes.

Owns `TokenTexts` (token id -> the bytes it stands for and a display string; for byte-level
BPE tokenizers the bytes are exact, so a token that is half of a UTF-8 character reports
its real bytes, as OpenAI's `bytes` field means) and the formatting: chat
`{"content": [{"token", "logprob", "bytes", "top_logprobs": [...]}]}` and the legacy
completions `{"tokens", "token_logprobs", "top_logprobs", "text_offset"}`. Does not own
computing logprobs (the engine's sampler does).
"""

from __future__ import annotations

import math

from longhaul.models.byte_tokenizer import _byte_chars

_FLOOR = -9999.0  # JSON has no -inf; vLLM reports this floor too


def _finite(x: float) -> float:
    return x if math.isfinite(x) else _FLOOR


class TokenTexts:
    """Cached id -> (display text, bytes) for one tokenizer."""

    def __init__(self, tok):
        self.tok = tok
        decoder = getattr(getattr(tok, "backend_tokenizer", None), "decoder", None)
        self._byte_level = type(decoder).__name__ == "ByteLevel"
        self._inverse = {c: b for b, c in enumerate(_byte_chars())}
        self._special = set(getattr(tok, "all_special_ids", []) or [])
        self._cache: dict[int, tuple[str, list[int]]] = {}

    def __call__(self, token_id: int) -> tuple[str, list[int]]:
        hit = self._cache.get(token_id)
        if hit is None:
            hit = self._cache[token_id] = self._lookup(token_id)
        return hit

    def _lookup(self, token_id: int) -> tuple[str, list[int]]:
        if self._byte_level and token_id not in self._special:
            piece = self.tok.convert_ids_to_tokens(token_id)
            if piece is not None and all(c in self._inverse for c in piece):
                raw = bytes(self._inverse[c] for c in piece)
                return raw.decode("utf-8", errors="replace"), list(raw)
        text = self.tok.decode([token_id], skip_special_tokens=False)
        return text, list(text.encode("utf-8"))


def _top(texts: TokenTexts, top: dict[int, float] | None, n: int) -> list[tuple[str, list[int], float]]:
    if not top or n <= 0:
        return []
    best = sorted(top.items(), key=lambda kv: -kv[1])[:n]
    return [(*texts(i), _finite(lp)) for i, lp in best]


def chat_logprobs(texts: TokenTexts, token_ids: list[int], logprobs: list[float], top: list | None, n: int) -> dict:
    """OpenAI chat `choice.logprobs` for the given tokens (n = top_logprobs asked)."""
    content = []
    for k, (tid, lp) in enumerate(zip(token_ids, logprobs)):
        text, raw = texts(tid)
        alts = _top(texts, top[k] if top else None, n)
        content.append({"token": text, "logprob": _finite(lp), "bytes": raw,
                        "top_logprobs": [{"token": t, "logprob": v, "bytes": b} for t, b, v in alts]})
    return {"content": content}


def completion_logprobs(texts: TokenTexts, token_ids: list[int], logprobs: list[float], top: list | None, n: int,
                        offset: int = 0) -> dict:
    """The legacy completions `choice.logprobs`; text offsets start at `offset` characters."""
    tokens, offsets = [], []
    for tid in token_ids:
        text = texts(tid)[0]
        tokens.append(text)
        offsets.append(offset)
        offset += len(text)
    tops = [{t: v for t, _, v in _top(texts, top[k] if top else None, n)} for k in range(len(token_ids))] if n else None
    return {"tokens": tokens, "token_logprobs": [_finite(x) for x in logprobs], "top_logprobs": tops, "text_offset": offsets}
