"""Tools of the arithmetic family (the inner model calls these; identical in training and eval)."""

from __future__ import annotations

import ast
import operator
import warnings

_OPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul}
_MAX_ABS = 10**12


def _eval(node: ast.AST) -> int:
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_eval(node.operand)
    if isinstance(node, ast.BinOp) and type(node.op) in _OPS:
        value = _OPS[type(node.op)](_eval(node.left), _eval(node.right))
        if abs(value) > _MAX_ABS:
            raise ValueError("result too large")
        return value
    raise ValueError("only integers, + - * and parentheses are supported")


def calculator(expression: str) -> str:
    """Evaluate an integer arithmetic expression exactly.

    Args:
        expression: Integers combined with +, -, * and parentheses, e.g. "17 + 25" or "(3*8)+19".

    Returns:
        The exact integer result as text, or a message starting with "error:".
    """
    if not isinstance(expression, str) or len(expression) > 200:
        return "error: expression must be a string of at most 200 characters"
    try:
        with warnings.catch_warnings():  # "3x" is an error for the model, not a SyntaxWarning on our stderr
            warnings.simplefilter("ignore", SyntaxWarning)
            tree = ast.parse(expression.strip(), mode="eval")
        return str(_eval(tree.body))
    except (SyntaxError, ValueError, RecursionError) as exc:
        return f"error: {exc}"


TOOLS = [calculator]
