"""`envs.tools.tool_call_grammar`: the grammar constrained decoding samples swe's turns under. It must admit every
call the expert makes (else the constraint would forbid the demonstrated behaviour) and refuse the malformed calls
the agent model made under RL (bad JSON, made-up argument names, arguments of another command)."""

import json

import pytest

import envs
from envs.tools import BashTool, StrReplaceEditor, format_tool_call, parse_tool_calls, tool_call_grammar
from envs.tools.grammar import call_schema


@pytest.fixture(scope="module")
def swe_tok():
    from transformers import AutoTokenizer

    from nanosky.tiny import SWE_DIR

    return AutoTokenizer.from_pretrained(str(SWE_DIR))


@pytest.fixture(scope="module")
def matcher(swe_tok):
    """accepts(text) -> whether the grammar admits `text` followed by the end-of-turn token, token by token. The
    env's grammar before reset: no work tree yet, so any path (the paths' own test is below)."""
    return _accepts(swe_tok, envs.make("swe", split="train", seed=0, level=1).action_grammar())


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
        format_tool_call("str_replace_editor", {"command": "view", "path": "a.py", "old_str": "x"}),  # not view's
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


def _accepts(tok, grammar: str):
    """accepts(text) -> whether `grammar` admits `text` followed by the end-of-turn token, token by token."""
    import xgrammar as xgr

    info = xgr.TokenizerInfo.from_huggingface(tok, vocab_size=len(tok), stop_token_ids=[tok.eos_token_id])
    compiled = xgr.GrammarCompiler(info, max_threads=1).compile_grammar(grammar)

    def accepts(text: str) -> bool:
        m = xgr.GrammarMatcher(compiled)
        ids = tok(text, add_special_tokens=False).input_ids + [tok.eos_token_id]
        return all(m.accept_token(i) for i in ids) and m.is_terminated()

    return accepts


def test_editor_paths_are_the_work_trees_own(swe_tok):
    """After reset the editor may name only what is in the work tree (create excepted): the expert's whole episode
    is admitted turn by turn, a made-up path is refused, and a file the agent creates becomes admissible."""
    env = envs.make("swe", split="train", seed=1, level=2)
    env.reset()
    try:
        paths = env.editor.tree_paths()
        assert "." in paths and not any(p == ".git" or p.startswith(".git/") for p in paths)
        for turn in env.plan[:-1]:  # each turn under the grammar of the tree it was written for
            assert _accepts(swe_tok, env.action_grammar())(turn), turn
            assert not env.step(turn).done
        accepts = _accepts(swe_tok, env.action_grammar())
        src = next(p for p in paths if p.endswith(".py") and "test" not in p)
        made_up = src.replace(".py", "_x.py")
        assert accepts(format_tool_call("str_replace_editor", {"command": "view", "path": src}))
        assert not accepts(format_tool_call("str_replace_editor", {"command": "view", "path": made_up}))
        assert not accepts(
            format_tool_call(
                "str_replace_editor",
                {"command": "replace_lines", "path": "x/y.py", "line_range": [1, 1], "new_str": ""},
            )
        )
        create = {"command": "create", "path": made_up, "file_text": "x = 1\n"}
        assert accepts(format_tool_call("str_replace_editor", create))  # create takes a new path
        env.step(format_tool_call("str_replace_editor", create))
        view = format_tool_call("str_replace_editor", {"command": "view", "path": made_up})
        assert _accepts(swe_tok, env.action_grammar())(view)
        # off: any path, as before
        env.constrain_paths = False
        assert _accepts(swe_tok, env.action_grammar())(
            format_tool_call("str_replace_editor", {"command": "view", "path": "nowhere.py"})
        )
    finally:
        env.finish()


def test_tree_paths_limit(tmp_path):
    for i in range(5):
        (tmp_path / f"f{i}.py").write_text("")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "HEAD").write_text("")
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "m.py").write_text("")
    ed = StrReplaceEditor(root=str(tmp_path), protected=(".git",))
    assert ed.tree_paths() == [".", "f0.py", "f1.py", "f2.py", "f3.py", "f4.py", "pkg", "pkg/m.py"]
    assert ed.tree_paths(limit=3) is None  # too many: the path stays free
    schema = ed.arguments_schema_within(["a.py"])
    by_cmd = {c["properties"]["command"]["const"]: c["properties"]["path"] for c in schema["anyOf"]}
    assert by_cmd["view"] == {"enum": ["a.py"]} and by_cmd["create"]["type"] == "string"


def test_old_str_is_text_in_the_file_once(swe_tok, tmp_path):
    """With `constrain_old_str` (on) a str_replace's old_str is one of the runs of whole lines that occur once in
    its file: the bug's line is admitted (the expert's episode, above, too), the recalled fixed line that is not in
    the file is refused, and so is a line that occurs twice. Off, any old_str goes, as before."""
    (tmp_path / "m.py").write_text("def f(x):\n    return x\n\n\ndef g(x):\n    return x\n")
    (tmp_path / "big.py").write_text("x = 1\n" * 500)
    ed = StrReplaceEditor(root=str(tmp_path))
    olds = ed.old_str_choices(ed.tree_paths())
    assert "big.py" not in olds  # over max_file_lines: its old_str stays free
    assert "def f(x):" in olds["m.py"] and "def f(x):\n    return x" in olds["m.py"]
    assert "    return x" not in olds["m.py"] and "" not in olds["m.py"]  # twice in the file; blank

    for seed in range(3, 30):  # a task whose fixed line is nowhere in the file (in some it is, elsewhere)
        env = envs.make("swe", split="train", seed=seed, level=1)
        env.reset()
        args = next(c.arguments for t in env.plan for c in parse_tool_calls(t) if c.arguments.get("old_str"))
        path = args["path"]
        fixed = next(ln for ln in args["new_str"].split("\n") if ln not in args["old_str"].split("\n"))
        if fixed not in env._read(path):
            break
        env.finish()
    try:
        call = lambda old: format_tool_call(  # noqa: E731
            "str_replace_editor", {"command": "str_replace", "path": path, "old_str": old, "new_str": fixed}
        )
        accepts = _accepts(swe_tok, env.action_grammar())
        assert accepts(call(args["old_str"]))  # the expert's: the bug's line(s), once in the file
        assert fixed not in env._read(path)
        assert not accepts(call(fixed))  # the recalled fix, not in the file
        twice = [ln for ln in env._read(path).split("\n") if ln.strip() and env._read(path).count(ln) > 1]
        assert twice and not accepts(call(twice[0]))
        env.constrain_old_str = False
        assert _accepts(swe_tok, env.action_grammar())(call(fixed))
    finally:
        env.finish()
