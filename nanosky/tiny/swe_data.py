"""The tiny-swe model's training data (`python -m nanosky.tiny --variant swe`): expert episodes of `envs.make("swe")`,
their first turns without the sandbox, and two kinds of drills for the editor's old_str.

Why the drills: the model memorises the six repositories' clean sources, so when it writes an old_str it tends to
write the line it remembers (the correct one) instead of the buggy line the view shows, and the str_replace finds no
match. Two drills train copying over recall, on lines no memory can supply:
- code copy drills: numbered view lines, most with one token changed at random, written back as the JSON string an
  old_str is;
- spot-the-change turns: the real first turns of a task (issue, view, str_replace) on a file where one line of the
  named function was changed at random; the old_str is that changed line as the view shows it, the new_str the
  clean line. Random edits, not the generator's bugs, so no held-out bug (`split="test"`) is ever shown.
And recovery turns: the recalled old_str fails, the editor's no-match error quotes the file's closest lines (the
buggy ones) with their numbers, and a `replace_lines` of those numbers writes the recalled clean code: it needs the
line number copied, not the line (the model, shown the error's quote, still wrote its memory into old_str).
"""

from __future__ import annotations

import ast
import functools
import json
import keyword
import os
import random
import re
import tempfile
from typing import TYPE_CHECKING

from envs.tools.parse import format_tool_call
from nanosky.tiny.drills import copy_drill

if TYPE_CHECKING:
    from nanosky.tiny.config import TinyConfig

_TOKEN = re.compile(r"[A-Za-z_]\w*|\d+|==|!=|<=|>=|//|[-+*%<>]")
_SWAPS = {"and": "or", "or": "and", "True": "False", "False": "True"}
_OPS = (("+", "-", "*", "//", "%"), ("<", ">", "<=", ">=", "==", "!="))


def mutate_line(line: str, rng: random.Random, names: list[str]) -> str | None:
    """`line` with one token changed at random (a number, a name from `names` or a made-up one, an operator of the
    same kind, and/or, True/False); None when the line has nothing to change (blank, a string, only keywords)."""
    code = line.split("#", 1)[0]
    if not code.strip() or code.strip()[:1] in "\"'":
        return None
    spots = []
    for m in _TOKEN.finditer(code):
        t = m.group()
        if t.isdigit():
            new = str(rng.choice([int(t) + 1, max(0, int(t) - 1), rng.randint(0, 99)]))
        elif t in _SWAPS:
            new = _SWAPS[t]
        elif t[0].isalpha() or t[0] == "_":
            if keyword.iskeyword(t) or t in ("None", "self", "def"):
                continue
            pool = [n for n in names if n != t]
            new = rng.choice(pool) if pool and rng.random() < 0.7 else _word(rng)
        else:
            group = next(g for g in _OPS if t in g)
            new = rng.choice([o for o in group if o != t])
        if new != t and not _in_string(code, m.start()):
            spots.append((m.start(), m.end(), new))
    if not spots:
        return None
    a, b, new = rng.choice(spots)
    return line[:a] + new + line[b:]


def _in_string(code: str, pos: int) -> bool:
    return code[:pos].count("'") % 2 == 1 or code[:pos].count('"') % 2 == 1


def _word(rng: random.Random) -> str:
    return "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(1, 7)))


def _names(src: str) -> list[str]:
    return sorted({t for t in re.findall(r"[A-Za-z_]\w*", src) if not keyword.iskeyword(t)})


@functools.cache
def _held_out_bugs() -> frozenset[str]:
    """Every `split="test"` bug of the generator, as the buggy function's normalised source (`ast.unparse`)."""
    from envs.swe.generate import THEMES, _held_out, mutations

    out = set()
    for fns in THEMES.values():
        for f in fns:
            for m in mutations(f.source):
                if _held_out(f.name, m):
                    tree = ast.parse(f.source).body[0]
                    m.apply(tree)
                    out.add(ast.unparse(tree))
    return frozenset(out)


def _is_held_out(src: str) -> bool:
    try:
        return ast.unparse(ast.parse(src).body[0]) in _held_out_bugs()
    except SyntaxError:  # the generator's bugs all compile
        return False


def _swe_examples(n: int, seed: int, levels: tuple[int, ...] = (1, 1, 2)) -> list[tuple[list[dict], list[dict]]]:
    """Whole expert episodes of `envs.make("swe")` (train split; level by index from `levels`), tools run for real
    in the sandbox (grading skipped: the expert resolves every instance), with the tools' schemas."""
    if n <= 0:
        return []
    import envs
    from envs.base import expert_episode

    out = []
    for i in range(n):
        env = envs.make("swe", split="train", seed=seed * 1_000_003 + 300_000 + i, level=levels[i % len(levels)])
        env.grade = False
        out.append((expert_episode(env), [t.schema for t in env.tools]))
    return out


def _first_turns(
    files: dict, fixed: dict, statement: str, level: int, bug: dict, recall: bool = False
) -> list[dict] | None:
    """The expert's turns up to the fixing str_replace ((grep,) view, str_replace) on `files`, as the env shows them:
    the view is the real editor's output on the files in a scratch dir, the grep line what `grep -rn` prints.

    `recall`: each str_replace becomes the mistake the model makes, an old_str recalled as the clean code
    (old_str = new_str), the editor's real no-match error, which quotes the file's closest lines with their numbers,
    and a `replace_lines` of those lines by the clean code. The mistaken turn is marked `"train": False` (no loss on
    it). None when that would not give exactly the fixed files (a missing line, or the clean text is elsewhere)."""
    from envs.swe import OBS_CHARS
    from envs.swe.build import unified_diff
    from envs.swe.env import SYSTEM_PROMPT, expert_plan
    from envs.tools import StrReplaceEditor

    with tempfile.TemporaryDirectory(prefix="nanosky-tiny-swe-") as root:
        for path, text in files.items():
            os.makedirs(os.path.dirname(os.path.join(root, path)) or root, exist_ok=True)
            with open(os.path.join(root, path), "w") as f:
                f.write(text)
        ed = StrReplaceEditor(root=root, max_output_chars=OBS_CHARS, protected=(".git",))
        inst = {"patch": unified_diff(files, fixed), "level": level, "bug": bug}
        plan = expert_plan(inst, files.get)[:-2]  # without the test run and submit
        msgs = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": statement.strip()}]
        for action in plan:
            call = json.loads(action.removeprefix("<tool_call>").removesuffix("</tool_call>"))
            if call["name"] == "bash":  # grep -rn 'def f(' --include=*.py . : one definition, one line
                src = files[bug["path"]].split("\n")
                k = next(j for j, ln in enumerate(src) if ln.startswith(f"def {bug['function']}("))
                obs = f"./{bug['path']}:{k + 1}:{src[k]}"
            else:
                args = call["arguments"]
                if recall and args["command"] == "str_replace":
                    wrong = {**args, "old_str": args["new_str"]}
                    try:
                        ed(**wrong)
                        return None  # the clean text is in the file: that edit would have applied
                    except ValueError as e:
                        at = re.search(r"The closest text is at lines? (\d+)(?:-(\d+))?:\n", str(e))
                        if at is None:
                            return None
                        msgs += [
                            {
                                "role": "assistant",
                                "content": format_tool_call(call["name"], wrong),
                                "train": False,
                            },
                            {"role": "tool", "name": call["name"], "content": _editor_error(e)},
                        ]
                    lines = [int(at.group(1)), int(at.group(2) or at.group(1))]
                    args = {
                        "command": "replace_lines",
                        "path": args["path"],
                        "line_range": lines,
                        "new_str": wrong["new_str"],
                    }
                    action = format_tool_call(call["name"], args)
                try:
                    obs = ed(**args)
                except ValueError as e:
                    obs = _editor_error(e)
            msgs += [
                {"role": "assistant", "content": action},
                {"role": "tool", "name": call["name"], "content": obs},
            ]
        if recall:  # the quoted lines were the bug's: the line edit gives exactly the fixed files
            for path, text in fixed.items():
                with open(os.path.join(root, path)) as f:
                    if f.read() != text:
                        return None
    return msgs[:-1]


def _editor_error(e: ValueError) -> str:
    """An editor mistake as the env's observation (`envs.tools.run_tool_call`)."""
    return f"Error: str_replace_editor failed: ValueError: {e}"


def _schemas() -> list[dict]:
    from envs.swe.env import SubmitTool
    from envs.tools import BashTool, StrReplaceEditor

    return [t.schema for t in (BashTool(), StrReplaceEditor(), SubmitTool())]


def _swe_fix_turns(n: int, seed: int, levels: tuple[int, ...] = (1, 1, 2)) -> list[tuple[list[dict], list[dict]]]:
    """The first turns of expert episodes, cheaply: (grep,) view, then the str_replace that fixes the bug; the same
    turns `_swe_examples` records, without the sandbox (no test run, no submit)."""
    from envs.swe import generate

    out, schemas = [], _schemas()
    for i in range(max(0, n)):
        task = generate(seed * 1_000_003 + 600_000 + i, levels[i % len(levels)])
        bug = {k: task.bug[k] for k in ("path", "function")}
        msgs = _first_turns(task.files, task.fixed_files, task.problem_statement, task.level, bug)
        out.append((msgs, schemas))
    return out


def _recover_turns(n: int, seed: int, levels: tuple[int, ...] = (1, 1, 2)) -> list[tuple[list[dict], list[dict]]]:
    """First turns with the recalled-old_str mistake and its recovery (`_first_turns(recall=True)`): the failed
    str_replace (not trained), the no-match error quoting the buggy lines, and the replace_lines that fixes them.
    Tasks where that would not give the fixed files (a bug that adds lines: a missing return or branch) are passed
    over."""
    from envs.swe import generate

    out, schemas, i = [], _schemas(), 0
    while len(out) < n:
        task = generate(seed * 1_000_003 + 900_000 + i, levels[i % len(levels)])
        i += 1
        bug = {k: task.bug[k] for k in ("path", "function")}
        msgs = _first_turns(task.files, task.fixed_files, task.problem_statement, task.level, bug, recall=True)
        if msgs is not None:
            out.append((msgs, schemas))
    return out


def _spot_turns(n: int, seed: int, levels: tuple[int, ...] = (1, 1, 2)) -> list[tuple[list[dict], list[dict]]]:
    """Spot-the-change turns (module docstring): a task's clean files with one line of one function changed at
    random, an issue naming that function, and the expert's (grep,) view and str_replace (changed line -> clean)."""
    from envs.swe import generate

    rng, out, schemas = random.Random(seed + 113), [], _schemas()
    while len(out) < n:
        task = generate(seed * 1_000_003 + 800_000 + len(out), levels[len(out) % len(levels)])
        path = rng.choice(sorted(p for p in task.fixed_files if p.endswith(".py") and "test" not in p))
        clean = task.fixed_files[path]
        fns = [f for f in ast.parse(clean).body if isinstance(f, ast.FunctionDef) and len(f.body) > 1]
        if not fns:
            continue
        fn = rng.choice(fns)
        lines = clean.split("\n")
        k = rng.randrange(fn.body[1].lineno - 1, fn.end_lineno)  # a body line after the docstring
        new = mutate_line(lines[k], rng, _names(clean))
        if new is None:
            continue
        lines[k] = new
        if _is_held_out("\n".join(lines[fn.lineno - 1 : fn.end_lineno])):
            continue  # the random change is one of the held-out bugs: never train on those
        files = dict(task.fixed_files) | {path: "\n".join(lines)}
        statement = f"`{fn.name}` in `{path}` gives a wrong result."
        bug = {"path": path, "function": fn.name}
        out.append((_first_turns(files, task.fixed_files, statement, task.level, bug), schemas))
    return out


def _code_copy_examples(n: int, seed: int, p_mutate: float = 0.0) -> list[tuple[list[dict], None]]:
    """Copy drills for the editor: lines of a generated package's source as `str_replace_editor view` shows them
    (numbered), to be written back as the JSON string an old_str is (one to four lines, indentation kept); with
    probability `p_mutate` one shown line has a token changed at random first, so recall cannot supply it."""
    from envs.swe import generate

    rng, out = random.Random(seed + 91), []
    while len(out) < n:
        task = generate(seed * 1_000_003 + 400_000 + len(out), rng.choice((1, 2)))
        text = task.files[task.bug["path"]]
        lines = text.splitlines()
        k = rng.choice((1, 1, 2, 3, 4))
        i = rng.randrange(max(1, len(lines) - k))
        lines = lines[i : i + k]
        if p_mutate and rng.random() < p_mutate:  # no draw at 0: older recipes rebuild the same
            for j in rng.sample(range(len(lines)), len(lines)):  # the first shown line that has a token
                new = mutate_line(lines[j], rng, _names(text))
                if new is not None:
                    lines[j] = new
                    break
        shown = "\n".join(f"{i + j + 1:6d}\t{ln}" for j, ln in enumerate(lines))
        out.append(copy_drill(shown, json.dumps("\n".join(lines))))
    return out


def swe_conversations(cfg: TinyConfig, seed: int) -> list:
    return (
        _swe_examples(cfg.n_swe, seed)
        + _code_copy_examples(cfg.n_code_copy, seed, cfg.code_copy_mutate)
        + _swe_fix_turns(cfg.n_swe_fix, seed)
        + _spot_turns(cfg.n_swe_spot, seed)
        + _recover_turns(cfg.n_swe_recover, seed)
    )
