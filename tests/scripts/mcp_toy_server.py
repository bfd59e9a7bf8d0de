"""A toy MCP server for the tests (the `mcp` SDK's MCPServer): a notes file in the working folder, tool_use's
calculator (its name, description and answers), and faults on demand.
`python mcp_toy_server.py [--folder DIR] [--http PORT] [--calls FILE]`: stdio by default, streamable HTTP on
127.0.0.1:PORT; `--calls` appends each calculator call's expression to FILE (what reached this server)."""

import os
import sys
import time

from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
from envs.tools.calculator import CalculatorTool  # noqa: E402

server = MCPServer("toy", log_level="WARNING")
CALLS = sys.argv[sys.argv.index("--calls") + 1] if "--calls" in sys.argv else None


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def note(text: str) -> str:
    """Append a line to notes.txt in the server's folder; returns every line so far."""
    with open("notes.txt", "a") as f:
        f.write(text + "\n")
    return open("notes.txt").read()


@server.tool()
def fail(reason: str) -> str:
    """A tool error (is_error)."""
    raise ToolError(reason)


@server.tool()
def hang() -> str:
    """Never answers."""
    time.sleep(3600)
    return ""


@server.tool()
def die() -> str:
    """The server exits mid-call."""
    os._exit(3)


@server.tool()
def garble() -> str:
    """Writes a line that is not JSON-RPC to the protocol stream, then never answers."""
    sys.stdout.write("this is not json\n")
    sys.stdout.flush()
    time.sleep(3600)
    return ""


@server.tool(description=CalculatorTool.description)
def calculator(expression: str) -> str:
    if CALLS:
        with open(CALLS, "a") as f:
            f.write(expression + "\n")
    return CalculatorTool()(expression)


if __name__ == "__main__":
    if "--folder" in sys.argv:
        os.chdir(sys.argv[sys.argv.index("--folder") + 1])
    if "--http" in sys.argv:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[sys.argv.index("--http") + 1]))
    else:
        server.run()
