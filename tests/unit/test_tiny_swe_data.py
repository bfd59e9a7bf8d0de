"""tiny-swe's drills (nanosky.tiny.swe_data): random one-token changes, spot-the-change turns whose str_replace is
exactly what the real editor needs, copy drills that recall cannot answer, and recovery turns whose failed call is
shown but not trained."""

import ast
import json
import os
import random

from nanosky.tiny.swe_data import (
    _code_copy_examples,
    _first_turns,
    _held_out_bugs,
    _recover_turns,
    _spot_turns,
    mutate_line,
)


def test_mutate_line_changes_one_token_and_skips_what_has_none():
    rng = random.Random(0)
    line = "    return [items[i:i + size] for i in range(0, len(items), size)]"
    for _ in range(50):
        new = mutate_line(line, rng, ["items", "size", "total"])
        assert new is not None and new != line
        assert new[:4] == "    "  # indentation kept
        a, b = line.split(), new.split()
        # one token differs: the texts share a prefix and a suffix that cover all but the change
        pre = len(os.path.commonprefix([line, new]))
        suf = len(os.path.commonprefix([line[::-1], new[::-1]]))
        assert pre + suf >= min(len(line), len(new)) - 8, (line, new, a, b)
    for nothing in ("", "    ", '    """A docstring."""', "    # comment only", "    return"):
        assert mutate_line(nothing, rng, ["x"]) is None


def _call(msg: dict) -> dict:
    return json.loads(msg["content"].removeprefix("<tool_call>").removesuffix("</tool_call>"))


def test_spot_turns_fix_the_changed_line_with_the_real_editor(tmp_path):
    from envs.swe.generate import generate
    from envs.tools import StrReplaceEditor

    for i, (messages, schemas) in enumerate(_spot_turns(12, 3)):
        assert [s["function"]["name"] for s in schemas] == ["bash", "str_replace_editor", "submit"]
        calls = [_call(m) for m in messages if m["role"] == "assistant"]
        view, fix = calls[-2]["arguments"], calls[-1]["arguments"]
        assert view["command"] == "view" and fix["command"] == "str_replace" and view["path"] == fix["path"]
        fn = messages[1]["content"].split("`")[1]
        task = generate(3 * 1_000_003 + 800_000 + i, (1, 1, 2)[i % 3])  # the clean files it was drawn from
        clean = task.fixed_files[fix["path"]]
        changed = clean.replace(fix["new_str"], fix["old_str"])
        assert changed != clean and changed.count(fix["old_str"]) == 1
        # the view showed the changed file, and the named function holds the change
        shown = messages[-2]["content"]
        assert all(f"\t{ln}" in shown for ln in fix["old_str"].split("\n") if ln.strip())
        tree = ast.parse(changed)
        f = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == fn)
        body = "\n".join(changed.split("\n")[f.lineno - 1 : f.end_lineno])
        assert fix["old_str"].strip() in body and ast.unparse(ast.parse(body)) not in _held_out_bugs()
        # the real editor applies it and gets the clean file back
        root = tmp_path / str(i)
        (root / os.path.dirname(fix["path"])).mkdir(parents=True)
        (root / fix["path"]).write_text(changed)
        StrReplaceEditor(root=str(root))(**fix)
        assert (root / fix["path"]).read_text() == clean


def test_held_out_bugs_are_the_generators_test_split():
    from envs.swe.generate import generate

    bugs = _held_out_bugs()
    for seed in range(5):
        task = generate(seed, 1, split="test")
        src = task.files[task.bug["path"]]
        fn = next(n for n in ast.parse(src).body if getattr(n, "name", "") == task.bug["function"])
        assert ast.unparse(fn) in bugs


def test_mutated_code_copy_drills_show_lines_recall_cannot_supply():
    from envs.swe.generate import THEMES

    templates = "\n".join(f.source for fns in THEMES.values() for f in fns)
    drills = _code_copy_examples(60, 0, p_mutate=1.0)
    novel = 0
    for drill, _ in drills:
        shown, answer = drill[1]["content"], drill[2]["content"]
        lines = [ln.split("\t", 1)[1] for ln in shown.split("\n")]
        assert json.loads(answer) == "\n".join(lines)
        novel += any(ln.strip() and ln.strip() not in templates for ln in lines)
    assert novel >= 40  # most drills hold a line no template has


def test_recovery_turns_fix_the_quoted_lines_by_number_and_train_only_the_fix(tmp_path):
    """The recalled old_str (the clean text) fails in the real editor, whose error quotes exactly the buggy lines
    with their numbers; the next call replaces those lines by the clean text; the failed call is context, not loss."""
    from transformers import AutoTokenizer

    from envs.swe.generate import generate
    from envs.tools import StrReplaceEditor
    from nanosky.tiny import SWE_DIR, _encode

    tok = AutoTokenizer.from_pretrained(SWE_DIR)
    examples = _recover_turns(10, 1)
    assert len(examples) == 10
    for messages, schemas in examples:
        wrong_msg, error, fix_msg = messages[-3:]
        wrong, fix = _call(wrong_msg)["arguments"], _call(fix_msg)["arguments"]
        assert wrong_msg.get("train") is False and fix_msg.get("train") is None
        assert wrong["command"] == "str_replace" and wrong["old_str"] == wrong["new_str"] == fix["new_str"]
        assert fix["command"] == "replace_lines" and fix["path"] == wrong["path"]
        a, b = fix["line_range"]
        span = f"line {a}" if a == b else f"lines {a}-{b}"
        assert error["content"].startswith("Error: str_replace_editor failed: ValueError: no match")
        assert f"The closest text is at {span}:\n" in error["content"]
        ids, mask = _encode(tok, (messages, schemas))
        trained = tok.decode([t for t, m in zip(ids, mask) if m])
        assert '"command": "replace_lines"' in trained and '"command": "str_replace"' not in trained
    # on generated tasks, the recovered fix applies to the buggy file with the real editor and gives the clean one
    applied = 0
    for i in range(12):
        task = generate(100 + i, 1)
        bug = {k: task.bug[k] for k in ("path", "function")}
        msgs = _first_turns(task.files, task.fixed_files, task.problem_statement, 1, bug, recall=True)
        if msgs is None:  # no quote to copy (a bug that adds lines): passed over
            continue
        fix = _call(msgs[-1])["arguments"]
        assert fix["command"] == "replace_lines"
        root = tmp_path / str(i)
        (root / os.path.dirname(fix["path"])).mkdir(parents=True)
        (root / fix["path"]).write_text(task.files[fix["path"]])
        StrReplaceEditor(root=str(root))(**fix)
        assert (root / fix["path"]).read_text() == task.fixed_files[fix["path"]]
        applied += 1
    assert applied >= 6
