"""`envs.tools.tool_call_grammar`: the grammar constrained decoding samples swe's turns under. It must admit every
call the expert makes (else the constraint would forbid the demonstrated behaviour) and refuse the malformed calls
the agent model made under RL (bad JSON, made-up argument names, arguments of another command)."""

import json

import pytest

import envs
from envs.tools import BashTool, StrReplaceEditor, format_tool_call, tool_call_grammar
from envs.tools.grammar import call_schema


@pytest.fixture(scope="module")
def swe_tok():
    from transformers import AutoTokenizer

    from nanosky.tiny import SWE_DIR

    return AutoTokenizer.from_pretrained(str(SWE_DIR))


@pytest.fixture(scope="module")
def matcher(swe_tok):
    """accepts(text) -> whether the grammar admits `text` followed by the end-of-turn token, token by token."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(
        swe_tok, vocab_size=len(swe_tok), stop_token_ids=[swe_tok.eos_token_id]
    )
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar(
        envs.make("swe", split="train", seed=0, level=1).action_grammar()
    )

    def accepts(text: str) -> bool:
        m = xgr.GrammarMatcher(compiled)
        ids = swe_tok(text, add_special_tokens=False).input_ids + [swe_tok.eos_token_id]
        return all(m.accept_token(i) for i in ids) and m.is_terminated()

    return accepts


def test_every_expert_call_is_admitted(matcher):
    """Every turn of the scripted expert, on generated tasks of each level and on the shipped suite."""
    seen, plans = set(), []
    for level in (1, 2, 3):
        for seed in range(4):
            plans.append(_plan(envs.make("swe", split="train", seed=seed, level=level)))
    plans.append(_plan(envs.make("swe", split="test", seed=0)))
    for turn in (t for plan in plans for t in plan):
        assert matcher(turn), turn
        call = json.loads(turn[len("<tool_call>") : -len("</tool_call>")])
        seen.add((call["name"], call["arguments"].get("command")))
    assert {("submit", None), ("str_replace_editor", "view"), ("str_replace_editor", "str_replace")} <= seen
    assert any(name == "bash" for name, _ in seen)


def _plan(env) -> list[str]:
    env.reset()
    try:
        return list(env.plan)
    finally:
        env.finish()


@pytest.mark.parametrize(
    "args",
    [
        {"command": "view", "path": "a.py", "view_range": [3, -1]},
        {"command": "create", "path": "b.py", "file_text": "x = 1\n"},
        {"command": "str_replace", "path": "a.py", "old_str": 'print("a\\tb")', "new_str": "é"},
        {"command": "str_replace", "path": "a.py", "old_str": "x"},  # new_str may be left out (a deletion)
        {"command": "insert", "path": "a.py", "insert_line": 0, "new_str": "import os"},
        {"command": "replace_lines", "path": "a.py", "line_range": [11, 12], "new_str": "    return a + b"},
        {"command": "undo_edit", "path": "a.py"},
    ],
)
def test_each_editor_command_is_admitted(matcher, args):
    assert matcher(format_tool_call("str_replace_editor", args))


@pytest.mark.parametrize(
    "text",
    [
        '<tool_call>{"name": "bash", "arguments": {"command": "ls",}}</tool_call>',  # bad JSON
        '<tool_call>{"name": "bash" "arguments": {"command": "ls"}}</tool_call>',  # Expecting ',' delimiter
        format_tool_call("python", {"code": "1"}),  # no such tool
        format_tool_call("bash", {"cmd": "ls"}),  # made-up argument name
        format_tool_call("str_replace_editor", {"command": "replace_lines", "path": "a.py", "line_str": "x"}),
        format_tool_call(
            "str_replace_editor", {"command": "str_replace", "path": "a.py", "new_str": "x"}
        ),  # no old_str
        format_tool_call(
            "str_replace_editor", {"command": "view", "path": "a.py", "old_str": "x"}
        ),  # not view's
        format_tool_call(
            "str_replace_editor", {"command": "replace_lines", "path": "a", "line_range": [3], "new_str": ""}
        ),
        format_tool_call(
            "str_replace_editor", {"command": "insert", "path": "a.py", "insert_line": "3", "new_str": ""}
        ),
        format_tool_call("str_replace_editor", {"command": "delete", "path": "a.py"}),
        format_tool_call("submit", {"now": True}),
        format_tool_call("bash", {"command": "ls"}) + format_tool_call("submit", {}),  # one call per turn
        "I will look at the file first.",
        '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}',  # no closing tag
    ],
)
def test_malformed_calls_are_refused(matcher, text):
    assert not matcher(text)


def test_schema_and_errors():
    editor, bash = StrReplaceEditor(), BashTool()
    names = [case["properties"]["name"]["const"] for case in call_schema([bash, editor])["anyOf"]]
    assert names == ["bash", "str_replace_editor"]
    # the strict schema is the tool's own where the tool does not narrow it
    assert bash.arguments_schema == {**bash.parameters, "additionalProperties": False}
    commands = [c["properties"]["command"]["const"] for c in editor.arguments_schema["anyOf"]]
    assert sorted(commands) == sorted(editor.parameters["properties"]["command"]["enum"])
    assert tool_call_grammar([bash]) == tool_call_grammar([BashTool()])  # cached by schema, not by object
    with pytest.raises(ValueError, match="at least one tool"):
        tool_call_grammar([])
    assert envs.make("tool_use", split="train", seed=0).action_grammar() is None  # free text by default
