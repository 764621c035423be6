"""Argument checks with one message shape, shared by the library and the tools built on it.

Every check names the function, the argument, what it expects and what it got:
``torch.brick.set_device(): device must be an int, a str or a torch.device, got float``.
Plain Python (no torch): validation happens at each public boundary, once.
"""

import math
import operator
import os

__all__ = ["check_bool", "check_int", "check_path", "check_str", "describe", "describe_value",
           "show_json", "type_name"]


def type_name(value) -> str:
    """A received value's type as Python names it (``NoneType`` for None): how the report's and
    the contracts' messages show it."""
    return type(value).__name__


def describe(value) -> str:
    """How an error message shows a received value's type: ``None`` for None, else its type."""
    return "None" if value is None else type_name(value)


def describe_value(value) -> str:
    """A received value's type and, when short, the value: ``int (5)``, ``str ('x')``, ``None``."""
    if value is None:
        return "None"
    text = repr(value)
    return f"{type(value).__name__} ({text})" if len(text) <= 40 else type(value).__name__


def check_bool(value, arg: str, where: str) -> bool:
    """``value`` itself if it is a bool. Anything else (1, "yes", None) raises: a truthy
    ``"no"`` silently meaning True is exactly the mistake to catch."""
    if not isinstance(value, bool):
        raise TypeError(f"{where}: {arg} must be a bool (True or False), got {describe(value)}")
    return value


def check_int(value, arg: str, where: str, *, low=None, high=None, optional: bool = False):
    """``value`` as an int: a Python int (not a bool), or anything with ``__index__`` (numpy
    integers, integer tensors of one element). Floats are refused rather than truncated.
    ``low`` / ``high`` are inclusive bounds; ``optional`` lets None through."""
    if value is None and optional:
        return None
    expected = "an int or None" if optional else "an int"
    if isinstance(value, bool):  # an int subclass, but True as a count or an index is a slip
        raise TypeError(f"{where}: {arg} must be {expected}, got bool ({value!r})")
    try:
        number = operator.index(value)
    except TypeError:
        raise TypeError(f"{where}: {arg} must be {expected}, got {describe(value)}") from None
    if (low is not None and number < low) or (high is not None and number > high):
        if high is None:
            bounds = f">= {low}"
        elif low is None:
            bounds = f"<= {high}"
        else:
            bounds = f"in {low}..{high}"
        raise ValueError(f"{where}: {arg} must be {bounds}, got {number}")
    return number


def check_str(value, arg: str, where: str, *, show=describe) -> str:
    """``value`` itself if it is a str. ``show`` names a received value's type in the message
    (:func:`describe`, or :func:`type_name` where a module's messages use it)."""
    if not isinstance(value, str):
        raise TypeError(f"{where}: {arg} must be a str, got {show(value)}")
    return value


def check_path(value, arg: str, where: str) -> str:
    """``value`` as a non-empty filesystem path (a str or an ``os.PathLike``)."""
    if isinstance(value, bytes) or not isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"{where}: {arg} must be a str or an os.PathLike path, got {describe(value)}"
        )
    path = os.fspath(value)
    if not path:
        raise ValueError(f"{where}: {arg} must be a non-empty path, got ''")
    return path


def show_json(value) -> str:
    """A JSON value (a report's field or metadata) as a message shows it: its JSON type, and the
    value when short: ``integer 5``, ``string 'x'``, ``boolean true``, ``null``, ``NaN``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return f"boolean {str(value).lower()}"
    if isinstance(value, float):
        if math.isnan(value):
            return "NaN"
        if math.isinf(value):
            return "Infinity" if value > 0 else "-Infinity"
        return f"number {value!r}"
    if isinstance(value, int):
        if abs(value) < 10**30:
            return f"integer {value}"
        # str() of a huge int is slow and limited: estimate the digits from the bits
        return f"integer of about {int(value.bit_length() * math.log10(2)) + 1} digits"
    if isinstance(value, str):
        text = repr(value)
        return f"string {text if len(text) <= 60 else text[:57] + '...'}"
    if isinstance(value, (list, tuple)):
        return f"array of {len(value)} item(s)"
    if isinstance(value, dict):
        return "object"
    return f"{type(value).__name__} (not a JSON value)"
