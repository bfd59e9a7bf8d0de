"""`python -m nanosky.view RUN_DIR --serve`: the page over HTTP, on 127.0.0.1 unless told otherwise, re-rendered when
a file of the run changes (a run that is still going: reload the page to see its new steps). aiohttp.web, as the
endpoint's server (`nanosky/endpoint/http.py`): already installed with vLLM."""

from __future__ import annotations

from aiohttp import web

from nanosky.view import render
from nanosky.view.data import mtime


def app(path: str, max_bytes: int) -> web.Application:
    """GET / is the page; any other path or method is a 404 / 405 with a one-line text, never a 500."""
    cache: dict[str, object] = {"at": None, "html": ""}

    async def page(_request: web.Request) -> web.Response:
        try:
            at = mtime(path)
        except OSError:
            return web.Response(status=404, text=f"{path}: no such directory (any more)\n")
        if cache["at"] != at:
            cache["html"], cache["at"] = render(path, max_bytes), at
        return web.Response(text=cache["html"], content_type="text/html", headers={"Cache-Control": "no-store"})

    a = web.Application()
    a.router.add_get("/", page)
    a.router.add_get("/view.html", page)
    return a


def serve(path: str, host: str = "127.0.0.1", port: int = 8765, max_bytes: int = 25 << 20) -> None:
    """Serve until Ctrl-C."""
    render(path, max_bytes)  # a bad RUN_DIR is one line before anything binds
    print(f"rollout viewer: http://{host}:{port}/  (re-read on every reload; Ctrl-C stops)", flush=True)
    web.run_app(app(path, max_bytes), host=host, port=port, print=None)
