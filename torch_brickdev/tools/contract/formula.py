"""Formulas of a contract: arithmetic over metadata figures (``"(2 * layers + 1) * tokens"``),
parsed once into a syntax tree that admits numbers, names and arithmetic only, and evaluated
without ``eval``.

A formula comes from someone else's file, so what it may compute is bounded: its text, the depth
of its syntax tree, every exponent and every value (literal, figure or intermediate result). The
parts without figures are computed when the contract is read, so that ``9**9**9 * steps`` or
``steps / 0`` is refused before any report; the rest is checked as it is computed."""

from __future__ import annotations

import ast
import math
import operator
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

from ...terminal import printable

from .numbers import shown

__all__ = ["Formula", "MAX_DEPTH", "MAX_EXPONENT", "MAX_MAGNITUDE", "MAX_TEXT"]

#: Characters of a formula's text.
MAX_TEXT = 500
#: Levels of its syntax tree (each operator of a chain ``a + b + c`` is one level).
MAX_DEPTH = 50
#: The magnitude of an exponent of ``**``.
MAX_EXPONENT = 64
#: The magnitude of every value a formula reads or computes (a count of calls is far below it).
MAX_MAGNITUDE = 10**18

_OPERATORS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul,
              ast.Div: operator.truediv, ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod,
              ast.Pow: operator.pow}
_UNARY = {ast.USub: operator.neg, ast.UAdd: operator.pos}
_ALLOWED = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Name, ast.Constant, ast.Load,
            *_OPERATORS, *_UNARY)


class _Unbounded(ValueError):
    """A step of a formula that leaves the bounds (the message says which)."""


def _bounded(value):
    if isinstance(value, float) and math.isnan(value):
        raise _Unbounded("a result is not a number (NaN)")
    if not abs(value) <= MAX_MAGNITUDE:
        raise _Unbounded(f"{shown(value)} is beyond {float(MAX_MAGNITUDE):g}")
    return value


def _depth(tree: ast.AST) -> int:
    """How many operators deep a syntax tree nests, measured without recursion (the tree may
    be deep)."""
    deepest, stack = 0, [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        depth += isinstance(node, (ast.BinOp, ast.UnaryOp))
        deepest = max(deepest, depth)
        stack.extend((child, depth) for child in ast.iter_child_nodes(node))
    return deepest


@dataclass(frozen=True)
class Formula:
    """An arithmetic expression over metadata figures (``"(2 * layers + 1) * tokens"``): numbers,
    figure names, ``+ - * / // % **`` and parentheses; nothing else is evaluated. Its value and
    every step of it stay within the bounds above."""

    text: str
    names: Tuple[str, ...]  # the figures it reads, as written, in order of first appearance
    tree: ast.Expression = field(compare=False, repr=False)

    @classmethod
    def parse(cls, source: Union[str, int]) -> "Formula":
        """Raises ValueError saying what is wrong."""
        if isinstance(source, int) and not isinstance(source, bool):
            source = str(source)
        if not isinstance(source, str) or not source.strip():
            raise ValueError(f"expected a formula (a string such as \"2 * tokens\" or an "
                             f"integer), got {shown(source)}")
        text = source.strip()
        if len(text) > MAX_TEXT:
            raise ValueError(f"formula {shown(text)} is longer than {MAX_TEXT} characters")
        if not text.isprintable():  # a line break, a NUL or a bidi control: not arithmetic
            raise ValueError(f"formula {shown(text)} holds control characters")
        try:
            tree = ast.parse(text, mode="eval")
        except (SyntaxError, ValueError, MemoryError, RecursionError) as error:
            reason = getattr(error, "msg", None) or type(error).__name__
            raise ValueError(f"formula {shown(text)} does not parse ({reason})") \
                from None
        depth = _depth(tree)
        if depth > MAX_DEPTH:
            raise ValueError(f"formula {shown(text)} is nested {depth} deep; at most "
                             f"{MAX_DEPTH}")
        named: List[ast.Name] = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Name):
                # The parser reads identifiers in NFKC form ("ｓteps" as "steps"): the figure
                # read is the one the text names.
                node.id = ast.get_source_segment(text, node)
                named.append(node)
            elif isinstance(node, ast.Constant):
                if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                    raise ValueError(f"formula {shown(text)}: "
                                     f"{shown(node.value)} is not a number")
            elif not isinstance(node, _ALLOWED):
                raise ValueError(f"formula {shown(text)}: {type(node).__name__} is not "
                                 "allowed (expected numbers, figure names, + - * / // % ** and "
                                 "parentheses)")
        named.sort(key=lambda n: (n.lineno, n.col_offset))
        formula = cls(text, tuple(dict.fromkeys(n.id for n in named)), tree)
        try:
            formula._value(None)  # the parts without figures, computed now
        except _Unbounded as error:
            raise ValueError(f"formula {shown(text)}: {error}") from None
        return formula

    @property
    def constant(self) -> Optional[Union[int, float]]:
        """Its value when it reads no figure, else None."""
        return None if self.names else self._value(None)

    def evaluate(self, values: Dict[str, Union[int, float]]) -> Union[int, float]:
        """Its value with the figures ``values``; raises ValueError naming the formula and the
        figures when a step divides by zero or leaves the bounds."""
        try:
            return self._value(values)
        except _Unbounded as error:
            given = ", ".join(f"{printable(n, limit=40)}={shown(values[n])}"
                              for n in self.names)
            raise ValueError(f"formula {shown(self.text)}"
                             + (f" with {given}" if given else "") + f": {error}") from None

    def _value(self, values: Optional[Dict[str, Union[int, float]]]):
        """The value of the tree; with ``values`` None, of its parts without figures (None for
        a part that reads one). The depth is bounded, so the recursion is."""
        def value(node):
            if isinstance(node, ast.Expression):
                return value(node.body)
            if isinstance(node, ast.Constant):
                return _bounded(node.value)
            if isinstance(node, ast.Name):
                return None if values is None else _bounded(values[node.id])
            if isinstance(node, ast.UnaryOp):
                operand = value(node.operand)
                return None if operand is None else _UNARY[type(node.op)](operand)
            left, right = value(node.left), value(node.right)
            op = type(node.op)
            if right is not None:
                if op in (ast.Div, ast.FloorDiv, ast.Mod) and right == 0:
                    raise _Unbounded("division by zero")
                if op is ast.Pow and not abs(right) <= MAX_EXPONENT:
                    raise _Unbounded(f"exponent {shown(right)} is beyond {MAX_EXPONENT}")
            if left is None or right is None:
                return None
            if op is ast.Pow and left == 0 and right < 0:
                raise _Unbounded("division by zero (0 to a negative power)")
            if op is ast.Pow and left < 0 and right != int(right):
                raise _Unbounded(f"{shown(left)} to the power {shown(right)} is not a real "
                                 "number")
            try:
                return _bounded(_OPERATORS[op](left, right))
            except OverflowError:  # a float power beyond float range
                raise _Unbounded(f"{shown(left)} ** {shown(right)} is beyond "
                                 f"{float(MAX_MAGNITUDE):g}") from None
        return value(self.tree)
