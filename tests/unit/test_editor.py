"""envs/tools/editor.py: the str_replace_editor tool's semantics, its confinement to the work tree, and its errors
reaching the model as observations."""

import os

import pytest

from envs.tools import StrReplaceEditor, get_tool, run_tool_call
from envs.tools.parse import ToolCall

SRC = "def add(a, b):\n    return a - b\n\n\ndef sub(a, b):\n    return a - b\n"


@pytest.fixture
def ed(tmp_path):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "mod.py").write_text(SRC)
    return StrReplaceEditor(root=str(tmp_path))


def test_view_numbers_lines_and_ranges(ed):
    out = ed(command="view", path="pkg/mod.py")
    assert out.splitlines()[1] == "     2\t    return a - b"
    assert ed(command="view", path="pkg/mod.py", view_range=[5, 6]).splitlines() == [
        "     5\tdef sub(a, b):",
        "     6\t    return a - b",
    ]
    with pytest.raises(ValueError, match="outside 1..7"):
        ed(command="view", path="pkg/mod.py", view_range=[6, 9])
    listing = ed(command="view", path=".")
    assert "  pkg/" in listing and "  pkg/mod.py" in listing


def test_str_replace_needs_exactly_one_match(ed, tmp_path):
    with pytest.raises(ValueError, match="occurs 2 times .*lines \\[2, 6\\]"):
        ed(command="str_replace", path="pkg/mod.py", old_str="return a - b", new_str="return a + b")
    with pytest.raises(ValueError, match="no match"):
        ed(command="str_replace", path="pkg/mod.py", old_str="return a * b", new_str="x")
    assert (tmp_path / "pkg" / "mod.py").read_text() == SRC  # failed edits change nothing
    out = ed(
        command="str_replace",
        path="pkg/mod.py",
        old_str="b):\n    return a - b\n\n",
        new_str="b):\n    return a + b\n\n",
    )
    assert "     2\t    return a + b" in out
    assert (tmp_path / "pkg" / "mod.py").read_text() == SRC.replace("a - b", "a + b", 1)


def test_no_match_quotes_the_closest_lines(ed, tmp_path):
    """An old_str that occurs nowhere gets the file's most alike lines (as many as it has) in the error, to copy;
    nothing alike, no quote; the file is unchanged either way."""
    with pytest.raises(ValueError) as e:
        ed(command="str_replace", path="pkg/mod.py", old_str="def add(a, b):\n    return a + b", new_str="x")
    assert str(e.value).endswith("The closest text is at lines 1-2:\ndef add(a, b):\n    return a - b")
    with pytest.raises(ValueError) as e:
        ed(command="str_replace", path="pkg/mod.py", old_str="def sub(x, b):", new_str="x")
    assert str(e.value).endswith("at line 5:\ndef sub(a, b):")
    for unlike in ("while True: pass", " \t ", "q" * 3000):  # unlike, blank, too long to search
        with pytest.raises(ValueError) as e:
            ed(command="str_replace", path="pkg/mod.py", old_str=unlike, new_str="x")
        assert "closest" not in str(e.value)
    assert (tmp_path / "pkg" / "mod.py").read_text() == SRC


def test_replace_lines_by_number_and_undo(ed, tmp_path):
    out = ed(command="replace_lines", path="pkg/mod.py", line_range=[2, 2], new_str="    return a + b")
    assert (tmp_path / "pkg" / "mod.py").read_text() == SRC.replace("a - b", "a + b", 1)
    assert "     2\t    return a + b" in out
    ed(
        command="replace_lines",
        path="pkg/mod.py",
        line_range=[5, 6],
        new_str="def sub(a, b):\n    x = a\n    return x - b",
    )
    assert (tmp_path / "pkg" / "mod.py").read_text().split("\n")[4:8] == [
        "def sub(a, b):",
        "    x = a",
        "    return x - b",
        "",
    ]
    for bad in ([0, 1], [3, 2], [6, 9], [1]):
        with pytest.raises(ValueError, match="line_range"):
            ed(command="replace_lines", path="pkg/mod.py", line_range=bad, new_str="x")
    with pytest.raises(ValueError, match="needs new_str"):
        ed(command="replace_lines", path="pkg/mod.py", line_range=[1, 1])
    ed(command="undo_edit", path="pkg/mod.py")
    ed(command="undo_edit", path="pkg/mod.py")
    assert (tmp_path / "pkg" / "mod.py").read_text() == SRC


def test_insert_create_and_undo(ed, tmp_path):
    mod = tmp_path / "pkg" / "mod.py"
    ed(command="insert", path="pkg/mod.py", insert_line=0, new_str="import math")
    assert mod.read_text().splitlines()[:2] == ["import math", "def add(a, b):"]
    ed(command="insert", path="pkg/mod.py", insert_line=3, new_str="    # done")
    assert mod.read_text().splitlines()[3] == "    # done"
    with pytest.raises(ValueError, match="outside 0..9"):
        ed(command="insert", path="pkg/mod.py", insert_line=10, new_str="x")
    ed(command="undo_edit", path="pkg/mod.py")
    ed(command="undo_edit", path="pkg/mod.py")
    assert mod.read_text() == SRC
    with pytest.raises(ValueError, match="no edit"):
        ed(command="undo_edit", path="pkg/mod.py")
    with pytest.raises(ValueError, match="already exists"):
        ed(command="create", path="pkg/mod.py", file_text="x = 1\n")
    assert mod.read_text() == SRC
    ed(command="create", path="pkg/new/util.py", file_text="X = 1\n")
    assert (tmp_path / "pkg" / "new" / "util.py").read_text() == "X = 1\n"
    ed(command="undo_edit", path="pkg/new/util.py")
    assert not (tmp_path / "pkg" / "new" / "util.py").exists()


def test_paths_outside_the_work_tree_are_refused(ed, tmp_path):
    outside = tmp_path.parent / f"{tmp_path.name}-outside.txt"
    outside.write_text("secret\n")
    os.symlink(outside, tmp_path / "link.txt")
    for path in ("../" + outside.name, str(outside), "link.txt", "pkg/../../" + outside.name):
        with pytest.raises(ValueError, match="outside the work tree"):
            ed(command="view", path=path)
    with pytest.raises(ValueError, match="outside the work tree"):
        ed(command="create", path="../escaped.py", file_text="x")
    assert not (tmp_path.parent / "escaped.py").exists() and outside.read_text() == "secret\n"


def test_binary_and_huge_files(tmp_path):
    ed = StrReplaceEditor(root=str(tmp_path), max_file_bytes=1000)
    (tmp_path / "blob.bin").write_bytes(b"\x7fELF\0\0\1")
    (tmp_path / "big.txt").write_text("line\n" * 400)  # 2,000 bytes
    with pytest.raises(ValueError, match="binary"):
        ed(command="view", path="blob.bin")
    with pytest.raises(ValueError, match="2000 bytes"):
        ed(command="view", path="big.txt")
    assert ed(command="view", path="big.txt", view_range=[399, 400]).splitlines() == [
        "   399\tline",
        "   400\tline",
    ]
    with pytest.raises(ValueError, match="binary"):
        ed(command="str_replace", path="blob.bin", old_str="ELF", new_str="x")


def test_errors_become_observations_through_run_tool_call(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the registered instance works in the current directory
    (tmp_path / "a.py").write_text("x = 1\n")
    tools = {"str_replace_editor": get_tool("str_replace_editor")}
    call = ToolCall(name="str_replace_editor", arguments={"command": "str_replace", "path": "a.py", "old_str": "y"})
    res = run_tool_call(call, tools, timeout_s=5)
    assert not res.ok and res.output.startswith("Error") and "no match" in res.output
    call = ToolCall(name="str_replace_editor", arguments={"command": "view", "path": "a.py"})
    assert run_tool_call(call, tools, timeout_s=5).output == "     1\tx = 1\n     2\t"
