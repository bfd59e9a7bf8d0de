"""A blocking client of one MCP server (stdio command or streamable-HTTP URL) for env code, which is synchronous.

    server = MCPServer("mcp-server-sqlite --db-path /tmp/ep/shop.db")     # or MCPServer(url="http://127.0.0.1:8000/mcp")
    server.tools()                          # [{"name", "description", "input_schema"}]: the server's list_tools
    server.call("read_query", {"query": "SELECT 1"}, timeout_s=10)   # (text, is_error)
    server.close()

The `mcp` SDK is asyncio; each server gets one event-loop thread (anyio's blocking portal), and the client's context
is entered and left inside it. A fault of the server (it exits, stops answering within the timeout, or breaks the
protocol) raises `ServerFault` and marks the server `broken`: the env that saw it loses that trajectory, and the next
episode starts a new server. A tool's own error (`is_error`) is a result, not a fault.
"""

from __future__ import annotations

import os
import shlex
import shutil
import sys
import tempfile
from typing import Any

SERVERS_DIR = os.path.join(sys.prefix, "mcp-servers")
"""Where `make install` puts reference servers that need their own environment (mcp-server-sqlite needs mcp<2):
`{SERVERS_DIR}/<name>/bin/<name>`, found when the command's program is not on PATH."""


class ServerFault(RuntimeError):
    """The MCP server exited, hung past its timeout or broke the protocol: the episode is lost, not the run."""


def resolve_command(command: str) -> list[str]:
    """The argv of a server command: its program from PATH, else this interpreter's environment (a server installed
    with it: mcp-server-time), else `SERVERS_DIR`; one line when none has it."""
    argv = shlex.split(command)
    if not argv:
        raise ValueError("MCP server command is empty")
    program = argv[0]
    if os.sep in program or shutil.which(program):
        return argv
    for found in (
        os.path.join(os.path.dirname(sys.executable), program),
        os.path.join(SERVERS_DIR, program, "bin", program),
    ):
        if os.path.exists(found):
            return [found, *argv[1:]]
    raise ValueError(
        f"MCP server {program!r} is not on PATH, beside {sys.executable} nor in {SERVERS_DIR} "
        "(`make install` puts mcp-server-sqlite there)"
    )


class MCPServer:
    """One live connection: a stdio server process it started (`command`, run in `cwd`), or a URL it connects to."""

    def __init__(self, command: str | None = None, url: str | None = None, cwd: str | None = None, timeout_s=30.0):
        from anyio.from_thread import start_blocking_portal
        from mcp import Client, StdioServerParameters, stdio_client

        if (command is None) == (url is None):
            raise ValueError("MCPServer: give one of command (stdio) or url (streamable HTTP)")
        self.label, self.broken = command or url, None
        self.stderr = tempfile.TemporaryFile(mode="w+") if command else None  # the server's log, for fault lines
        if command:
            argv = resolve_command(command)
            # the server gets this process's environment (PATH, HOME, ...): the SDK's default passes only a few
            params = StdioServerParameters(command=argv[0], args=argv[1:], env=dict(os.environ), cwd=cwd)
            target: Any = stdio_client(params, errlog=self.stderr)
        else:
            target = url
        self._portal_cm = start_blocking_portal(backend="asyncio")
        self._portal = self._portal_cm.__enter__()
        try:
            self._client_cm = self._portal.wrap_async_context_manager(Client(target, read_timeout_seconds=timeout_s))
            self._client = self._client_cm.__enter__()
            self._tools = [
                {"name": t.name, "description": t.description or "", "input_schema": t.input_schema}
                for t in self._portal.call(self._client.list_tools).tools
            ]
        except Exception as e:  # noqa: BLE001 - any start-up failure is one line naming the server
            why = f"MCP server {self.label!r} did not start: {one_line(e)}{self._log_tail()}"
            self.close()  # a session entered before list_tools failed is left too: no orphaned server process
            raise ServerFault(why) from None

    def tools(self) -> list[dict]:
        return list(self._tools)

    def call(self, name: str, arguments: dict, timeout_s: float) -> tuple[str, bool]:
        """The tool's text content and its is_error flag; `ServerFault` when the server fails."""
        if self.broken:
            raise ServerFault(self.broken)
        try:
            result = self._portal.call(lambda: self._client.call_tool(name, arguments, read_timeout_seconds=timeout_s))
        except Exception as e:  # noqa: BLE001 - the server is gone or hung: this episode's loss
            self.broken = f"MCP server {self.label!r}: {name} failed: {one_line(e)}{self._log_tail()}"
            raise ServerFault(self.broken) from None
        text = "\n".join(c.text for c in result.content if getattr(c, "type", "") == "text")
        return text, bool(result.is_error)

    def close(self) -> None:
        """Leave the session and stop the process (the SDK closes its stdin, then terminates, then kills it)."""
        try:
            if hasattr(self, "_client"):  # entered (not where start-up failed before the session opened)
                self._client_cm.__exit__(None, None, None)
        except Exception:  # noqa: BLE001 - closing a broken session
            pass
        try:
            self._portal_cm.__exit__(None, None, None)
        except Exception:  # noqa: BLE001
            pass
        if self.stderr:
            self.stderr.close()

    def _log_tail(self) -> str:
        return log_tail(self.stderr, "stderr")


def log_tail(log, name: str) -> str:
    """A server's last non-empty log line, as a fault line's ending ("" when there is none)."""
    if not log:
        return ""
    try:
        log.seek(0)
        lines = [ln for ln in log.read().splitlines() if ln.strip()]
    except (OSError, ValueError):
        return ""
    return f" (its {name} ends: {lines[-1][:200]!r})" if lines else ""


def one_line(e: BaseException) -> str:
    """An exception in one line; exception groups (anyio task groups) by their first leaf."""
    while getattr(e, "exceptions", None):
        e = e.exceptions[0]
    return f"{type(e).__name__}: {e}"[:300]
