"""Tool calls out of model text: `parse_tool_calls(text) -> list[ToolCall]`, never raising.

Accepted, one call per `<tool_call>...</tool_call>` block (several per turn are fine):
    <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>    (Qwen / Hermes)
    <tool_call>{"tool": "calculator", "args": {"expression": "2+2"}}</tool_call>          (design doc)
    <tool_call>{"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"}</tool_call>   (OpenAI API)
    <tool_call>{"type": "function", "function": {"name": ..., "arguments": ...}}</tool_call>
A missing closing tag (generation stopped at it) and a ```json fence inside the block are tolerated. A block
that cannot be understood yields a call with `.error` set, so the model can be told what was wrong.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_DECODER = json.JSONDecoder()


@dataclass
class ToolCall:
    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    error: str | None = None  # set when the block was malformed; name/arguments are then best effort
    raw: str = ""  # the block's text, for logs


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """The canonical text of one call, as the warm-start demonstrations write it."""
    return f"{OPEN}{json.dumps({'name': name, 'arguments': arguments}, ensure_ascii=False)}{CLOSE}"


MAX_CALLS = 256
"""Blocks read per text. More become one error call: no env runs thousands of calls in a turn, and the bound keeps
parsing linear-time on adversarial text (each malformed block costs a JSON exception)."""


def parse_tool_calls(text: str) -> list[ToolCall]:
    if not isinstance(text, str):
        return []
    try:
        blocks = _blocks(text, MAX_CALLS + 1)
        calls = [_parse_block(block) for block in blocks[:MAX_CALLS]]
        if len(blocks) > MAX_CALLS:
            n = text.count(OPEN)
            calls.append(ToolCall("", {}, f"too many <tool_call> blocks ({n}); only the first {MAX_CALLS} are read"))
        return calls
    except Exception as e:  # noqa: BLE001 - belt and braces: the contract is "never raises"
        return [ToolCall("", {}, f"could not parse tool call: {type(e).__name__}", text[:200])]


def _blocks(text: str, limit: int) -> list[str]:
    """Contents of every <tool_call> block; a block ends at its close tag, the next open tag or the text end.

    At most `limit` blocks. Linear in len(text): the next close tag is searched for again only once the scan has passed it (searching it
    from every opener made 20,000 unclosed openers in 1 MB take seconds)."""
    out, pos, n = [], 0, len(text)
    close = -1  # position of the next close tag at or after `pos`; n when there is none
    while len(out) < limit and (start := text.find(OPEN, pos)) >= 0:
        start += len(OPEN)
        if close < start:
            close = text.find(CLOSE, start)
            close = n if close < 0 else close
        nxt = text.find(OPEN, start, close)  # only up to the close tag: each character is scanned once
        end = close if nxt < 0 else nxt
        out.append(text[start:end])
        pos = end
    return out


def _strip_fence(block: str) -> str:
    """Drop a ```json fence around a block (string ops: a regex with `\\s*` backtracks quadratically on whitespace)."""
    s = block.strip()
    if s.startswith("```"):
        i = 3
        while i < len(s) and s[i].isascii() and s[i].isalpha():
            i += 1
        s = s[i:]
    if s.endswith("```"):
        s = s[:-3]
    return s.strip()


def _parse_block(block: str) -> ToolCall:
    raw = block
    body = _strip_fence(block)
    if not body:
        return ToolCall("", {}, "empty <tool_call> block", raw)
    try:
        # An object is decoded once, trailing junk tolerated; anything else must be one whole JSON value.
        obj = _DECODER.raw_decode(body)[0] if body[0] == "{" else json.loads(body)
    except (ValueError, RecursionError) as e:
        obj = None if body[0] == "{" else _first_json_object(body)
        if obj is None:
            msg = e.msg if isinstance(e, json.JSONDecodeError) else type(e).__name__
            return ToolCall("", {}, f"invalid JSON in <tool_call>: {msg}", raw)
    if not isinstance(obj, dict):
        return ToolCall("", {}, "a tool call must be a JSON object with 'name' and 'arguments'", raw)
    if isinstance(obj.get("function"), dict):  # OpenAI's {"type": "function", "function": {...}}
        obj = obj["function"]
    name = obj.get("name", obj.get("tool"))
    if not isinstance(name, str) or not name.strip():
        return ToolCall("", {}, "tool call has no 'name'", raw)
    name = name.strip()
    args = next((obj[k] for k in ("arguments", "args", "parameters") if k in obj), {})
    if isinstance(args, str):
        if not args.strip():
            args = {}
        else:
            try:
                args = json.loads(args)
            except (ValueError, RecursionError):
                return ToolCall(name, {}, f"arguments of {name} are not valid JSON", raw)
    if args is None:
        args = {}
    if not isinstance(args, dict):
        return ToolCall(name, {}, f"arguments of {name} must be a JSON object", raw)
    return ToolCall(name, args, None, raw)


def _first_json_object(text: str) -> Any:
    """The first JSON value starting at a '{' (trailing junk ignored), or None."""
    start = text.find("{")
    if start < 0:
        return None
    try:
        return _DECODER.raw_decode(text, start)[0]
    except (ValueError, RecursionError):
        return None
