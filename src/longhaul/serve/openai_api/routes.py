"""The OpenAI-compatible routes: `/v1/chat/completions`, `/v1/completions`, `/v1/models`.

Owns the wire shapes of responses and SSE chunks (`data: {...}` lines, `data: [DONE]` last;
with `stream_options.include_usage` every chunk carries `"usage": null` and a last chunk with
no choices carries the usage) and the order of checks a request goes through: ready, key
(401), body size (413), JSON and types (400), model (404), supported fields and context
(400), admission (503), rate limits (429). Tool calls are streamed once a choice finishes
(its text is held back from the first `<tool_call>` on). Does not own sampling, auth or the
engine loop.
"""

from __future__ import annotations

import asyncio
import json

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse
from pydantic import BaseModel

from longhaul.serve.openai_api.chat import extract_tool_calls, render
from longhaul.serve.openai_api.generation import Delta, Generation, check_model, token_budget, usage
from longhaul.serve.openai_api.logprobs import chat_logprobs, completion_logprobs
from longhaul.serve.openai_api.protocol import APIError, ChatCompletionRequest, CompletionRequest, bad_request, validate

router = APIRouter()
_SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


class EventStream(StreamingResponse):
    """SSE whose generation is closed however the response ends: a client that disconnects
    before the first chunk never starts the body generator, so its `finally` cannot do it."""

    def __init__(self, body, gen: Generation):
        super().__init__(body, media_type="text/event-stream", headers={**gen.headers, **_SSE_HEADERS})
        self.gen = gen

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.gen.close()


def _dumps(obj) -> str:
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False)


async def parse_json(request: Request, state) -> dict:
    """The body as a JSON object, or a 413 / 400 naming what is wrong with it."""
    limit = state.config.max_request_bytes
    if int(request.headers.get("content-length") or 0) > limit:
        raise APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    raw = await request.body()
    if len(raw) > limit:
        raise APIError(413, f"the request body is larger than {limit} bytes", code="request_too_large")
    try:
        data = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"the body is not valid JSON ({e}); send a JSON object") from None
    if not isinstance(data, dict):
        raise bad_request("the body must be a JSON object")
    return data


async def parse_body(request: Request, model: type[BaseModel]):
    """The server state, the authenticated key and the validated request."""
    state = request.app.state.server
    state.check_ready()
    key = state.keys.authenticate(request.headers.get("authorization"))
    req = validate(model, await parse_json(request, state))
    check_model(state, req.model)
    req.check_supported()
    return state, key, req


async def _finals_while_connected(request: Request, gen: Generation) -> list:
    """The choices' final outputs; stops early (and the generation is aborted on exit) when
    the client hangs up, so a dropped long request does not keep the engine busy."""
    task = asyncio.ensure_future(gen.finals())
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=0.25)
            if done:
                return task.result()
            if await request.is_disconnected():
                raise APIError(499, "the client closed the request", code="client_closed")
    finally:
        task.cancel()


def _finish_reason(out, tool_calls) -> str:
    return "tool_calls" if tool_calls else ("length" if out.finish_reason == "length" else "stop")


@router.get("/v1/models")
async def list_models(request: Request):
    state = request.app.state.server
    state.keys.authenticate(request.headers.get("authorization"))
    return {"object": "list", "data": state.model_cards()}


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str):
    state = request.app.state.server
    state.keys.authenticate(request.headers.get("authorization"))
    check_model(state, model_id)
    return state.model_card(model_id)


@router.post("/v1/chat/completions")
async def chat_completions(request: Request):
    state, key, req = await parse_body(request, ChatCompletionRequest)
    prompt = render(state.tokenizer, req)
    gen = Generation(state, key, req, [prompt], [token_budget(state, len(prompt), req.requested_max_tokens)])
    tools = bool(req.tools) and req.tool_choice != "none"
    base = {"id": f"chatcmpl-{gen.id}", "created": gen.created, "model": state.lora_of(req.model) or state.model_name}
    request.scope["state"]["log"].update(key=key.name, prompt_tokens=len(prompt) * req.n)
    if req.stream:
        return EventStream(_chat_stream(state, gen, req, base, tools), gen)
    async with gen:
        finals = await _finals_while_connected(request, gen)
    request.scope["state"]["log"].update(gen.log_fields(finals))
    choices = []
    for i, out in enumerate(finals):
        content, calls = extract_tool_calls(out.text) if tools else (out.text, [])
        message = {"role": "assistant", "content": content, "refusal": None}
        if calls:
            message["tool_calls"] = calls
        lp = chat_logprobs(state.texts, out.token_ids, out.logprobs, out.top_logprobs, req.top_logprobs or 0) if req.logprobs else None
        choices.append({"index": i, "message": message, "logprobs": lp, "finish_reason": _finish_reason(out, calls)})
    body = {**base, "object": "chat.completion", "choices": choices, "system_fingerprint": None,
            "usage": usage(len(prompt) * req.n, sum(len(o.token_ids) for o in finals))}
    return JSONResponse(body, headers=gen.headers)


async def _chat_stream(state, gen: Generation, req: ChatCompletionRequest, base: dict, tools: bool):
    head = {**base, "object": "chat.completion.chunk", "system_fingerprint": None}
    extra = {"usage": None} if req.include_usage else {}

    def chunk(i, delta, lp=None, finish=None) -> str:
        return f"data: {_dumps({**head, 'choices': [{'index': i, 'delta': delta, 'logprobs': lp, 'finish_reason': finish}], **extra})}\n\n"

    deltas = [Delta(p.stop_strings, tools) for p in gen.params]
    completion = 0
    async with gen:
        for i in range(len(gen.streams)):
            yield chunk(i, {"role": "assistant", "content": ""})
        try:
            async for i, out in gen.outputs():
                piece, toks = deltas[i].step(out)
                lp = None
                if req.logprobs and toks.stop > toks.start:
                    top = out.top_logprobs[toks] if out.top_logprobs else None
                    lp = chat_logprobs(state.texts, out.token_ids[toks], out.logprobs[toks], top, req.top_logprobs or 0)
                if piece or lp:
                    yield chunk(i, {"content": piece}, lp)
                if out.finished:
                    completion += len(out.token_ids)
                    calls = extract_tool_calls(out.text)[1] if tools else []
                    if calls:
                        yield chunk(i, {"tool_calls": [{"index": k, **c} for k, c in enumerate(calls)]})
                    elif tools and deltas[i].sent_chars < len(out.text):  # held back for a call that did not parse
                        yield chunk(i, {"content": out.text[deltas[i].sent_chars:]})
                    yield chunk(i, {}, None, _finish_reason(out, calls))
        except APIError as e:
            yield f"data: {_dumps(e.body())}\n\n"
        except Exception as e:  # the engine failed this request: say so in the stream
            yield f"data: {_dumps(APIError(500, str(e), type='server_error').body())}\n\n"
        if req.include_usage:
            u = usage(len(gen.prompts[0]) * len(gen.prompts), completion)
            yield f"data: {_dumps({**head, 'choices': [], 'usage': u})}\n\n"
        yield "data: [DONE]\n\n"


def _completion_prompts(state, req: CompletionRequest) -> list[list[int]]:
    p = req.prompt
    if isinstance(p, str):
        prompts = [state.tokenizer.encode(p)]
    elif p and all(isinstance(x, int) for x in p):
        prompts = [list(p)]
    elif p and all(isinstance(x, str) for x in p):
        prompts = [state.tokenizer.encode(x) for x in p]
    elif p and all(isinstance(x, list) for x in p):
        prompts = [list(x) for x in p]
    else:
        raise bad_request("prompt must be a string, a list of strings, a list of token ids or a list of such lists", "prompt")
    if len(prompts) * req.n > 64:
        raise bad_request(f"{len(prompts)} prompts x n={req.n} is over 64 choices a request; split the request", "prompt")
    vocab = state.engine.vocab_size
    if any(t < 0 or t >= vocab for q in prompts for t in q):
        raise bad_request(f"prompt token ids must be in [0, {vocab})", "prompt")
    return prompts


@router.post("/v1/completions")
async def completions(request: Request):
    state, key, req = await parse_body(request, CompletionRequest)
    prompts = _completion_prompts(state, req)
    gen = Generation(state, key, req, prompts, [token_budget(state, len(p), req.requested_max_tokens) for p in prompts])
    base = {"id": f"cmpl-{gen.id}", "object": "text_completion", "created": gen.created,
            "model": state.lora_of(req.model) or state.model_name}
    request.scope["state"]["log"].update(key=key.name, prompt_tokens=sum(len(p) for p in gen.prompts))
    echo = [state.tokenizer.decode(p) if req.echo else "" for p in gen.prompts]
    if req.stream:
        return EventStream(_completion_stream(state, gen, req, base, echo), gen)
    async with gen:
        finals = await _finals_while_connected(request, gen)
    request.scope["state"]["log"].update(gen.log_fields(finals))
    choices = [{"index": i, "text": echo[i] + out.text, "finish_reason": _finish_reason(out, None),
                "logprobs": completion_logprobs(state.texts, out.token_ids, out.logprobs, out.top_logprobs, req.logprobs)
                if req.logprobs is not None else None} for i, out in enumerate(finals)]
    body = {**base, "choices": choices, "usage": usage(sum(len(p) for p in gen.prompts), sum(len(o.token_ids) for o in finals))}
    return JSONResponse(body, headers=gen.headers)


async def _completion_stream(state, gen: Generation, req: CompletionRequest, base: dict, echo: list[str]):
    extra = {"usage": None} if req.include_usage else {}
    deltas = [Delta(p.stop_strings, False) for p in gen.params]
    offsets = [len(e) for e in echo]
    completion = 0
    async with gen:
        try:
            for i, e in enumerate(echo):
                if e:
                    yield f"data: {_dumps({**base, 'choices': [{'index': i, 'text': e, 'logprobs': None, 'finish_reason': None}], **extra})}\n\n"
            async for i, out in gen.outputs():
                piece, toks = deltas[i].step(out)
                lp = None
                if req.logprobs is not None and toks.stop > toks.start:
                    top = out.top_logprobs[toks] if out.top_logprobs else None
                    lp = completion_logprobs(state.texts, out.token_ids[toks], out.logprobs[toks], top, req.logprobs, offsets[i])
                    offsets[i] += sum(len(t) for t in lp["tokens"])
                finish = _finish_reason(out, None) if out.finished else None
                if piece or lp or finish:
                    yield f"data: {_dumps({**base, 'choices': [{'index': i, 'text': piece, 'logprobs': lp, 'finish_reason': finish}], **extra})}\n\n"
                if out.finished:
                    completion += len(out.token_ids)
        except APIError as e:
            yield f"data: {_dumps(e.body())}\n\n"
        except Exception as e:
            yield f"data: {_dumps(APIError(500, str(e), type='server_error').body())}\n\n"
        if req.include_usage:
            u = usage(sum(len(p) for p in gen.prompts), completion)
            yield f"data: {_dumps({**base, 'choices': [], 'usage': u})}\n\n"
        yield "data: [DONE]\n\n"
