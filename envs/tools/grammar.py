"""The grammar of one well-formed tool call, for constrained decoding (`--rollout.constrain-actions` on tool envs).

    tool_call_grammar([bash, editor, submit])   # EBNF text: vLLM's structured_outputs grammar, xgrammar's syntax

A reply that matches it is exactly one call as `format_tool_call` writes it,
`<tool_call>{"name": N, "arguments": {...}}</tool_call>`: N is one of the tools, the arguments follow that tool's
`arguments_schema` (its own keys in its order, the declared types, nothing else), separators as `json.dumps`
writes them. So a sampled turn always parses, names a real tool and passes arguments the tool accepts; what it
cannot fix is a wrong value (an old_str that is not in the file), which stays the env's observation to give.
`arguments` narrows some tools' schemas for one turn: the swe env's editor may then name only the paths that are
in the work tree (`StrReplaceEditor.arguments_schema_within(editor.tree_paths())`, env kwarg `constrain_paths`).

Built with xgrammar (vLLM's structured-output backend, installed with it; imported only when called), from a JSON
schema of the calls, so the engine and the trainer's replay (`nanosky.train.constrain`) compile the same text.
"""

from __future__ import annotations

import functools
import json

from envs.tools.parse import CLOSE, OPEN


def call_schema(tools, arguments: dict[str, dict] | None = None) -> dict:
    """JSON schema of one call's `{"name": ..., "arguments": ...}` object, any of `tools`; `arguments` replaces
    the named tools' `arguments_schema` (the editor's, narrowed to the paths that exist)."""
    arguments = arguments or {}
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {
                    "name": {"const": t.name},
                    "arguments": arguments.get(t.name, t.arguments_schema),
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
            for t in tools
        ]
    }


def tool_call_grammar(tools, arguments: dict[str, dict] | None = None) -> str:
    """EBNF text of exactly one call of one of `tools` (objects with `.name` and `.arguments_schema`; `arguments`:
    schemas that replace some tools' own, by name)."""
    if not tools:
        raise ValueError("tool_call_grammar needs at least one tool")
    return _grammar(json.dumps(call_schema(tools, arguments)))


@functools.lru_cache(maxsize=64)
def _grammar(schema: str) -> str:
    import xgrammar as xgr

    # any_whitespace=False: ", " and ": " only, as json.dumps (and so the demonstrations) write them; strict: no
    # key the schema does not name
    body = xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True)
    tag = xgr.Grammar.from_ebnf
    return str(xgr.Grammar.concat(tag(f"root ::= {json.dumps(OPEN)}"), body, tag(f"root ::= {json.dumps(CLOSE)}")))
