"""Math with a calculator tool: an answer that writes `calc(<expression>)` gets the value back as the next user
turn ("calc(23*45) = 1035"); an answer that calls no tool is final. Shows the environment interface is not
code-specific: the reward still comes from the math verifier on the final answer.

Expressions are evaluated on the host by walking their syntax tree (numbers, + - * / // % ** and parentheses
only; exponents and magnitudes bounded), never by eval().
"""

from __future__ import annotations

import ast
import operator
import re
from collections.abc import Callable
from typing import Any

from training.environments.base import Step, register_environment
from training.tasksets.schema import Task

_CALL = re.compile(r"calc\(([^()]*(?:\([^()]*\)[^()]*)*)\)")
_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_MAX_ABS = 10**12
TOOL_HINT = "Tool: write calc(<expression>) to compute; the result comes back."


def calculate(expression: str) -> int | float:
    """The value of an arithmetic expression (ValueError naming what is not allowed)."""
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from None

    def value(node: ast.AST) -> int | float:
        if isinstance(node, ast.Constant) and isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
            return node.value
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            v = value(node.operand)
            return -v if isinstance(node.op, ast.USub) else v
        if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
            left, right = value(node.left), value(node.right)
            if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
                raise ValueError("exponent too large")
            try:
                out = _OPS[type(node.op)](left, right)
            except ZeroDivisionError:
                raise ValueError("division by zero") from None
            if isinstance(out, complex) or abs(out) > _MAX_ABS:
                raise ValueError("result out of range")
            return out
        raise ValueError(f"{type(node).__name__} is not allowed (numbers and + - * / // % ** only)")

    return value(tree.body)


@register_environment("calculator")
class CalculatorEnv:
    name = "calculator"

    def __init__(self, task: Task) -> None:
        self.task = task

    def reset(self, task: Task) -> list[dict[str, str]]:
        self.task = task
        return [{"role": "user", "content": f"{task.prompt}\n{TOOL_HINT}"}]

    def step(self, completion: str) -> Step:
        calls = _CALL.findall(completion)
        if not calls:
            return Step(None, True, {"tool_calls": 0})
        lines = []
        for expression in calls[:4]:  # a few per turn: an answer cannot make the reply arbitrarily long
            try:
                result = calculate(expression)
                shown = str(int(result)) if isinstance(result, float) and result.is_integer() else str(result)
                lines.append(f"calc({expression}) = {shown}")
            except ValueError as err:
                lines.append(f"calc({expression}) error: {err}")
        return Step("\n".join(lines), False, {"tool_calls": len(calls)})
