"""The playground's side of the console: chat with a model that an OpenAI-compatible server
(`longhaul serve`, or any other) serves, relayed through the console so that the page needs
no key of the server's and no cross-origin access to it.

Owns the relay: which request fields pass (`FIELDS`), the stream passed through as the server
sends it (server-sent events, one `data:` line per delta, `data: [DONE]` at the end), and the
one-line errors when no server is configured, the server does not answer, or it refuses the
request. Does not own the server or what it answers.
"""

from __future__ import annotations

import json

import httpx

from longhaul.console.paths import ConsoleError

# the chat request fields the page may set; the relay always asks for a stream
FIELDS = ("model", "messages", "max_tokens", "temperature", "top_p", "seed", "tools", "tool_choice", "stop")
CONNECT_S = 10.0


class Playground:
    def __init__(self, server: str | None, key: str | None = None):
        self.server = server.rstrip("/") if server else None
        self.headers = {"Authorization": f"Bearer {key}"} if key else {}

    def _need_server(self) -> str:
        if not self.server:
            raise ConsoleError(503, "no OpenAI-compatible server is configured for the playground: start the console with "
                                    "--serve URL (e.g. the address `longhaul serve` printed)")
        return self.server

    async def models(self) -> dict:
        """The server's models (`GET /v1/models`), and its address."""
        server = self._need_server()
        async with httpx.AsyncClient(timeout=CONNECT_S) as client:
            try:
                resp = await client.get(server + "/v1/models", headers=self.headers)
            except httpx.HTTPError as e:
                raise _unanswered(server, e) from e
        if resp.status_code != 200:
            raise ConsoleError(502, f"the server at {server} refused the model list: {_reason(resp.content, resp.status_code)}")
        return {"server": server, "models": [m.get("id") for m in resp.json().get("data", [])]}

    async def chat(self, body: object):
        """Open a streamed chat completion for `body` (the page's request); an async iterator of
        the server's raw event-stream bytes, closed when the stream ends or the page goes away."""
        server = self._need_server()
        if not isinstance(body, dict) or not isinstance(body.get("messages"), list) or not body["messages"]:
            raise ConsoleError(400, "the chat request needs 'messages': a non-empty list of {role, content}")
        if not isinstance(body.get("model"), str) or not body["model"]:
            raise ConsoleError(400, "the chat request needs 'model': one of the names GET /api/playground lists")
        unknown = sorted(set(body) - set(FIELDS))
        if unknown:
            raise ConsoleError(400, f"the playground does not pass {unknown[0]!r}; send only {', '.join(FIELDS)}")
        payload = {**body, "stream": True}
        client = httpx.AsyncClient(timeout=httpx.Timeout(None, connect=CONNECT_S))
        try:
            resp = await client.send(client.build_request("POST", server + "/v1/chat/completions", json=payload,
                                                          headers=self.headers), stream=True)
        except httpx.HTTPError as e:
            await client.aclose()
            raise _unanswered(server, e) from e
        if resp.status_code != 200:
            content = await resp.aread()
            await resp.aclose()
            await client.aclose()
            status = resp.status_code if 400 <= resp.status_code < 500 else 502
            raise ConsoleError(status, f"the server refused the chat: {_reason(content, resp.status_code)}")

        async def relay():
            try:
                async for chunk in resp.aiter_raw():
                    yield chunk
            finally:
                await resp.aclose()
                await client.aclose()

        return relay()


def _unanswered(server: str, e: Exception) -> ConsoleError:
    return ConsoleError(502, f"the server at {server} did not answer ({type(e).__name__}); is `longhaul serve` running there?")


def _reason(content: bytes, status: int) -> str:
    """The server's own error line (OpenAI's {"error": {"message"}} or the console's {"error"}),
    else its status."""
    try:
        err = json.loads(content).get("error")
    except (ValueError, AttributeError):
        err = None
    if isinstance(err, dict):
        err = err.get("message")
    return f"HTTP {status}: {err}" if err else f"HTTP {status}"
