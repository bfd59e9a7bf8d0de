"""Tools for agent envs: registry, call parsing, safe execution, and the built-in tools.

    from envs.tools import get_tool, parse_tool_calls, run_tool_call
    calls = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "2**64"}}</tool_call>')
    result = run_tool_call(calls[0], {"calculator": get_tool("calculator")}, timeout_s=5)
    result.output    # "18446744073709551616"

Built-ins: calculator(expression), search(query), wiki(title), python_exec(code), bash(command) (envs/tools/bash.py)
and str_replace_editor(command, path, ...) (envs/tools/editor.py), both confined to a work tree. Add your own with
`@register_tool` on a typed function or a `Tool` subclass.
"""

from envs.tools.base import (
    FunctionTool,
    Tool,
    ToolResult,
    get_tool,
    register_tool,
    run_tool_call,
    tool_names,
    validate_arguments,
)
from envs.tools.bash import BashTool
from envs.tools.calculator import CalculatorTool
from envs.tools.editor import StrReplaceEditor
from envs.tools.grammar import tool_call_grammar
from envs.tools.parse import ToolCall, format_tool_call, parse_tool_calls
from envs.tools.python_exec import PythonExecTool
from envs.tools.sandbox import SandboxResult, run_sandboxed
from envs.tools.search import SearchTool
from envs.tools.wiki import WikiTool

for _tool in (CalculatorTool, SearchTool, WikiTool, PythonExecTool, BashTool, StrReplaceEditor):
    register_tool(_tool)

__all__ = [
    "Tool",
    "FunctionTool",
    "ToolCall",
    "ToolResult",
    "SandboxResult",
    "BashTool",
    "StrReplaceEditor",
    "get_tool",
    "register_tool",
    "tool_names",
    "parse_tool_calls",
    "format_tool_call",
    "tool_call_grammar",
    "run_tool_call",
    "run_sandboxed",
    "validate_arguments",
]
