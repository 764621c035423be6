"""The arithmetic and formatting the contract checks share: finite-number tests, the coefficient
of variation, nanoseconds shown as milliseconds, values from a contract file shown in a message."""

from __future__ import annotations

import math
import reprlib
from typing import Sequence

from ...terminal import printable

__all__ = ["cv", "shown"]

# A value from someone else's file, as a message shows it: nested tables and lists to a few
# levels and items (a repr of a value nested a thousand deep would recurse), strings escaped.
_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother = 3, 40, 40


def shown(value, limit: int = 60) -> str:
    """``value`` (a string, a number, a TOML table or list) as a message quotes it: its repr,
    control characters escaped and cut at about ``limit`` characters with its length said; a
    huge integer by its order of magnitude."""
    if isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**30:
        return f"about 1e+{len(str(abs(value))) - 1}"
    if isinstance(value, str) and len(value) > limit:
        return f"{printable(repr(value[:limit]))}... ({len(value)} characters)"
    text = repr(value) if isinstance(value, (str, int, float)) else _REPR.repr(value)
    return printable(text, limit=limit)


def _finite(x) -> bool:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return False
    try:
        return math.isfinite(x)
    except OverflowError:  # an int beyond float range: no arithmetic on it is meaningful
        return False


def _positive(x) -> bool:
    return _finite(x) and x > 0


def cv(values: Sequence[float]) -> float:
    """Sample standard deviation / mean; NaN when a value is not finite, Infinity when the mean
    is not > 0. Scaled by the largest value first, so that no sum can overflow."""
    if not all(_finite(v) for v in values):
        return math.nan
    xs = [float(v) for v in values]
    scale = max(abs(x) for x in xs)
    if scale == 0:
        return math.inf
    xs = [x / scale for x in xs]
    mean = math.fsum(xs) / len(xs)
    if mean <= 0:
        return math.inf
    variance = math.fsum((x - mean) ** 2 for x in xs) / (len(xs) - 1)
    return math.sqrt(variance) / mean


def _fmt_ms(ns: float) -> str:
    return f"{ns / 1e6:.3f} ms"
