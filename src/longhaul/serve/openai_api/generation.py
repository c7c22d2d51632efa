"""What both OpenAI endpoints do between a parsed request and its response body.

Owns the request-side checks that need the model (a known model id, the prompt and
`max_tokens` against the context, the token cap and the KV pool), `Generation` (a request's
choices in the engine: admission slots and rate-limit charge taken, streams submitted,
outputs merged as they come, everything released and aborted on exit, including a client
that disconnects mid-stream), and `Delta`, which turns a choice's cumulative outputs into
what is new since the last chunk, holding back text that may still become a stop string or a
tool call. Does not own the wire shapes (`routes`) or the engine loop.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from longhaul.inference.engine_loop import AsyncStream
from longhaul.serve.openai_api.chat import streamable_prefix
from longhaul.serve.openai_api.protocol import APIError, SamplingFields, bad_request, sampling_params


def check_model(state, model: str | None) -> None:
    if model is not None and model not in state.model_ids:
        served = ", ".join(repr(m) for m in [state.model_name, *state.config.lora_modules])
        raise APIError(404, f"The model `{model}` does not exist; this server serves {served} (see /v1/models).",
                       param="model", code="model_not_found")


def token_budget(state, prompt_len: int, requested: int | None) -> int:
    """max_tokens for a prompt, or a 400 naming the limit it breaks."""
    limit, cap = state.engine.max_model_len, state.config.max_tokens_cap
    if prompt_len == 0:
        raise bad_request("the prompt is empty; send at least one token", "prompt")
    if prompt_len >= limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, your prompt is {prompt_len} "
                          "tokens. Please reduce the length of the prompt.", "messages")
    if requested is not None and requested > cap:
        raise bad_request(f"max_tokens is {requested}, above this server's cap of {cap}; ask for fewer", "max_tokens")
    max_tokens = requested if requested is not None else min(limit - prompt_len, cap)
    if prompt_len + max_tokens > limit:
        raise bad_request(f"This model's maximum context length is {limit} tokens. However, you requested "
                          f"{prompt_len + max_tokens} tokens ({prompt_len} in the prompt, {max_tokens} in the completion). "
                          "Please reduce the length of the prompt or max_tokens.", "max_tokens")
    bm = state.engine.block_manager
    if bm.blocks_for(prompt_len + max_tokens) > bm.num_blocks:
        raise bad_request(f"{prompt_len + max_tokens} tokens do not fit this server's KV cache; lower max_tokens", "max_tokens")
    return max_tokens


class Generation:
    """The choices of one request in the engine. Use as `async with`: leaving releases the
    admission slots and aborts whatever is still running (a disconnected client)."""

    def __init__(self, state, key, req: SamplingFields, prompts: list[list[int]], max_tokens: list[int]):
        self.state, self.key, self.req = state, key, req
        self.id = uuid.uuid4().hex
        self.created = int(time.time())
        self.prompts = [p for p in prompts for _ in range(req.n)]  # choice i = prompt i // n, sample i % n
        self.params = [sampling_params(req, max_tokens[i // req.n], i % req.n) for i in range(len(self.prompts))]
        for p in self.params:
            p.lora = state.lora_of(req.model)  # a request naming an adapter runs with it
        state.admission.acquire(len(self.prompts))  # a full server refuses before the key's quota is charged
        try:
            self.headers = state.limiter.admit(key, sum(len(p) for p in self.prompts))
        except APIError:
            state.admission.release(len(self.prompts))
            raise
        self.t0, self.closed = time.perf_counter(), False
        loop = asyncio.get_running_loop()
        self.streams = [AsyncStream(loop, key) for _ in self.prompts]
        for i, (p, sp, s) in enumerate(zip(self.prompts, self.params, self.streams)):
            state.loop.submit(f"{self.id}-{i}", p, sp, s)

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc):
        self.close()

    def close(self) -> None:
        """Abort unfinished choices and give the admission slots back (once; idempotent)."""
        if self.closed:
            return
        self.closed = True
        for i, s in enumerate(self.streams):
            if not s.done:
                self.state.loop.abort(f"{self.id}-{i}")
        self.state.admission.release(len(self.streams), time.perf_counter() - self.t0)

    async def outputs(self):
        """(choice index, newest output) as they come, until every choice has finished."""
        if len(self.streams) == 1:
            s = self.streams[0]
            while True:
                out = await s.next()
                yield 0, out
                if out.finished:
                    return
        pending = {asyncio.ensure_future(s.next()): i for i, s in enumerate(self.streams)}
        try:
            while pending:
                done, _ = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                for f in done:
                    i = pending.pop(f)
                    out = f.result()
                    yield i, out
                    if not out.finished:
                        pending[asyncio.ensure_future(self.streams[i].next())] = i
        finally:
            for f in pending:
                f.cancel()

    async def finals(self) -> list:
        """Every choice's final output, in choice order."""
        final = [None] * len(self.streams)
        async for i, out in self.outputs():
            if out.finished:
                final[i] = out
        return final

    def log_fields(self, finals) -> dict:
        return {"key": self.key.name, "prompt_tokens": sum(len(p) for p in self.prompts),
                "completion_tokens": sum(len(o.token_ids) for o in finals if o is not None)}


def usage(prompt_tokens: int, completion_tokens: int) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens, "total_tokens": prompt_tokens + completion_tokens}


class Delta:
    """One choice's progress while streaming: new text and the tokens behind it."""

    def __init__(self, stop: tuple[str, ...], tools: bool):
        self.hold = max((len(s) for s in stop), default=1) - 1  # a stop string may still be forming
        self.tools = tools
        self.sent_chars = 0
        self.sent_tokens = 0

    def step(self, out) -> tuple[str, slice]:
        """(text to send now, slice of out.token_ids not yet sent)."""
        text = out.text
        end = len(text) if out.finished else max(self.sent_chars, len(text) - self.hold)
        end = min(end, streamable_prefix(text, self.tools)) if self.tools else end
        piece = text[self.sent_chars:end] if end > self.sent_chars else ""
        self.sent_chars = max(self.sent_chars, end)
        toks = slice(self.sent_tokens, len(out.token_ids))
        self.sent_tokens = len(out.token_ids)
        return piece, toks
