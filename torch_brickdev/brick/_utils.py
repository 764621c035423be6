import torch

from .. import _C

_DeviceLike = "torch.device | str | int | None"


def device_index(device, *, optional: bool = True, arg: str = "device") -> int:
    """Index of a brick device given as ``None``, an int, ``"brick[:N]"`` or a ``torch.device``.

    ``None`` (when ``optional``) and ``"brick"`` without an index mean the current device.
    """
    if device is None:
        if not optional:
            raise TypeError(f"torch.brick: {arg} must be given, got None")
        return _C._current_device()
    if isinstance(device, bool):
        raise TypeError(f"torch.brick: {arg} must be a device, a str or an int, got bool")
    if isinstance(device, int):
        index = device
    else:
        if isinstance(device, str):
            try:
                device = torch.device(device)
            except RuntimeError as error:
                raise ValueError(f"torch.brick: {arg}={device!r} is not a device: {error}") from None
        if not isinstance(device, torch.device):
            raise TypeError(
                f"torch.brick: {arg} must be a torch.device, a str or an int, "
                f"got {type(device).__name__}"
            )
        if device.type != "brick":
            raise ValueError(f"torch.brick: expected a brick device for {arg}, got {device}")
        if device.index is None:
            return _C._current_device()
        index = device.index
    count = _C._device_count()
    if not 0 <= index < count:
        raise RuntimeError(
            f"torch.brick: device index {index} is out of range: there are {count} brick "
            f"device(s), valid indices are 0..{count - 1} (BRICK_HOST_DEVICES sets the count "
            f"for the host runtime)"
        )
    return index
