"""The bugs `generate` injects: every candidate AST mutation of one function, in a deterministic order (operator
swap, off-by-one, wrong constant, inverted condition, wrong variable, missing return or branch).

    for m in mutations(fn_source): tree = copy.deepcopy(fn); m.apply(tree)   # m.kind, m.site, m.describe
"""

from __future__ import annotations

import ast
import copy
from collections.abc import Callable
from dataclasses import dataclass

_BIN = {
    ast.Add: ast.Sub,
    ast.Sub: ast.Add,
    ast.Mult: ast.Add,
    ast.Div: ast.FloorDiv,
    ast.FloorDiv: ast.Div,
    ast.Mod: ast.FloorDiv,
    ast.Pow: ast.Mult,
}
_CMP = {
    ast.Lt: ast.LtE,
    ast.LtE: ast.Lt,
    ast.Gt: ast.GtE,
    ast.GtE: ast.Gt,
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
}
_STR = {"-": "_", "_": "-", ".": ",", "0": " ", "?": ""}


@dataclass
class Mutation:
    kind: str
    site: int  # index among the function's candidate sites: (function, kind, site) names the bug
    describe: str
    apply: Callable[[ast.FunctionDef], None]  # edits a fresh copy of the function in place


def mutations(src: str) -> list[Mutation]:
    """Every candidate bug of one function's source, in a deterministic order."""
    fn = ast.parse(src).body[0]
    return [Mutation(kind, i, describe, _replay(i)) for i, (kind, describe, _) in enumerate(_sites(fn))]


def _replay(index: int) -> Callable[[ast.FunctionDef], None]:
    # a site's edit holds nodes of the tree it was found in: on a fresh copy, find the same site by its index
    def apply(fn: ast.FunctionDef) -> None:
        list(_sites(fn))[index][2]()

    return apply


def _body_nodes(fn: ast.FunctionDef):
    body = fn.body[1:] if fn.body and _is_docstring(fn.body[0]) else fn.body
    for stmt in body:
        yield from ast.walk(stmt)


def _is_docstring(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str)


def _locals(fn: ast.FunctionDef) -> list[str]:
    names = [a.arg for a in fn.args.args]
    for node in _body_nodes(fn):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store) and node.id not in names:
            names.append(node.id)
    return names


def _sites(fn: ast.FunctionDef):
    """(kind, description, edit) for every mutation site; `edit()` mutates `fn` in place."""
    local = _locals(fn)
    for node in _body_nodes(fn):
        if isinstance(node, (ast.BinOp, ast.AugAssign)) and type(node.op) in _BIN:
            new = _BIN[type(node.op)]
            yield "operator swap", f"{_op(node.op)} -> {_op(new())}", _set(node, "op", new())
        if isinstance(node, ast.Compare):
            for j, op in enumerate(node.ops):
                if type(op) in _CMP:
                    new_ops = node.ops[:j] + [_CMP[type(op)]()] + node.ops[j + 1 :]
                    yield "operator swap", f"{_op(op)} -> {_op(new_ops[j])}", _set(node, "ops", new_ops)
        if isinstance(node, ast.BoolOp):
            new = ast.Or() if isinstance(node.op, ast.And) else ast.And()
            yield "operator swap", f"{_op(node.op)} -> {_op(new)}", _set(node, "op", new)
        if isinstance(node, ast.Constant) and type(node.value) is int:
            if abs(node.value) <= 2:
                for d in (1, -1):
                    yield (
                        "off-by-one",
                        f"{node.value} -> {node.value + d}",
                        _set(node, "value", node.value + d),
                    )
            else:
                for d in (2, -2) if node.value < 10 else (5, -5):
                    yield (
                        "wrong constant",
                        f"{node.value} -> {node.value + d}",
                        _set(node, "value", node.value + d),
                    )
        if isinstance(node, ast.Constant) and type(node.value) is float:
            v = node.value + 1.0 if node.value >= 1 else node.value / 2
            yield "wrong constant", f"{node.value!r} -> {v!r}", _set(node, "value", v)
        if isinstance(node, ast.Constant) and type(node.value) is str:
            v = _STR.get(node.value, node.value[:-1] if len(node.value) >= 3 else None)
            if v is not None:
                yield "wrong constant", f"{node.value!r} -> {v!r}", _set(node, "value", v)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "range":
            k = 1 if len(node.args) >= 2 else 0
            for op, s in ((ast.Add, "+ 1"), (ast.Sub, "- 1")):
                yield "off-by-one", f"range end {s}", _wrap(node.args, k, op)
        if isinstance(node, ast.Subscript):
            if isinstance(node.slice, ast.Name):
                for op, s in ((ast.Add, "+ 1"), (ast.Sub, "- 1")):
                    yield "off-by-one", f"index {s}", _wrap_attr(node, "slice", op)
            if isinstance(node.slice, ast.Slice):
                for part in ("lower", "upper"):
                    if isinstance(getattr(node.slice, part), (ast.Name, ast.BinOp)):
                        for op, s in ((ast.Add, "+ 1"), (ast.Sub, "- 1")):
                            yield "off-by-one", f"slice {part} {s}", _wrap_attr(node.slice, part, op)
        if isinstance(node, (ast.If, ast.IfExp)):
            yield "inverted condition", "condition negated", _negate(node)
        if isinstance(node, ast.comprehension):
            for j in range(len(node.ifs)):
                yield "inverted condition", "filter negated", _negate_if(node, j)
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in local:
            for other in [n for n in local if n != node.id][:2]:
                yield "wrong variable", f"{node.id} -> {other}", _set(node, "id", other)
        for attr in ("body", "orelse"):
            stmts = getattr(node, attr, None)
            if not isinstance(stmts, list):
                continue
            yield from _guards(stmts)
            for j, stmt in enumerate(stmts):
                if isinstance(stmt, ast.Return) and stmt.value is not None and isinstance(node, ast.If):
                    yield "missing return or branch", "return dropped", _unreturn(stmts, j)
        if isinstance(node, ast.IfExp):
            yield "missing return or branch", "else branch removed", _replace_ifexp(node)
    yield from _guards(fn.body)  # the function's own statements are not inside any walked node


def _guards(stmts: list):
    """`if ...: return ...` without an else, in a block with more statements: removing it is a missing branch."""
    for j, stmt in enumerate(stmts):
        if isinstance(stmt, ast.If) and not stmt.orelse and isinstance(stmt.body[-1], ast.Return) and len(stmts) > 1:
            yield "missing return or branch", "guard clause removed", _drop(stmts, j)


def _op(op: ast.AST) -> str:
    return {
        ast.Add: "+",
        ast.Sub: "-",
        ast.Mult: "*",
        ast.Div: "/",
        ast.FloorDiv: "//",
        ast.Mod: "%",
        ast.Pow: "**",
        ast.Lt: "<",
        ast.LtE: "<=",
        ast.Gt: ">",
        ast.GtE: ">=",
        ast.Eq: "==",
        ast.NotEq: "!=",
        ast.In: "in",
        ast.NotIn: "not in",
        ast.And: "and",
        ast.Or: "or",
    }[type(op)]


def _set(node, attr, value):
    return lambda: setattr(node, attr, value)


def _wrap(args: list, k: int, op):
    def edit():
        args[k] = ast.BinOp(args[k], op(), ast.Constant(1))

    return edit


def _wrap_attr(node, attr: str, op):
    return lambda: setattr(node, attr, ast.BinOp(getattr(node, attr), op(), ast.Constant(1)))


def _negate(node):
    def edit():
        t = node.test
        node.test = t.operand if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not) else ast.UnaryOp(ast.Not(), t)

    return edit


def _negate_if(comp: ast.comprehension, j: int):
    return lambda: comp.ifs.__setitem__(j, ast.UnaryOp(ast.Not(), comp.ifs[j]))


def _drop(stmts: list, j: int):
    return lambda: stmts.pop(j)


def _unreturn(stmts: list, j: int):
    return lambda: stmts.__setitem__(j, ast.Expr(stmts[j].value))


def _replace_ifexp(node: ast.IfExp):
    def edit():
        node.orelse = copy.deepcopy(node.body)

    return edit
