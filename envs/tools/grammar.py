"""The grammar of one well-formed tool call, for constrained decoding (`--rollout.constrain-actions` on tool envs).

    tool_call_grammar([bash, editor, submit])   # EBNF text: vLLM's structured_outputs grammar, xgrammar's syntax

A reply that matches it is exactly one call as `format_tool_call` writes it,
`<tool_call>{"name": N, "arguments": {...}}</tool_call>`: N is one of the tools, the arguments follow that tool's
`arguments_schema` (its own keys in its order, the declared types, nothing else), separators as `json.dumps`
writes them. So a sampled turn always parses, names a real tool and passes arguments the tool accepts; what it
cannot fix is a wrong value (an old_str that is not in the file), which stays the env's observation to give.

Built with xgrammar (vLLM's structured-output backend, installed with it; imported only when called), from a JSON
schema of the calls, so the engine and the trainer's replay (`nanosky.constrain`) compile the same text.
"""

from __future__ import annotations

import functools
import json

from envs.tools.parse import CLOSE, OPEN


def call_schema(tools) -> dict:
    """JSON schema of one call's `{"name": ..., "arguments": ...}` object, any of `tools`."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": t.name}, "arguments": t.arguments_schema},
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


def tool_call_grammar(tools) -> str:
    """EBNF text of exactly one call of one of `tools` (objects with `.name` and `.arguments_schema`)."""
    if not tools:
        raise ValueError("tool_call_grammar needs at least one tool")
    return _grammar(json.dumps(call_schema(tools)))


@functools.lru_cache(maxsize=64)
def _grammar(schema: str) -> str:
    import xgrammar as xgr

    # any_whitespace=False: ", " and ": " only, as json.dumps (and so the demonstrations) write them; strict: no
    # key the schema does not name
    body = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
    tag = xgr.Grammar.from_ebnf
    return str(
        xgr.Grammar.concat(tag(f"root ::= {json.dumps(OPEN)}"), body, tag(f"root ::= {json.dumps(CLOSE)}"))
    )
