"""`calculator(expression)`: exact arithmetic by walking a Python AST, never `eval`.

Supports + - * / // % ** (also x, ×, ÷, ^ and 1,234-style thousands separators), parentheses, unary signs,
ints and floats. Integers stay exact (big numbers are the point); results are capped at MAX_BITS so `9**9**9`
cannot eat the machine. Errors come back as "Error: ..." strings.

    evaluate("123456789 * 987654321")   # 121932631112635269
    evaluate("7 / 2")                   # 3.5
"""

from __future__ import annotations

import ast
import math
import operator
import re
import warnings

from envs.tools.base import Tool

MAX_CHARS = 300
MAX_BITS = 4096  # ~1233 decimal digits
MAX_DEPTH = 50  # parentheses; with MAX_CHARS this keeps the recursive walk far from Python's stack limit

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_SOURCE = "<calculator>"


def _quiet_parse_warnings() -> None:
    """The model's expressions warn while they parse ("1if x": SyntaxWarning, invalid decimal literal), into the run's
    log as "<unknown>:1: SyntaxWarning"; they are the model's text, not code, so warnings from our source name are
    ignored. Installed on use, not at import: a caller's catch_warnings block (pytest's collection) drops filters
    added inside it."""
    if not any(f[2] is SyntaxWarning and f[3] is not None and f[3].pattern == _SOURCE for f in warnings.filters):
        warnings.filterwarnings("ignore", category=SyntaxWarning, module=_SOURCE)


_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")


class CalcError(ValueError):
    pass


def evaluate(expression: str) -> int | float:
    """Value of an arithmetic expression; raises CalcError (with a message for the model) otherwise."""
    if not isinstance(expression, str) or not expression.strip():
        raise CalcError("empty expression")
    if len(expression) > MAX_CHARS:
        raise CalcError(f"expression longer than {MAX_CHARS} characters")
    expr = expression.replace("×", "*").replace("÷", "/").replace("^", "**").replace("x", "*")
    expr = _THOUSANDS.sub("", expr.replace("−", "-")).strip().rstrip("=").strip()
    if expr.count("(") > MAX_DEPTH:
        raise CalcError("expression too deeply nested")
    _quiet_parse_warnings()
    try:
        tree = ast.parse(expr, filename=_SOURCE, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise CalcError(f"cannot parse {expression.strip()!r}") from None
    return _eval(tree.body)


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return _check(node.value)
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.UAdd, ast.USub)):
        value = _eval(node.operand)
        return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _eval(node.left), _eval(node.right)
        if isinstance(node.op, ast.Pow):
            _check_power(left, right)
        try:
            return _check(_BINOPS[type(node.op)](left, right))
        except ZeroDivisionError:
            raise CalcError("division by zero") from None
        except OverflowError:
            raise CalcError("result too large") from None
    raise CalcError(f"unsupported syntax: {type(node).__name__}; use numbers, + - * / // % ** and ()")


def _check_power(base: int | float, exp: int | float) -> None:
    """Refuse powers whose result would exceed MAX_BITS before computing them."""
    if isinstance(exp, int) and isinstance(base, int) and abs(base) > 1 and exp > 0:
        if exp * abs(base).bit_length() > MAX_BITS + abs(base).bit_length():
            raise CalcError("result too large")
    elif isinstance(exp, (int, float)) and abs(exp) > 10_000:
        raise CalcError("exponent too large")
    if base == 0 and exp < 0:
        raise CalcError("division by zero")


def _check(value: int | float | complex) -> int | float:
    if isinstance(value, complex):
        raise CalcError("result is not a real number")
    if isinstance(value, int) and value.bit_length() > MAX_BITS:
        raise CalcError("result too large")
    if isinstance(value, float) and not math.isfinite(value):
        raise CalcError("result too large")
    return value


def format_number(value: int | float) -> str:
    """Exact ints as digits; floats with up to 12 significant digits, integral ones without '.0'."""
    if isinstance(value, int):
        return str(value)
    if value.is_integer() and abs(value) < 1e15:
        return str(int(value))
    return f"{value:.12g}"


class CalculatorTool(Tool):
    name = "calculator"
    description = "Evaluate an arithmetic expression exactly, e.g. '123 * (45 + 6)'."
    parameters = {
        "type": "object",
        "properties": {"expression": {"type": "string", "description": "numbers with + - * / // % ** ( )"}},
        "required": ["expression"],
    }

    def __call__(self, expression: str) -> str:
        try:
            return format_number(evaluate(expression))
        except CalcError as e:
            return f"Error: {e}"
