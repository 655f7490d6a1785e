"""MBPP/HumanEval-style `assert` lines -> TestCases, on the host.

Only assertions whose comparison can move to the host are accepted: `assert <call> == <literal>` (either
side), `assert <call> is None/True/False`, `assert math.isclose(<call>, <literal>, ...)`,
`assert abs(<call> - <literal>) < <tol>`, and bare `assert <call>` / `assert not <call>`. Anything else
(`!=`, `<`, `in`, helper code between asserts) raises ValueError naming the line: evaluating such a check
inside the sandbox would let the candidate's objects decide it (`__ne__`, `__contains__`, ...).
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from sandbox.spec import TestCase

_SAFE_CALLS = {
    "set": set,
    "frozenset": frozenset,
    "tuple": tuple,
    "list": list,
    "dict": dict,
    "float": float,
    "int": int,
    "str": str,
    "complex": complex,
    "bool": bool,
    "bytes": bytes,
}
_MATH_CONSTS = {"inf": math.inf, "nan": math.nan, "pi": math.pi, "e": math.e, "tau": math.tau}
_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}


class _NotLiteral(Exception):
    pass


def literal_value(node: ast.AST) -> Any:
    """A host-side value for `node` without executing arbitrary code: literals, plus a few pure
    constructors (set([...]), tuple(...), float('inf')), math constants and small arithmetic."""
    try:
        return ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        pass
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in _SAFE_CALLS
        and not node.keywords
        and len(node.args) <= 1
    ):
        args = [literal_value(a) for a in node.args]
        try:
            return _SAFE_CALLS[node.func.id](*args)
        except (TypeError, ValueError) as exc:
            raise _NotLiteral(str(exc)) from None
    if (
        isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Name)
        and node.value.id == "math"
        and node.attr in _MATH_CONSTS
    ):
        return _MATH_CONSTS[node.attr]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
        value = literal_value(node.operand)
        if isinstance(value, (int, float, complex)) and not isinstance(value, bool):
            return -value if isinstance(node.op, ast.USub) else value
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = literal_value(node.left), literal_value(node.right)
        if all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in (left, right)):
            if isinstance(node.op, ast.Pow) and abs(right) > 1000:
                raise _NotLiteral("exponent too large")
            try:
                return _BINOPS[type(node.op)](left, right)
            except (ArithmeticError, ValueError) as exc:
                raise _NotLiteral(str(exc)) from None
    raise _NotLiteral(ast.unparse(node))


def _is_literal(node: ast.AST) -> bool:
    try:
        literal_value(node)
        return True
    except _NotLiteral:
        return False


def _number(node: ast.AST, what: str) -> float:
    value = literal_value(node)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
        raise _NotLiteral(f"{what} must be a non-negative number")
    return float(value)


def _is_name(node: ast.AST, *names: str) -> bool:
    if isinstance(node, ast.Name):
        return node.id in names
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name):
        return f"{node.value.id}.{node.attr}" in names
    return False


def _case(test: ast.expr) -> TestCase | None:
    if isinstance(test, ast.Constant) and test.value is True:
        return None  # `assert True` (HumanEval's debugging line): nothing to check
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        left, op, right = test.left, test.ops[0], test.comparators[0]
        if isinstance(op, ast.Eq):
            if _is_literal(right):
                return TestCase(ast.unparse(left), literal_value(right))
            if _is_literal(left):
                return TestCase(ast.unparse(right), literal_value(left))
            raise _NotLiteral("neither side of == is a literal the host can evaluate")
        if isinstance(op, ast.Is) and isinstance(right, ast.Constant) and right.value in (None, True, False):
            return TestCase(ast.unparse(left), right.value)
        if (
            isinstance(op, (ast.Lt, ast.LtE))
            and isinstance(left, ast.Call)
            and _is_name(left.func, "abs")
            and len(left.args) == 1
            and isinstance(left.args[0], ast.BinOp)
            and isinstance(left.args[0].op, ast.Sub)
        ):
            diff = left.args[0]
            tol = _number(right, "tolerance")
            if _is_literal(diff.right):
                return TestCase(ast.unparse(diff.left), literal_value(diff.right), abs_tol=tol)
            if _is_literal(diff.left):
                return TestCase(ast.unparse(diff.right), literal_value(diff.left), abs_tol=tol)
        raise _NotLiteral(f"unsupported comparison {type(op).__name__}")
    if isinstance(test, ast.Call) and _is_name(test.func, "math.isclose", "isclose") and len(test.args) == 2:
        kwargs = {k.arg: k.value for k in test.keywords}
        if set(kwargs) - {"rel_tol", "abs_tol"}:
            raise _NotLiteral("isclose accepts only rel_tol and abs_tol")
        rel = _number(kwargs["rel_tol"], "rel_tol") if "rel_tol" in kwargs else 1e-9
        abs_ = _number(kwargs["abs_tol"], "abs_tol") if "abs_tol" in kwargs else 0.0
        a, b = test.args
        if _is_literal(b):
            return TestCase(ast.unparse(a), literal_value(b), rel_tol=rel, abs_tol=abs_)
        if _is_literal(a):
            return TestCase(ast.unparse(b), literal_value(a), rel_tol=rel, abs_tol=abs_)
        raise _NotLiteral("neither isclose argument is a literal")
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return TestCase(f"bool({ast.unparse(test.operand)})", False)
    if isinstance(test, (ast.Call, ast.Name, ast.Attribute, ast.Subscript)):
        # the expected truth value is stated by the test itself, so computing bool() inside is no loophole
        return TestCase(f"bool({ast.unparse(test)})", True)
    raise _NotLiteral(f"unsupported assertion {type(test).__name__}")


class _Rename(ast.NodeTransformer):
    def __init__(self, old: str, new: str) -> None:
        self.old, self.new = old, new

    def visit_Name(self, node: ast.Name) -> ast.AST:
        return ast.copy_location(ast.Name(self.new, node.ctx), node) if node.id == self.old else node


def parse_assert_tests(source: str, entry_point: str | None = None) -> list[TestCase]:
    """Turn assert lines into TestCases. With `entry_point`, a HumanEval `def check(candidate): ...` body
    is read instead, `candidate` renamed to the entry point. Imports, `pass`, docstrings and `assert True`
    are skipped; any other statement is a ValueError naming its line."""
    try:
        tree = ast.parse(source)
    except SyntaxError as exc:
        raise ValueError(f"line {exc.lineno}: tests are not valid Python: {exc.msg}") from None
    body: list[ast.stmt] = tree.body
    if entry_point is not None:
        checks = [s for s in tree.body if isinstance(s, ast.FunctionDef) and s.name == "check"]
        if checks:
            check = checks[0]
            if len(check.args.args) != 1:
                raise ValueError(f"line {check.lineno}: check() must take exactly one argument")
            renamed = _Rename(check.args.args[0].arg, entry_point).visit(check)
            body = renamed.body
    cases: list[TestCase] = []
    lines = source.splitlines()
    for stmt in body:
        if isinstance(stmt, (ast.Import, ast.ImportFrom, ast.Pass)):
            continue
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant) and isinstance(stmt.value.value, str):
            continue
        if (
            isinstance(stmt, ast.Assign)
            and entry_point is not None
            and all(isinstance(t, ast.Name) and t.id == "METADATA" for t in stmt.targets)
        ):
            continue  # HumanEval metadata dict
        text = lines[stmt.lineno - 1].strip() if 0 < stmt.lineno <= len(lines) else ast.unparse(stmt)
        if not isinstance(stmt, ast.Assert):
            raise ValueError(f"line {stmt.lineno}: `{text}` is not an assert; only assert lines can become test cases")
        try:
            case = _case(stmt.test)
        except (_NotLiteral, ValueError) as exc:
            raise ValueError(
                f"line {stmt.lineno}: cannot turn `{text}` into a test case ({exc}); supported: "
                "assert <call> == <literal>, is None/True/False, math.isclose, abs(a - b) < tol, "
                "bare or negated calls"
            ) from None
        if case is not None:
            cases.append(case)
    if not cases:
        raise ValueError("no assert statements found")
    return cases
