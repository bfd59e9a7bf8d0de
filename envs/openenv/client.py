"""Blocking clients of OpenEnv servers for env code, which is synchronous: the WebSocket protocol of
`openenv.core.env_server` (one connection = one session with an environment of its own), spoken directly.

    servers = Servers(app="my_env.server:app")        # started by nanosky on free loopback ports; or url="http://..."
    session, first = servers.open({"type": "reset", "data": {"seed": 3}})   # first: {"observation", "reward", "done"}
    reply = session.request({"type": "step", "data": {"message": "hi"}}, timeout_s=30)
    session.close()                                    # the session's environment is closed by the server
    servers.close()                                    # stops the servers it started

Messages are `{"type": "reset" | "step" | "state" | "close", "data": ...}`; replies `{"type": "observation" |
"state" | "error", "data": ...}`. An app server is a child process (`python -m envs.openenv.serve APP FD PID`,
uvicorn on a socket bound here, so no port race), stopped with its worker; it exits by itself if the worker dies.
A server that refuses a session (its `max_concurrent_envs` reached: OpenEnv's default is 1) gets a sibling: a worker
runs as many app servers as it has episodes in flight. A fault (the connection closes, no reply within the timeout,
a reply that is not the protocol's JSON, an error from the env's reset or step) raises `ServerFault` and costs that
session only; a server whose process died, or that hangs with no other session on it, is stopped, and the next
episode starts a new one.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

from envs.mcp.client import ServerFault, log_tail, one_line


class CapacityError(ServerFault):
    """The server refused a new session: it already holds its `max_concurrent_envs`."""


class Server:
    """One OpenEnv server: a URL it was given, or an app it started (`app` is MODULE:ATTR or FILE.py:ATTR)."""

    def __init__(self, url: str | None = None, app: str | None = None, start_timeout_s: float = 60.0):
        self.proc, self.log, self.sessions, self.capacity = None, None, 0, None
        if app is not None:
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind(("127.0.0.1", 0))
            sock.listen(64)
            url = f"http://127.0.0.1:{sock.getsockname()[1]}"
            self.log = tempfile.TemporaryFile(mode="w+")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.getcwd(), os.environ.get("PYTHONPATH", "")]))
            cmd = [sys.executable, "-m", "envs.openenv.serve", app, str(sock.fileno()), str(os.getpid())]
            self.proc = subprocess.Popen(cmd, pass_fds=[sock.fileno()], stdout=self.log, stderr=self.log, env=env)
            sock.close()  # the child holds it now
        self.label, self.url = app or url, url.rstrip("/")
        self.ws_url = "ws" + self.url[4:] + "/ws" if self.url.startswith("http") else self.url + "/ws"
        if self.proc is not None:
            self._wait_ready(start_timeout_s)

    def _wait_ready(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise ServerFault(f"OpenEnv app {self.label!r} exited at start-up{self.log_tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.1)
        why = f"OpenEnv app {self.label!r} did not answer /health within {timeout_s:g}s{self.log_tail()}"
        self.stop()
        raise ServerFault(why)

    def schema(self) -> dict:
        """GET /schema: {"action", "observation", "state"} JSON schemas."""
        try:
            with urllib.request.urlopen(self.url + "/schema", timeout=30) as r:
                return json.loads(r.read())
        except (OSError, ValueError) as e:
            raise ServerFault(f"OpenEnv server {self.label!r}: /schema failed: {e}{self.log_tail()}") from None

    @property
    def alive(self) -> bool:
        return self.proc is None or self.proc.poll() is None

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()

    def log_tail(self) -> str:
        return log_tail(self.log, "log")


class Session:
    """One WebSocket session: an environment of its own on `server`."""

    def __init__(self, server: Server, timeout_s: float):
        from websockets.sync.client import connect

        self.server, self.closed = server, False
        try:
            self.ws = connect(server.ws_url, open_timeout=timeout_s, max_size=2**24, close_timeout=1, proxy=None)
        except Exception as e:  # noqa: BLE001 - refused, reset, timed out: this session's fault
            raise ServerFault(f"OpenEnv server {server.label!r}: cannot open a session: {one_line(e)}") from None
        server.sessions += 1

    def request(self, message: dict, timeout_s: float) -> dict:
        """The reply's `data` to one message; `ServerFault` (`CapacityError`) when the server fails (refuses)."""
        kind = message["type"]
        try:
            try:
                self.ws.send(json.dumps(message))
            except Exception:  # noqa: BLE001 - closed already: what it said before closing is still to be read
                timeout_s = min(timeout_s, 1.0)  # (a full server's refusal comes unasked, then it closes)
            raw = self.ws.recv(timeout=timeout_s)
        except TimeoutError:
            raise self._fault(f"{kind}: no reply within {timeout_s:g}s", hung=True) from None
        except Exception as e:  # noqa: BLE001 - the connection closed or broke
            raise self._fault(f"{kind}: {one_line(e)}") from None
        try:
            reply = json.loads(raw)
            rtype, data = reply["type"], reply["data"]
        except (ValueError, TypeError, KeyError):
            raise self._fault(f"{kind}: a reply outside the protocol: {str(raw)[:120]!r}") from None
        if rtype == "error":
            code, text = data.get("code"), data.get("message", "")
            if code == "CAPACITY_REACHED":
                self.close()
                raise CapacityError(f"OpenEnv server {self.server.label!r} is full: {text}")
            raise self._fault(f"{kind}: the env answered {code}: {text[:300]}")
        return data

    def _fault(self, why: str, hung: bool = False) -> ServerFault:
        server = self.server
        self.close()
        if not hung and server.proc is not None:  # a connection that broke: is its server exiting? (reap it)
            try:
                server.proc.wait(timeout=2)
            except subprocess.TimeoutExpired:
                pass
        if not server.alive:
            why += f" (the server exited with status {server.proc.returncode})"
        elif hung and server.proc is not None and server.sessions == 0:
            server.stop()  # hung with no other session on it: restart rather than keep a busy process
        return ServerFault(f"OpenEnv server {server.label!r}: {why}{server.log_tail()}")

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        self.server.sessions -= 1
        try:
            self.ws.send(json.dumps({"type": "close", "data": {}}))
        except Exception:  # noqa: BLE001 - closing a broken connection
            pass
        try:
            self.ws.close()
        except Exception:  # noqa: BLE001
            pass


class Servers:
    """The servers of one worker: a URL's one, or as many started app servers as its episodes need at once."""

    MAX_APP_SERVERS = 64

    def __init__(self, url: str | None = None, app: str | None = None, start_timeout_s: float = 60.0):
        if (url is None) == (app is None):
            raise ValueError("env 'openenv' needs one of --env-kwargs.url URL or --env-kwargs.app MODULE:APP")
        self.url, self.app, self.start_timeout_s = url, app, start_timeout_s
        self.servers: list[Server] = []
        self._schema: dict | None = None

    def schema(self) -> dict:
        if self._schema is None:
            self._schema = (self.servers[0] if self.servers else self._start()).schema()
        return self._schema

    def open(self, first: dict, timeout_s: float) -> tuple[Session, dict]:
        """A new session and the reply to its first message, on a server with room (a new one if none has)."""
        self.servers = [s for s in self.servers if s.alive]
        for server in [s for s in self.servers if s.capacity is None or s.sessions < s.capacity]:
            try:
                return self._first(Session(server, timeout_s), first, timeout_s)
            except CapacityError:
                server.capacity = server.sessions
        if self.app is None:
            raise ServerFault(
                f"OpenEnv server {self.url!r} refused a session: it holds its max_concurrent_envs; serve it with "
                "as many as the run has episodes in flight (or give --env-kwargs.app: nanosky then starts more)"
            )
        if len(self.servers) >= self.MAX_APP_SERVERS:
            raise ServerFault(f"OpenEnv app {self.app!r}: {self.MAX_APP_SERVERS} servers in this worker, all full")
        return self._first(Session(self._start(), timeout_s), first, timeout_s)

    def _first(self, session: Session, first: dict, timeout_s: float) -> tuple[Session, dict]:
        return session, session.request(first, timeout_s)

    def _start(self) -> Server:
        server = Server(url=self.url, app=self.app, start_timeout_s=self.start_timeout_s)
        self.servers.append(server)
        return server

    def close(self) -> None:
        for server in self.servers:
            server.stop()
        self.servers = []
