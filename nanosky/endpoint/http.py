"""A minimal HTTP/1.1 server on asyncio streams: enough for OpenAI clients (httpx keep-alive, Content-Length
bodies), in the event loop that already drives the engine, so a request's generation joins the running batch.
No new dependency, and every reply is built here: bad input is a 4xx with a JSON body, never a traceback.

    server = await serve(handler, host="127.0.0.1", port=0)    # handler(method, path, headers, body) -> (status, obj)
    port = server.sockets[0].getsockname()[1]
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from typing import Any

MAX_BODY = 16 * 2**20
"""Largest request body read (16 MiB): a long agent conversation is well under it."""
Handler = Callable[[str, str, dict[str, str], bytes], Awaitable[tuple[int, Any]]]


def error(status: int, message: str, code: str | None = None) -> tuple[int, dict]:
    """An OpenAI-style error body."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return status, {"error": {"message": message, "type": kind, "code": code}}


async def serve(handler: Handler, host: str = "127.0.0.1", port: int = 0) -> asyncio.Server:
    async def on_client(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while await _one(reader, writer, handler):
                pass
        except (ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # the client went away
        except asyncio.CancelledError:
            pass  # the server stopped with the connection open (keep-alive): end quietly
        finally:
            writer.close()

    return await asyncio.start_server(on_client, host, port, limit=2**20)


async def _one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, handler: Handler) -> bool:
    """Serve one request; returns whether the connection stays open."""
    line = await reader.readline()
    if not line:
        return False
    try:
        method, target, version = line.decode("latin-1").split()
    except ValueError:
        await _send(writer, *error(400, "malformed request line"), keep=False)
        return False
    headers: dict[str, str] = {}
    while (h := await reader.readline()) not in (b"\r\n", b"\n", b""):
        name, _, value = h.decode("latin-1").partition(":")
        headers[name.strip().lower()] = value.strip()
    if headers.get("transfer-encoding", "").lower() == "chunked":
        await _send(writer, *error(411, "send the body with a Content-Length"), keep=False)
        return False
    try:
        size = int(headers.get("content-length", "0"))
    except ValueError:
        size = -1
    if not 0 <= size <= MAX_BODY:
        await _send(writer, *error(413 if size > MAX_BODY else 400, "bad Content-Length"), keep=False)
        return False
    body = await reader.readexactly(size) if size else b""
    keep = version == "HTTP/1.1" and headers.get("connection", "").lower() != "close"
    try:
        status, obj = await handler(method, target.split("?", 1)[0], headers, body)
    except Exception as e:  # noqa: BLE001 - a bug of ours: say so, in the same shape, and keep serving
        status, obj = error(500, f"internal error: {type(e).__name__}: {e}")
    await _send(writer, status, obj, keep)
    return keep


async def _send(writer: asyncio.StreamWriter, status: int, obj: Any, keep: bool) -> None:
    data = json.dumps(obj).encode()
    head = (
        f"HTTP/1.1 {status} {HTTPStatus(status).phrase}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\nConnection: {'keep-alive' if keep else 'close'}\r\n\r\n"
    )
    writer.write(head.encode("latin-1") + data)
    await writer.drain()
