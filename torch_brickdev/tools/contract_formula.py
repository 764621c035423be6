"""Formulas of a contract: arithmetic over metadata figures (``"(2 * layers + 1) * tokens"``),
parsed once into a syntax tree that admits numbers, names and arithmetic only, and evaluated
without ``eval``."""

from __future__ import annotations

import ast
import operator
import re
from dataclasses import dataclass, field
from typing import Dict, List, Tuple, Union

__all__ = ["Formula"]

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
              ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}


@dataclass(frozen=True)
class Formula:
    """An arithmetic expression over metadata figures (``"(2 * layers + 1) * tokens"``): numbers,
    figure names, ``+ - * / // % **`` and parentheses; nothing else is evaluated."""

    text: str
    names: Tuple[str, ...]  # the figures it reads, in order of first appearance
    tree: ast.Expression = field(compare=False, repr=False)

    @classmethod
    def parse(cls, source: Union[str, int]) -> "Formula":
        """Raises ValueError saying what is wrong."""
        if isinstance(source, int) and not isinstance(source, bool):
            source = str(source)
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"expected a formula (a string such as \"2 * tokens\" or an "
                             f"integer), got {source!r}")
        try:
            tree = ast.parse(source.strip(), mode="eval")
        except SyntaxError as error:
            raise ValueError(f"formula {source!r} does not parse ({error.msg})") from None
        names: List[str] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                if node.id not in names:
                    names.append(node.id)
            elif isinstance(node, ast.Constant):
                if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                    raise ValueError(f"formula {source!r}: {node.value!r} is not a number")
            elif not isinstance(node, (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Load,
                                       *_OPERATORS, *_UNARY)):
                raise ValueError(f"formula {source!r}: {type(node).__name__} is not allowed "
                                 "(expected numbers, figure names, + - * / // % ** and "
                                 "parentheses)")
        # ast.walk is breadth first: order the names as they are written.
        names.sort(key=lambda n: re.search(rf"\b{re.escape(n)}\b", source).start())
        return cls(source.strip(), tuple(names), tree)

    def evaluate(self, values: Dict[str, float]) -> float:
        def value(node):
            if isinstance(node, ast.Expression):
                return value(node.body)
            if isinstance(node, ast.Constant):
                return node.value
            if isinstance(node, ast.Name):
                return values[node.id]
            if isinstance(node, ast.UnaryOp):
                return _UNARY[type(node.op)](value(node.operand))
            return _OPERATORS[type(node.op)](value(node.left), value(node.right))
        return value(self.tree)
