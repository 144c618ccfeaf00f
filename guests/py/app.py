"""A typed tool component in Python, built by tests/setup.sh with
componentize-py: the class below implements wit/tools.wit."""

import ast
import operator

import wit_world
from componentize_py_types import Err

_OPERATORS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
}


def _evaluate(node: ast.AST) -> int:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    if isinstance(node, ast.BinOp) and type(node.op) in _OPERATORS:
        return _OPERATORS[type(node.op)](_evaluate(node.left), _evaluate(node.right))
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        return -_evaluate(node.operand)
    raise ValueError(f"not an integer expression: {ast.dump(node)[:40]}")


class WitWorld(wit_world.WitWorld):
    def calculate(self, expression: str) -> int:
        try:
            value = _evaluate(ast.parse(expression, mode="eval"))
        except (SyntaxError, ValueError) as error:
            raise Err(str(error))
        if not -(2**63) <= value < 2**63:
            raise Err("the result does not fit in 64 bits")
        return value

    def join(self, words: list[str], separator: str) -> str:
        return separator.join(words)
