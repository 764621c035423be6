"""Argument checks of ``torch.brick`` and the profiler: the device checks, over the generic ones
of ``torch_brickdev.argcheck``.

Every check raises with one message shape, naming the function, the argument, what it expects
and what it got: ``torch.brick.set_device(): device must be an int, a str or a torch.device,
got float``. Checking up front keeps bad input from reaching the native module, where it would
surface as a pybind11 "incompatible function arguments" error, or be silently coerced.
"""


import torch

from .. import _C
from ..argcheck import check_bool, check_int, check_path, describe, describe_value  # noqa: F401

_DeviceLike = "torch.device | str | int | None"


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
