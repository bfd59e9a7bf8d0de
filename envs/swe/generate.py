"""Generated bug-fix tasks, SWE-smith style: a small Python package built from `templates`, one injected bug, the
tests that catch it, and an issue written from the failing behaviour.

    task = generate(seed=3, level=1)           # deterministic in (split, level, seed)
    task.files / task.fixed_files              # path -> text: the buggy base and the fixed tree
    task.fail_to_pass, task.pass_to_pass       # test ids (tests/test_<module>.py::test_...)
    task.problem_statement                     # the issue, as a user would report it (never the fix)

A bug is one AST mutation of one function: operator swap, off-by-one, wrong constant, inverted condition, wrong
variable, or missing return or branch. Both trees are `ast.unparse` of the same templates, so the gold patch is
exactly the mutated lines. Expected outputs come from running the fixed code; a mutation is kept only when some test
input tells it apart (tests that fail on the bug become FAIL_TO_PASS and live in the hidden test patch; the rest are
the repository's visible tests, PASS_TO_PASS). Bugs are split by a hash of (function, kind, site): a bug that
`split="test"` can draw is never drawn by `split="train"`, so held-out instances are unseen bugs.

The package is one of six repositories, one per theme (`REPOSITORIES`), so many bugs share a repository as in
SWE-smith. Levels: 1 = one module, the issue names the function, its file, the call and the expected value; 2 =
three modules re-exported by the package, the issue gives the call and the expected value but not the file; 3 =
the same layout, and the issue only names the function and a bad input.
"""

from __future__ import annotations

import ast
import copy
import random
import sys
import zlib
from dataclasses import dataclass, field

from envs.swe.mutate import Mutation, mutations
from envs.swe.templates import THEMES, Fn

KINDS = (
    "operator swap",
    "off-by-one",
    "wrong constant",
    "inverted condition",
    "wrong variable",
    "missing return or branch",
)
LEVELS = (1, 2, 3)
HELD_OUT = 5  # one bug in 5 (by hash) is reserved for split="test"


# The repository (package) of each theme, and its modules' names (a task's module is one of three). As in SWE-smith,
# where thousands of bugs come from ~100 repositories, many bugs share a repository: a small model can learn the
# few package names instead of having to copy an unseen one out of the issue.
# No name here is one of the shipped swe_mini suite's repositories (envs/data/swe_mini/repos), which stay unseen.
REPOSITORIES = {
    "text": "strtools",
    "numbers": "numlib",
    "lists": "listtools",
    "dates": "datebox",
    "pricing": "pricecore",
    "grades": "gradebook",
}
MODULE_NAMES = {
    "text": ("text", "strings", "textops"),
    "numbers": ("numbers", "mathutil", "stats"),
    "lists": ("lists", "seqtools", "listops"),
    "dates": ("dates", "calendar_utils", "timeutil"),
    "pricing": ("pricing", "billing", "checkout"),
    "grades": ("grades", "scores", "grading"),
}


@dataclass
class Task:
    split: str
    level: int
    seed: int
    package: str
    files: dict[str, str]  # the buggy base: path -> text (tests without the hidden ones)
    fixed_files: dict[str, str]  # the same paths after the gold patch
    test_files: dict[str, str]  # test files as the hidden test patch leaves them
    fail_to_pass: list[str]
    pass_to_pass: list[str]
    problem_statement: str
    bug: dict = field(default_factory=dict)  # kind, function, path, description

    @property
    def instance_id(self) -> str:
        return f"nanosky-gen__{self.package}-L{self.level}-{self.split}{self.seed}"


# ---------------------------------------------------------------------------------------------- mutations


# ---------------------------------------------------------------------------------------------- running


class Runaway(Exception):
    """A call ran more than `run_module`'s line budget (a bug that loops over a list it grows)."""


def run_module(source: str, calls: list[tuple[str, tuple]], budget: int = 20_000) -> list[tuple[str, object]]:
    """(status, value) of each call `fn(*args)` on a fresh exec of `source`: ("ok", result), ("raise", "Err: msg")
    or ("runaway", ...) when the call executed more than `budget` lines (traced, so a mutated loop that grows its
    own list is stopped before it eats the memory). In-process: our own templates, mutated."""
    ns: dict = {"__name__": "generated"}
    exec(compile(source, "<generated>", "exec"), ns)  # noqa: S102
    out = []
    for name, args in calls:
        left = [budget]

        def tracer(frame, event, arg, left=left):
            if frame.f_code.co_filename != "<generated>":
                return None
            if event == "line":
                left[0] -= 1
                if left[0] < 0:
                    raise Runaway(f"over {budget} lines")
            return tracer

        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            out.append(("ok", ns[name](*copy.deepcopy(args))))
        except Runaway as e:
            out.append(("runaway", str(e)))
        except Exception as e:  # noqa: BLE001 - a bug that raises is a failing test
            out.append(("raise", f"{type(e).__name__}: {e}"))
        finally:
            sys.settrace(previous)
    return out


def _passes(got: tuple[str, object], want: tuple[str, object]) -> bool:
    """What `assert fn(args) == expected` concludes (expected from the fixed code, which never raises)."""
    try:
        return got[0] == "ok" and bool(got[1] == want[1])
    except Exception:  # noqa: BLE001
        return False


def _call(name: str, args: tuple) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


# ---------------------------------------------------------------------------------------------- packages


def _functions(theme: str, names: list[str]) -> list[Fn]:
    """The named functions of a theme plus what they call, in template order."""
    table = {f.name: f for f in THEMES[theme]}
    want = set(names)
    for n in names:
        want |= set(table[n].deps)
    return [f for f in THEMES[theme] if f.name in want]


def _module_source(theme: str, fns: list[Fn], override: dict[str, str] | None = None) -> str:
    parts = [ast.unparse(ast.parse((override or {}).get(f.name, f.source))) for f in fns]
    return f'"""{theme.capitalize()} helpers."""\n\n\n' + "\n\n\n".join(parts) + "\n"


def _test_source(package: str, module: str, tests: list[tuple[str, str, tuple, object]]) -> str:
    names = sorted({t[1] for t in tests})
    head = f"from {package}.{module} import {', '.join(names)}\n" if names else ""
    body = "".join(f"\n\ndef {tid}():\n    assert {_call(fn, args)} == {want!r}\n" for tid, fn, args, want in tests)
    return head + body


def _held_out(fn: str, m: Mutation) -> bool:
    return zlib.crc32(f"{fn}|{m.kind}|{m.site}".encode()) % HELD_OUT == 0


def generate(seed: int, level: int = 1, split: str = "train") -> Task:
    """One task, deterministic in (split, level, seed). Raises ValueError for a bad split or level."""
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")
    rng = random.Random(f"swe-gen|{split}|{level}|{seed}")
    for _ in range(100):  # a target whose every bug is in the other split (or undetectable) is redrawn
        task = _attempt(rng, seed, level, split)
        if task is not None:
            return task
    raise RuntimeError(f"no task for seed {seed} level {level} split {split}")  # never seen: 1 try in ~10 fails


def _attempt(rng: random.Random, seed: int, level: int, split: str) -> Task | None:
    themes = sorted(THEMES)
    picked = [rng.choice(themes)] if level == 1 else rng.sample(themes, 3)
    package = REPOSITORIES[picked[0]]  # the bug's theme names the repository
    modules = {th: rng.choice(MODULE_NAMES[th]) for th in picked}
    chosen = {th: _functions(th, rng.sample([f.name for f in THEMES[th]], 3)) for th in picked}
    target_theme = picked[0]
    target: Fn = rng.choice(chosen[target_theme])
    muts = [m for m in mutations(target.source) if _held_out(target.name, m) == (split == "test")]
    by_kind: dict[str, list[Mutation]] = {}
    for m in muts:
        by_kind.setdefault(m.kind, []).append(m)
    kinds = sorted(by_kind)
    rng.shuffle(kinds)
    fns = chosen[target_theme]
    calls = [(f.name, args) for f in fns for args in f.inputs]
    fixed_src = _module_source(target_theme, fns)
    want = run_module(fixed_src, calls)
    if any(s != "ok" for s, _ in want):
        raise RuntimeError(f"template of {target_theme} raises on its own inputs: {want}")
    for kind in kinds:  # one kind at random, then its sites at random: every kind is equally likely
        for m in rng.sample(by_kind[kind], len(by_kind[kind])):
            fn_ast = ast.parse(target.source).body[0]
            m.apply(fn_ast)
            try:
                buggy_fn = ast.unparse(fn_ast)
                compile(buggy_fn, "<bug>", "exec")
            except (SyntaxError, ValueError, TypeError):
                continue
            buggy_src = _module_source(target_theme, fns, {target.name: buggy_fn})
            if buggy_src == fixed_src:
                continue
            got = run_module(buggy_src, calls)
            if any(g[0] == "runaway" for g in got):  # its test would hang in pytest: not a bug we want
                continue
            failing = [i for i, (g, w) in enumerate(zip(got, want)) if not _passes(g, w)]
            if not failing or not any(calls[i][0] == target.name for i in failing):
                continue
            return _assemble(
                seed,
                level,
                split,
                package,
                picked,
                modules,
                chosen,
                target,
                m,
                calls,
                want,
                got,
                failing,
                fixed_src,
                buggy_src,
            )
    return None


def _assemble(
    seed, level, split, package, picked, modules, chosen, target, m, calls, want, got, failing, fixed_src, buggy_src
) -> Task:
    target_theme = picked[0]
    mod = modules[target_theme]
    path = f"{package}/{mod}.py"
    files = {
        "README.md": f"# {package}\n\nSmall helpers ({', '.join(modules.values())}). Tests: `python -m pytest`.\n",
        "conftest.py": "# puts the repository root on sys.path, so `pytest` imports the package from here\n",
    }
    init = f'"""{package}: small helpers."""\n'
    if level > 1:
        init += "".join(
            f"from {package}.{modules[th]} import {', '.join(f.name for f in chosen[th])}\n" for th in picked
        )
    files[f"{package}/__init__.py"] = init
    fixed, tests = dict(files), {}
    f2p, p2p, hidden = [], [], []
    for th in picked:
        m_name = modules[th]
        if th == target_theme:
            files[path], fixed[path] = buggy_src, fixed_src
            results = zip(calls, want, range(len(calls)))
        else:
            src = _module_source(th, chosen[th])
            files[f"{package}/{m_name}.py"] = fixed[f"{package}/{m_name}.py"] = src
            th_calls = [(f.name, a) for f in chosen[th] for a in f.inputs]
            results = zip(th_calls, run_module(src, th_calls), [None] * len(th_calls))
        visible, counts = [], {}
        for (fn, args), (_, value), i in results:
            k = counts[fn] = counts.get(fn, -1) + 1
            test = (f"test_{fn}_{k}", fn, args, value)
            tid = f"tests/test_{m_name}.py::test_{fn}_{k}"
            if i is not None and i in failing:
                hidden.append(test)
                f2p.append(tid)
            else:
                visible.append(test)
                p2p.append(tid)
        files[f"tests/test_{m_name}.py"] = fixed[f"tests/test_{m_name}.py"] = _test_source(package, m_name, visible)
        if th == target_theme:
            tests[f"tests/test_{m_name}.py"] = _test_source(package, m_name, visible + hidden)
    shown = [i for i in failing if calls[i][0] == target.name]
    i = shown[0]
    statement = _statement(level, package, mod, target, _call(*calls[i]), got[i], want[i][1])
    bug = {"kind": m.kind, "function": target.name, "path": path, "description": m.describe, "site": m.site}
    return Task(split, level, seed, package, files, fixed, tests, f2p, p2p, statement, bug)


def _statement(level: int, package: str, module: str, fn: Fn, call: str, got: tuple, want: object) -> str:
    """The issue, from the failing call: what a user would report, never the fix."""
    shows = f"raises {got[1]}" if got[0] == "raise" else f"returns {got[1]!r}"
    if level == 1:
        repl = f"Traceback (most recent call last):\n  ...\n{got[1]}" if got[0] == "raise" else repr(got[1])
        return (
            f"`{fn.name}` in `{package}/{module}.py` {'fails' if got[0] == 'raise' else 'gives a wrong result'}"
            f"\n\n```\n>>> from {package}.{module} import {fn.name}\n>>> {call}\n{repl}\n```\n\n"
            f"Expected `{want!r}`.\n"
        )
    if level == 2:
        return f"Wrong result from `{package}.{fn.name}`\n\n`{call}` {shows}, but it should return `{want!r}`.\n"
    doc = ast.get_docstring(ast.parse(fn.source).body[0]) or ""
    return (
        f"`{package}.{fn.name}` misbehaves\n\nIt does not do what its documentation says ({doc.splitlines()[0]!r})"
        f" for some inputs, for example `{call}`.\n"
    )
