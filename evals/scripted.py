"""A scripted OpenAI-compatible chat server (stdlib only): each reply comes from a Python function.

It drives an eval's `--base-url` path without a model, e.g. with an oracle that answers from the data (the tests
do this to check the plumbing end to end: client, tool turns, grading, report).

    with ScriptedServer(lambda messages: "<answer>42</answer>") as url:
        evals.math.main(["--base-url", url, "--limit", "3"])

`requests` records every chat request body, so a test can check what the client sent.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class _Server(ThreadingHTTPServer):
    request_queue_size = 128  # socketserver's 5 drops the SYNs of a burst: a client then waits 1 s to retry
    daemon_threads = True


class ScriptedServer:
    def __init__(self, reply: Callable[[list[dict]], str], model: str = "scripted"):
        self.reply, self.model, self.requests = reply, model, []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _send(self, code: int, body: dict) -> None:
                data = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def do_GET(self) -> None:
                if self.path.rstrip("/").endswith("/models"):
                    self._send(200, {"object": "list", "data": [{"id": server.model, "object": "model"}]})
                else:
                    self._send(404, {"error": "not found"})

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
                if not self.path.endswith("/chat/completions"):
                    return self._send(404, {"error": "not found"})
                server.requests.append(body)
                text = server.reply(body["messages"])
                n_prompt = sum(len(str(m.get("content", "")).split()) for m in body["messages"])
                self._send(
                    200,
                    {
                        "id": "chatcmpl-scripted",
                        "object": "chat.completion",
                        "model": server.model,
                        "choices": [
                            {"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": text}}
                        ],
                        "usage": {"prompt_tokens": n_prompt, "completion_tokens": len(text.split())},
                    },
                )

        self.httpd = _Server(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/v1"

    def __enter__(self) -> str:
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        return self.url

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
