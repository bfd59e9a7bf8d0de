"""The house rule: imports run one way, `algos ← envs ← nanosky ← evals ← run.py / bench / examples / tests`,
inside `nanosky/` too (`INNER`: configs ← the floor ← the players ← training ← the run on top), and no two modules
import each other, directly or round a longer loop.

Plain `ast`, no imports of the code under test: every `import` / `from ... import` in every file is read,
function-level ones included, and those under `if TYPE_CHECKING:` too: a floor does not import what stands on it,
even for a type, and a circle of type imports is still a circle.
    python tests/unit/test_layers.py        # prints the graph's violations, if any
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# Lower layers first; a module may import its own layer and those before it.
LAYERS = ["algos", "envs", "nanosky", "evals"]
TOP = ["run.py", "bench", "examples", "tests"]  # the top layer: may import anything, imported by nothing
# Inside nanosky/, lower floors first; a room may import its own floor and those below. Every other nanosky module
# (collect, trainer, evaluate, sync, cli, startup, presets, tiny, ...) stands on top of them all.
INNER = [
    [
        "nanosky.config",
        "nanosky.seeds",
        "nanosky.process",
        "nanosky.dist",
        "nanosky.precision",
        "nanosky.exports",
    ],  # the leaf: configs, the rank's facts, the process's life, seeds, precision, where a run keeps its models
    ["nanosky.rollout"],  # the floor: engine, env pool, chat rendering, constrained sampling, the rank's loop
    ["nanosky.agent"],  # the built-in player (and the Player interface, Task, Trajectory)
    ["nanosky.endpoint"],  # the external-agent player and its OpenAI-compatible endpoint
    ["nanosky.train"],  # the training side: trajectories in, gradients out
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def project_files() -> dict[str, Path]:
    files = {}
    for top in LAYERS + TOP:
        p = ROOT / top
        paths = [p] if p.is_file() else sorted(p.rglob("*.py"))
        for f in paths:
            if "data" in f.relative_to(ROOT).parts[:-1]:  # shipped data (the swe suite's repos), not the project
                continue
            files[module_name(f)] = f
    return files


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(path: Path, mod: str, type_checking: bool = True) -> list[tuple[str, int]]:
    """Every module name `path` imports, with its line (`type_checking=False`: skipping `if TYPE_CHECKING:`
    bodies). A `from` import gives "pkg.name|pkg": the submodule if there is one, else the package."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = mod if path.name == "__init__.py" else mod.rpartition(".")[0]
    out: list[tuple[str, int]] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and _is_type_checking(node.test) and not type_checking:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            out.extend((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: climb from this module's package
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                base_name = ".".join(base + ([node.module] if node.module else []))
            else:
                base_name = node.module or ""
            # `from pkg import sub` names the submodule pkg.sub when there is one, else pkg itself
            out.extend((f"{base_name}.{a.name}|{base_name}", node.lineno) for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return out


def import_graph() -> tuple[dict[str, set[str]], dict[tuple[str, str], int]]:
    """module -> the project modules it imports (only names that are project modules)."""
    files = project_files()
    graph: dict[str, set[str]] = {m: set() for m in files}
    lines: dict[tuple[str, str], int] = {}
    for mod, path in files.items():
        for names, line in imported_names(path, mod):
            name = next((n for n in names.split("|") if n in files), None)
            if name is not None and name != mod:
                graph[mod].add(name)
                lines.setdefault((mod, name), line)
    return graph, lines


def layer_of(mod: str) -> int:
    top = mod.split(".")[0]
    return LAYERS.index(top) if top in LAYERS else len(LAYERS)


def floor_of(mod: str) -> int:
    """A nanosky module's floor in `INNER` (the top: len(INNER))."""
    for i, rooms in enumerate(INNER):
        if any(mod == r or mod.startswith(r + ".") for r in rooms):
            return i
    return len(INNER)


def inner_upward_imports() -> list[str]:
    graph, lines = import_graph()
    bad = []
    for mod, deps in graph.items():
        if mod.split(".")[0] != "nanosky":
            continue
        for dep in deps:
            if dep.split(".")[0] == "nanosky" and floor_of(dep) > floor_of(mod):
                bad.append(f"{mod}:{lines[mod, dep]} imports {dep} (floor {floor_of(dep)} is above {floor_of(mod)})")
    return sorted(bad)


def upward_imports() -> list[str]:
    graph, lines = import_graph()
    bad = []
    for mod, deps in graph.items():
        for dep in deps:
            if layer_of(dep) > layer_of(mod):
                bad.append(
                    f"{mod}:{lines[mod, dep]} imports {dep} (layer {dep.split('.')[0]} is above {mod.split('.')[0]})"
                )
    return sorted(bad)


def import_cycles() -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan), each as a sorted list."""
    graph, _ = import_graph()
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    sccs: list[list[str]] = []

    def strongconnect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph[v]):
            if w not in index:
                strongconnect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                sccs.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            strongconnect(v)
    return sorted(sccs)


def test_graph_sees_the_project():
    graph, _ = import_graph()
    # the walk must find every layer and real edges, or the two rules below pass on nothing
    assert {m.split(".")[0] for m in graph} >= set(LAYERS)
    assert "algos.registry" in graph["algos.advantages"]
    assert sum(len(d) for d in graph.values()) > 200


def test_parser_reads_function_level_and_relative_imports(tmp_path):
    f = tmp_path / "m.py"
    f.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    import evals.common\n"
        "def g():\n    from nanosky import engine\n"
        "from . import sib\n"
    )
    names = [n for n, _ in imported_names(f, "envs.swe.m")]
    assert "nanosky.engine|nanosky" in names  # function-level
    assert "envs.swe.sib|envs.swe" in names  # relative, resolved
    assert "evals.common" in names  # TYPE_CHECKING counts
    assert not any(n.startswith("evals") for n, _ in imported_names(f, "envs.swe.m", type_checking=False))


def test_no_upward_imports():
    bad = upward_imports()
    assert not bad, "imports must run algos <- envs <- nanosky <- evals <- run.py/bench/tests:\n" + "\n".join(bad)


def test_nanosky_floors_import_only_downward():
    bad = inner_upward_imports()
    assert not bad, (
        "inside nanosky/, imports must run " + " <- ".join(r[0] for r in INNER) + " <- the rest:\n" + ("\n".join(bad))
    )


def test_the_inner_rule_sees_a_floor_importing_a_room_above(tmp_path, monkeypatch):
    # the rule must fire on the shape it forbids, or it passes on nothing
    assert floor_of("nanosky.rollout.engine") < floor_of("nanosky.agent.runner") < floor_of("nanosky.trainer")
    graph, lines = import_graph()
    graph = {**graph, "nanosky.rollout.chat": graph["nanosky.rollout.chat"] | {"nanosky.collect"}}
    monkeypatch.setitem(
        globals(), "import_graph", lambda: (graph, {**lines, ("nanosky.rollout.chat", "nanosky.collect"): 1})
    )
    assert "nanosky.rollout.chat:1 imports nanosky.collect (floor 5 is above 1)" in inner_upward_imports()


def test_no_import_cycles():
    cycles = import_cycles()
    assert not cycles, "import cycles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


if __name__ == "__main__":
    print("\n".join(upward_imports() + inner_upward_imports()))
    for c in import_cycles():
        print("cycle:", " <-> ".join(c))
