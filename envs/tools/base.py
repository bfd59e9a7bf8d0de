"""Tool interface, registry and the one place a tool call is executed.

A tool has a `.name`, a `.schema` (OpenAI function-calling JSON) and `__call__(**arguments) -> str`. Whatever goes
wrong in a call (unknown tool, bad arguments, timeout, crash) becomes an "Error: ..." string for the model via
`run_tool_call`, never an exception: a rollout must survive any text the policy emits.

    @register_tool
    def reverse(text: str) -> str:
        "Reverse a string."
        return text[::-1]

    get_tool("reverse").schema   # {"type": "function", "function": {"name": "reverse", ...}}
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from envs.tools.parse import ToolCall

_JSON_TYPES = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object"}


class Tool:
    """Subclasses set name/description/parameters (a JSON schema object) and implement __call__."""

    name: str = "tool"
    description: str = ""
    parameters: dict = {"type": "object", "properties": {}, "required": []}
    # True when the tool enforces `timeout_s` itself (python_exec's sandbox); then run() gets it directly
    # instead of being watched from a thread.
    manages_timeout: bool = False

    @property
    def schema(self) -> dict:
        return {
            "type": "function",
            "function": {"name": self.name, "description": self.description, "parameters": self.parameters},
        }

    @property
    def arguments_schema(self) -> dict:
        """The arguments of a well-formed call, strict (no other keys), for constrained decoding
        (`envs.tools.tool_call_grammar`): `parameters` by default; a tool whose commands take different arguments
        narrows it (the editor)."""
        return {**self.parameters, "additionalProperties": False}

    def __call__(self, **arguments: Any) -> str:
        raise NotImplementedError

    def run(self, arguments: dict, timeout_s: float) -> str:
        return self(**arguments)

    def __repr__(self) -> str:
        return f"<tool {self.name}>"


class FunctionTool(Tool):
    """A plain function as a tool; the schema comes from its signature and docstring."""

    def __init__(self, fn: Callable[..., Any], name: str | None = None, description: str | None = None):
        self.fn = fn
        self.name = name or fn.__name__
        doc = inspect.getdoc(fn) or ""
        self.description = description or doc.split("\n\n")[0].replace("\n", " ")
        props, required = {}, []
        for p in inspect.signature(fn).parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                continue
            ann = p.annotation if not isinstance(p.annotation, str) else _eval_annotation(p.annotation)
            props[p.name] = {"type": _JSON_TYPES.get(ann, "string")}
            if p.default is inspect.Parameter.empty:
                required.append(p.name)
        self.parameters = {"type": "object", "properties": props, "required": required}

    def __call__(self, **arguments: Any) -> str:
        out = self.fn(**arguments)
        return out if isinstance(out, str) else str(out)


def _eval_annotation(ann: str) -> Any:
    return {"str": str, "int": int, "float": float, "bool": bool, "list": list, "dict": dict}.get(ann, str)


# ---------------------------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Tool] = {}


def register_tool(obj: Any = None, *, name: str | None = None, description: str | None = None):
    """Register a function, a Tool subclass or a Tool instance under its name (or `name`).

    Usable bare (`@register_tool`) or with options (`@register_tool(name="rev")`). Returns `obj` unchanged.
    """

    def deco(target: Any) -> Any:
        if isinstance(target, Tool):
            tool = target
        elif isinstance(target, type) and issubclass(target, Tool):
            tool = target()
        elif callable(target):
            tool = FunctionTool(target, name=name, description=description)
        else:
            raise TypeError(f"register_tool: expected a function or Tool, got {type(target).__name__}")
        if name is not None:
            tool.name = name
        _REGISTRY[tool.name] = tool
        return target

    return deco(obj) if obj is not None else deco


def tool_names() -> list[str]:
    return sorted(_REGISTRY)


def get_tool(name: str) -> Tool:
    if name not in _REGISTRY:
        raise KeyError(f"unknown tool {name!r}; valid names: {', '.join(tool_names())}")
    return _REGISTRY[name]


# ---------------------------------------------------------------------------------------------- calls


@dataclass
class ToolResult:
    name: str
    arguments: dict
    output: str  # what the model sees (an "Error: ..." line when ok is False)
    ok: bool
    error: str | None = None
    latency_s: float = 0.0
    extra: dict = field(default_factory=dict)

    def to_message(self) -> dict:
        return {"role": "tool", "name": self.name, "content": self.output}

    def record(self) -> dict:
        """JSON-serialisable summary for trajectory logs and env info."""
        return {
            "name": self.name,
            "arguments": self.arguments,
            "ok": self.ok,
            "error": self.error,
            "latency_s": round(self.latency_s, 4),
        }


def validate_arguments(parameters: dict, arguments: Any) -> tuple[dict, str | None]:
    """Check `arguments` against a JSON-schema object (required, unknown and primitive types); coerce the
    harmless mismatches small models make (a number where a string is expected). Returns (args, error)."""
    if not isinstance(arguments, dict):
        return {}, f"arguments must be an object, got {type(arguments).__name__}"
    props = parameters.get("properties", {})
    if unknown := [k for k in arguments if k not in props]:
        return {}, f"unexpected argument {unknown[0]!r} (expected: {', '.join(props) or 'none'})"
    if missing := [k for k in parameters.get("required", []) if k not in arguments]:
        return {}, f"missing argument {missing[0]!r}"
    out = {}
    for key, value in arguments.items():
        want = props[key].get("type")
        if want == "string" and isinstance(value, (int, float)) and not isinstance(value, bool):
            value = str(value)
        elif want == "integer" and isinstance(value, str) and value.strip().lstrip("-").isdigit():
            value = int(value)
        elif want == "number" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        ok = {
            "string": lambda v: isinstance(v, str),
            "integer": lambda v: isinstance(v, int) and not isinstance(v, bool),
            "number": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
            "boolean": lambda v: isinstance(v, bool),
            "array": lambda v: isinstance(v, list),
            "object": lambda v: isinstance(v, dict),
        }.get(want, lambda v: True)(value)
        if not ok:
            return {}, f"argument {key!r} must be {want}, got {type(value).__name__}"
        out[key] = value
    return out, None


def run_tool_call(call: ToolCall, tools: Mapping[str, Tool] | Iterable[Tool], timeout_s: float = 10.0) -> ToolResult:
    """Execute one parsed call. Never raises: every failure is an `ok=False` result whose output says why."""
    start = time.monotonic()
    name = call.name if isinstance(call.name, str) else ""
    raw_args = call.arguments if isinstance(call.arguments, dict) else {}

    def fail(error: str) -> ToolResult:
        return ToolResult(name, raw_args, f"Error: {error}", False, error, time.monotonic() - start)

    try:
        table = dict(tools) if isinstance(tools, Mapping) else {t.name: t for t in tools}
        if call.error:
            return fail(call.error)
        if name not in table:
            return fail(f"unknown tool {name!r}; available: {', '.join(sorted(table))}")
        tool = table[name]
        args, error = validate_arguments(tool.parameters, call.arguments)
        if error:
            return fail(f"bad arguments for {name}: {error}")
        if tool.manages_timeout:
            output = tool.run(args, timeout_s)
        else:
            output = _run_with_deadline(tool, args, timeout_s)
    except _Timeout:
        return fail(f"{name} timed out after {timeout_s:g}s")
    except (Exception, SystemExit) as e:  # noqa: BLE001 - a crashing tool is the model's to see, not ours
        return fail(f"{name} failed: {type(e).__name__}: {e}")
    output = output if isinstance(output, str) else str(output)
    ok = not output.startswith("Error:")  # tools report domain errors (division by zero) the same way
    return ToolResult(name, args, output, ok, None if ok else output[7:].strip(), time.monotonic() - start)


class _Timeout(Exception):
    pass


def _run_with_deadline(tool: Tool, args: dict, timeout_s: float) -> str:
    """Run an in-process tool in a daemon thread and stop waiting at the deadline. The thread cannot be killed,
    so in-process tools must be cheap and bounded (ours are); anything risky belongs in the sandbox."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["out"] = tool.run(args, timeout_s)
        except BaseException as e:  # noqa: BLE001
            box["exc"] = e

    thread = threading.Thread(target=target, daemon=True, name=f"tool-{tool.name}")
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise _Timeout
    if "exc" in box:
        exc = box["exc"]
        raise exc if isinstance(exc, Exception) else RuntimeError(f"{type(exc).__name__}: {exc}")
    return box["out"]
