"""The arithmetic and formatting the contract checks share: finite-number tests, the coefficient
of variation, nanoseconds shown as milliseconds."""

from __future__ import annotations

import math
from typing import Sequence

__all__ = ["cv"]


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
