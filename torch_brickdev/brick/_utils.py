"""Argument checks shared by ``torch.brick``, the profiler and the demo.

Every check raises with one message shape, naming the function, the argument, what it expects
and what it got: ``torch.brick.set_device(): device must be an int, a str or a torch.device,
got float``. Checking up front keeps bad input from reaching the native module, where it would
surface as a pybind11 "incompatible function arguments" error, or be silently coerced.
"""

import operator
import os

import torch

from .. import _C

_DeviceLike = "torch.device | str | int | None"


def describe(value) -> str:
    """How an error message shows a received value's type: ``None`` for None, else its type."""
    return "None" if value is None else type(value).__name__


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


def device_index(device, *, optional: bool = True, arg: str = "device",
                 where: str = "torch.brick") -> int:
    """Index of a brick device given as ``None``, an int, ``"brick[:N]"`` or a ``torch.device``.

    ``None`` (when ``optional``) and ``"brick"`` without an index mean the current device.
    ``where`` names the calling function in error messages, e.g. ``"torch.brick.synchronize()"``.
    """
    expected = "an int, a str or a torch.device" + (" (or None)" if optional else "")
    if device is None:
        if not optional:
            raise TypeError(f"{where}: {arg} must be {expected}, got None")
        return _C._current_device()
    if isinstance(device, bool):
        # bool is an int subclass: without this, True would silently mean brick:1.
        raise TypeError(f"{where}: {arg} must be {expected}, got bool ({device!r})")
    # The value as the caller wrote it, for the out-of-range message: 9, 'brick:9'.
    given = repr(str(device) if isinstance(device, torch.device) else device)
    if isinstance(device, int):
        index = device
    else:
        if isinstance(device, str):
            try:
                device = torch.device(device)
            except RuntimeError as error:
                raise ValueError(
                    f"{where}: {arg}={device!r} is not a device; expected 'brick' or 'brick:N' "
                    f"({error})"
                ) from None
        if not isinstance(device, torch.device):
            raise TypeError(f"{where}: {arg} must be {expected}, got {describe(device)}")
        if device.type != "brick":
            raise ValueError(f"{where}: expected a brick device for {arg}, got {device}")
        if device.index is None:
            return _C._current_device()
        index = device.index
    count = _C._device_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"{where}: {arg}={given} is out of range: there are {count} brick device(s), "
            f"valid device indices are 0..{count - 1} (BRICK_HOST_DEVICES sets the count for "
            f"the host runtime)"
        )
    return index
