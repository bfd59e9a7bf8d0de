"""The endpoint's HTTP server: aiohttp.web on the rank's event loop (the one the engine is driven from), so a
request's generation joins the running batch with no thread hop.

Why aiohttp.web: it is already installed (vLLM depends on it), its `AppRunner` / `TCPSite` are made to run inside
an event loop someone else owns (uvicorn's `Server` is made to own the process: it installs its own SIGINT / SIGTERM
handlers on the main thread, where nanosky's graceful stop has its own), and one library covers what real clients
send: chunked request bodies, `Expect: 100-continue`, keep-alive, and streamed responses (server-sent events).

    server = await serve(handler, host="127.0.0.1", port=0)   # handler(method, path, headers, body) -> (status, obj)
    server.port; await server.close()

The handler's `obj` is a JSON-able body, or an `EventStream` (`stream: true`): its events are sent as
`data: {json}` lines, then `data: [DONE]`. Every reply is JSON with OpenAI's error shape when it is an error: a bad
request is a 4xx, a bug of ours a 500 that says so, never a traceback or an HTML page.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

MAX_BODY = 16 * 2**20
"""Largest request body read (16 MiB): a long agent conversation is well under it."""
SHUTDOWN_S = 2.0
"""How long a closing server waits for requests in flight before it cancels them."""
Handler = Callable[[str, str, dict[str, str], bytes], Awaitable[tuple[int, Any]]]


@dataclass
class EventStream:
    """A streamed reply: each event a `data:` line of server-sent events, then `data: [DONE]`."""

    events: list[dict]


def error(status: int, message: str, code: str | None = None, param: str | None = None) -> tuple[int, dict]:
    """An OpenAI-style error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return status, {"error": {"message": message, "type": kind, "param": param, "code": code}}


class Server:
    def __init__(self, runner: web.AppRunner, host: str, port: int):
        self.runner, self.host, self.port = runner, host, port

    async def close(self) -> None:
        await self.runner.cleanup()


async def serve(handler: Handler, host: str = "127.0.0.1", port: int = 0) -> Server:
    async def route(request: web.Request) -> web.StreamResponse:
        try:
            body = await request.read()  # chunked or Content-Length, after `100 Continue` when asked
        except web.HTTPRequestEntityTooLarge:
            return _json(*error(413, f"the body is over {MAX_BODY} bytes"))
        headers = {k.lower(): v for k, v in request.headers.items()}
        try:
            status, obj = await handler(request.method, request.path, headers, body)
        except Exception as e:  # noqa: BLE001 - a bug of ours: say so, in the same shape, and keep serving
            status, obj = error(500, f"internal error: {type(e).__name__}: {e}")
        if isinstance(obj, EventStream):
            return await _stream(request, obj)
        return _json(status, obj)

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/{path:.*}", route)
    runner = web.AppRunner(app, handle_signals=False, access_log=None, shutdown_timeout=SHUTDOWN_S)
    await runner.setup()
    site = web.TCPSite(runner, host, port)
    await site.start()
    return Server(runner, host, runner.addresses[0][1])


def _json(status: int, obj: Any) -> web.Response:
    return web.Response(status=status, body=json.dumps(obj).encode(), content_type="application/json")


async def _stream(request: web.Request, stream: EventStream) -> web.StreamResponse:
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await resp.prepare(request)
    for event in stream.events:
        await resp.write(b"data: " + json.dumps(event).encode() + b"\n\n")
    await resp.write(b"data: [DONE]\n\n")
    await resp.write_eof()
    return resp
