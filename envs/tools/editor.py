"""`str_replace_editor`: the file editor agents know from SWE-agent / OpenHands, confined to one work tree.

    ed = StrReplaceEditor(root="/tmp/repo")
    ed(command="view", path="pkg/mod.py")                                   # numbered lines
    ed(command="str_replace", path="pkg/mod.py", old_str="a - b", new_str="a + b")
    ed(command="undo_edit", path="pkg/mod.py")

Commands: `view` (a file with line numbers, optionally `view_range` [start, end], end -1 = to the end; or a
directory, two levels deep), `create` (a new file; refuses to overwrite), `str_replace` (`old_str` must occur
exactly once; when it occurs nowhere, the error quotes the file's closest lines and their numbers), `insert`
(`new_str` after line `insert_line`, 0 = at the top), `replace_lines` (lines `line_range` [start, end] become
`new_str`: SWE-agent's `edit start:end`, for an agent that knows the line but cannot copy it) and `undo_edit` (the
last edit of that file). A path that leaves the work tree (`..`, an absolute path elsewhere, a symlink out) is
refused. Mistakes raise ValueError with a message written for the model; `run_tool_call` turns it into an
"Error: ..." observation.
The registered instance (`get_tool("str_replace_editor")`) works in the current directory; an env makes its own
with `root=` its work tree.
"""

from __future__ import annotations

import difflib
import os

from envs.tools.base import Tool

COMMANDS = ("view", "create", "str_replace", "insert", "replace_lines", "undo_edit")


class StrReplaceEditor(Tool):
    name = "str_replace_editor"
    description = (
        "View, create and edit files: view (a file with line numbers, or a directory), create (a new file), "
        "str_replace (replace old_str, which must occur exactly once, by new_str), insert (new_str after line "
        "insert_line), replace_lines (lines line_range [start, end] by new_str) and undo_edit (revert the last edit "
        "of a file)."
    )
    parameters = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "enum": list(COMMANDS)},
            "path": {"type": "string", "description": "a path in the work tree"},
            "file_text": {"type": "string", "description": "create: the file's content"},
            "old_str": {"type": "string", "description": "str_replace: the exact text to replace"},
            "new_str": {"type": "string", "description": "str_replace / insert: the new text"},
            "insert_line": {"type": "integer", "description": "insert: after this line (0 = at the top)"},
            "line_range": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 2,
                "description": "replace_lines: [start, end] lines, both included",
            },
            "view_range": {
                "type": "array",
                "items": {"type": "integer"},
                "minItems": 2,
                "maxItems": 2,
                "description": "view: [start, end] lines, end -1 = to the end",
            },
        },
        "required": ["command", "path"],
    }

    @property
    def arguments_schema(self) -> dict:
        """Each command with exactly its own arguments, in the order the expert's calls write them (a constrained
        decoder then cannot send `old_str` to `view`, or forget it for `str_replace`)."""
        return self.arguments_schema_within(None)

    def arguments_schema_within(self, paths: list[str] | None, old_strs: dict[str, list[str]] | None = None) -> dict:
        """`arguments_schema` where every command but `create` may name only one of `paths` (`tree_paths()`: what
        is in the work tree), so a constrained decoder cannot send a call to a file that is not there; `create`
        still takes any new path. None: any path. `old_strs` (`old_str_choices()`): a str_replace on one of these
        files must take one of its old_strs, i.e. text that is in the file exactly once."""
        p, old_strs = self.parameters["properties"], old_strs or {}

        def command(name: str, *required: str, optional: tuple[str, ...] = (), **only: dict) -> dict:
            keys = ("path", *required, *optional)
            props = {k: p[k] for k in keys} | only
            return {
                "type": "object",
                "properties": {"command": {"const": name}} | props,
                "required": ["command", "path", *required],
                "additionalProperties": False,
            }

        within = {} if paths is None else {"path": {"enum": list(paths)}}
        free = [x for x in paths if x not in old_strs] if paths is not None else None
        replace = [  # one branch per file, so the old_str is one of that file's own
            command("str_replace", "old_str", optional=("new_str",), path={"const": f}, old_str={"enum": olds})
            for f, olds in old_strs.items()
            if olds
        ]
        if free is None or free:  # the other paths (folders, large files) keep a free old_str
            rest = {} if free is None else {"path": {"enum": free}}
            replace.append(command("str_replace", "old_str", optional=("new_str",), **rest))
        return {
            "anyOf": [
                command("view", optional=("view_range",), **within),
                command("create", "file_text"),
                *replace,
                command("insert", "insert_line", "new_str", **within),
                command("replace_lines", "line_range", "new_str", **within),
                command("undo_edit", **within),
            ]
        }

    def old_str_choices(self, paths: list[str], max_lines: int = 4, max_file_lines: int = 300) -> dict[str, list[str]]:
        """For each text file among `paths` (work-tree relative, ≤ `max_file_lines` lines): the runs of 1 to
        `max_lines` whole lines, without the final newline, that occur exactly once in it and are not blank, i.e.
        the old_strs a str_replace there can take (the expert's smallest unique hunk is one of them)."""
        out, root = {}, self._work_tree()
        for rel in paths:
            try:  # what str_replace itself reads: folders, huge, binary and non-UTF-8 files are left free
                text = self._read(os.path.join(root, rel), rel)
            except (OSError, ValueError):
                continue
            lines = text.split("\n")
            if len(lines) > max_file_lines:
                continue
            runs = ("\n".join(lines[i : i + k]) for i in range(len(lines)) for k in range(1, max_lines + 1))
            out[rel] = [r for r in dict.fromkeys(runs) if r.strip() and text.count(r) == 1]
        return out

    def __init__(
        self,
        root: str | None = None,
        max_file_bytes: int = 1_000_000,
        max_output_chars: int = 16_000,
        protected: tuple[str, ...] = (),
    ):
        self.root, self.max_file_bytes, self.max_output_chars = root, max_file_bytes, max_output_chars
        self.protected = protected  # top-level names in the work tree that are off limits (an env's ".git")
        self.history: dict[str, list[str | None]] = {}  # path -> earlier contents (None: it did not exist)

    def __call__(self, command: str, path: str, **kw) -> str:
        if command not in COMMANDS:
            raise ValueError(f"unknown command {command!r}; use one of {', '.join(COMMANDS)}")
        full = self.resolve(path)
        out = getattr(self, "_" + command)(full, path, **kw)
        if len(out) > self.max_output_chars:
            out = out[: self.max_output_chars] + f"\n<output cut at {self.max_output_chars} characters>"
        return out

    def tree_paths(self, limit: int = 500) -> list[str] | None:
        """The work tree's files and folders as relative paths ("." first, then sorted), protected names left out;
        None when there are more than `limit` (a grammar of every path of a large repository costs more than the
        wrong paths it prevents)."""
        root, out = self._work_tree(), []
        for d, dirs, files in os.walk(root):
            rel = os.path.relpath(d, root)
            dirs[:] = [x for x in dirs if rel != "." or x not in self.protected]  # not walked, not listed
            out += [os.path.normpath(os.path.join(rel, x)) for x in dirs + files]
            if len(out) > limit:
                return None
        return [".", *sorted(out)]

    def _work_tree(self) -> str:
        return os.path.realpath(self.root or os.getcwd())

    def resolve(self, path: str) -> str:
        """The real path of `path` inside the work tree; ValueError if it leaves it (symlinks resolved)."""
        root = self._work_tree()
        full = os.path.realpath(os.path.join(root, path))
        if full != root and not full.startswith(root + os.sep):
            raise ValueError(f"{path}: outside the work tree; paths must stay inside {root}")
        if os.path.relpath(full, root).split(os.sep)[0] in self.protected:
            raise ValueError(f"{path}: not editable here")
        return full

    # ------------------------------------------------------------------------------------------ commands

    def _view(self, full: str, path: str, view_range: list | None = None, **_) -> str:
        if os.path.isdir(full):
            return _listing(full, path)
        text = self._read(full, path, whole=view_range is None)
        lines = text.split("\n")
        start, end = 1, len(lines)
        if view_range is not None:
            if len(view_range) != 2:
                raise ValueError("view_range must be [start, end]")
            start, end = int(view_range[0]), int(view_range[1])
            end = len(lines) if end == -1 else end
            if not 1 <= start <= end <= len(lines):
                raise ValueError(f"view_range {view_range} is outside 1..{len(lines)} ({path} has {len(lines)} lines)")
        return _numbered(lines, start, end)

    def _create(self, full: str, path: str, file_text: str | None = None, **_) -> str:
        if file_text is None:
            raise ValueError("create needs file_text")
        if os.path.exists(full):
            raise ValueError(f"{path} already exists; edit it with str_replace or insert")
        os.makedirs(os.path.dirname(full), exist_ok=True)
        self._write(full, file_text, previous=None)
        return f"created {path} ({len(file_text.splitlines())} lines)"

    def _str_replace(self, full: str, path: str, old_str: str | None = None, new_str: str = "", **_) -> str:
        if not old_str:
            raise ValueError("str_replace needs a non-empty old_str")
        text = self._read(full, path)
        n = text.count(old_str)
        if n == 0:
            raise ValueError(
                f"no match for old_str in {path}; it must match the file exactly, whitespace included"
                + _closest_hint(text, old_str)
            )
        if n > 1:
            at = [text[:i].count("\n") + 1 for i in _find_all(text, old_str)]
            raise ValueError(f"old_str occurs {n} times in {path} (lines {at}); include more context to make it unique")
        i = text.index(old_str)
        new = text[:i] + new_str + text[i + len(old_str) :]
        self._write(full, new, previous=text)
        first = text[:i].count("\n") + 1
        return f"edited {path}:\n" + _snippet(new, first, first + new_str.count("\n"))

    def _insert(self, full: str, path: str, new_str: str | None = None, insert_line: int | None = None, **_) -> str:
        if new_str is None or insert_line is None:
            raise ValueError("insert needs new_str and insert_line")
        text = self._read(full, path)
        lines = text.split("\n")
        if not 0 <= int(insert_line) <= len(lines):
            raise ValueError(f"insert_line {insert_line} is outside 0..{len(lines)}")
        k = int(insert_line)
        new = "\n".join(lines[:k] + new_str.split("\n") + lines[k:])
        self._write(full, new, previous=text)
        return f"edited {path}:\n" + _snippet(new, k + 1, k + 1 + new_str.count("\n"))

    def _replace_lines(
        self, full: str, path: str, new_str: str | None = None, line_range: list | None = None, **_
    ) -> str:
        if new_str is None or line_range is None or len(line_range) != 2:
            raise ValueError("replace_lines needs new_str and line_range [start, end]")
        text = self._read(full, path)
        lines = text.split("\n")
        start, end = int(line_range[0]), int(line_range[1])
        if not 1 <= start <= end <= len(lines):
            raise ValueError(f"line_range {line_range} is outside 1..{len(lines)} ({path} has {len(lines)} lines)")
        new = "\n".join(lines[: start - 1] + new_str.split("\n") + lines[end:])
        self._write(full, new, previous=text)
        return f"edited {path}:\n" + _snippet(new, start, start + new_str.count("\n"))

    def _undo_edit(self, full: str, path: str, **_) -> str:
        if not self.history.get(full):
            raise ValueError(f"no edit of {path} to undo")
        previous = self.history[full].pop()
        if previous is None:
            os.remove(full)
            return f"undid the creation of {path}"
        with open(full, "w") as f:
            f.write(previous)
        return f"undid the last edit of {path}"

    # ------------------------------------------------------------------------------------------ helpers

    def _read(self, full: str, path: str, whole: bool = True) -> str:
        if not os.path.isfile(full):
            raise ValueError(f"{path}: no such file")
        size = os.path.getsize(full)
        if whole and size > self.max_file_bytes:
            raise ValueError(f"{path} is {size} bytes (over {self.max_file_bytes}); view a view_range of it")
        with open(full, "rb") as f:
            data = f.read()
        if b"\0" in data[:8192]:
            raise ValueError(f"{path} is a binary file")
        try:
            return data.decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{path} is not UTF-8 text") from None

    def _write(self, full: str, text: str, previous: str | None) -> None:
        self.history.setdefault(full, []).append(previous)
        with open(full, "w") as f:
            f.write(text)


def _snippet(text: str, first: int, last: int, context: int = 3) -> str:
    """Lines first..last of the edited text (1-based), with `context` lines around, numbered."""
    lines = text.split("\n")
    return _numbered(lines, max(1, first - context), min(len(lines), last + context))


def _numbered(lines: list[str], first: int, last: int) -> str:
    """Lines first..last (1-based, inclusive) as `cat -n` prints them."""
    return "\n".join(f"{n:6d}\t{lines[n - 1]}" for n in range(first, last + 1))


HINT_MIN_RATIO = 0.6
"""How alike (difflib's ratio) the closest lines must be to old_str for the no-match error to quote them."""


def _closest_hint(text: str, old_str: str, max_chars: int = 2000, budget: int = 3_000_000, top: int = 20) -> str:
    """The file's lines most like `old_str` (as many lines as it has), quoted for the no-match error: an agent that
    recalled a line instead of copying it from the view (the correct line where the file has a bug in it) gets the
    file's real text to copy, as Aider does for a failed search block. "" when nothing is alike enough.

    Bounded on any input: an old_str of at most `max_chars`, windows of at most `budget` characters in all (k lines
    × the file), each screened by difflib's quick_ratio (a character-count bound, O(length)); only the `top` best
    get the full ratio, and none much longer than old_str can (ratio ≤ 2·min / sum)."""
    want = old_str.strip("\n")
    lines = text.split("\n")
    k = want.count("\n") + 1
    n = len(lines) - k + 1
    if not want.strip() or len(want) > max_chars or n < 1 or k * len(text) > budget:
        return ""
    sm = difflib.SequenceMatcher(None, autojunk=False)
    sm.set_seq2(want)  # difflib caches the second sequence's index: set it once
    quick = []  # [n] an upper bound of each window's ratio
    for i in range(n):
        sm.set_seq1("\n".join(lines[i : i + k]))
        quick.append(sm.quick_ratio())
    best, at = HINT_MIN_RATIO, -1
    for i in sorted(range(n), key=lambda i: -quick[i])[:top]:  # stable: on a tie the earlier lines
        if quick[i] <= best:
            break
        sm.set_seq1("\n".join(lines[i : i + k]))
        if (r := sm.ratio()) > best:
            best, at = r, i
    if at < 0:
        return ""
    span = f"line {at + 1}" if k == 1 else f"lines {at + 1}-{at + k}"
    return f". The closest text is at {span}:\n" + "\n".join(lines[at : at + k])


def _find_all(text: str, sub: str) -> list[int]:
    out, i = [], text.find(sub)
    while i != -1:
        out.append(i)
        i = text.find(sub, i + 1)
    return out


def _listing(full: str, path: str, depth: int = 2) -> str:
    out = [f"{path.rstrip('/') or '.'}/"]
    base = full.rstrip(os.sep).count(os.sep)
    for d, dirs, files in os.walk(full):
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        level = d.rstrip(os.sep).count(os.sep) - base
        if level + 1 >= depth:
            dirs[:] = []
        rel = os.path.relpath(d, full)
        prefix = "" if rel == "." else rel + "/"
        out += [f"  {prefix}{x}/" for x in dirs] + [f"  {prefix}{x}" for x in sorted(files) if not x.startswith(".")]
    return "\n".join(out)
