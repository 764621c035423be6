import torch

from .. import _C
from ._utils import device_index


def is_available() -> bool:
    """True when at least one brick device can be used."""
    return _C._device_count() > 0


def is_initialized() -> bool:
    """Brick initialises when ``torch_brickdev`` is imported."""
    return True


def device_count() -> int:
    """Number of brick devices."""
    return _C._device_count()


def current_device() -> int:
    """Index of the calling thread's current brick device."""
    return _C._current_device()


def set_device(device) -> None:
    """Sets the calling thread's current brick device (an int, ``"brick:N"`` or a device)."""
    _C._set_device(device_index(device, optional=False))


def synchronize(device=None) -> None:
    """Waits for all work on all streams of a brick device (default: the current one)."""
    _C._synchronize(device_index(device))


class device:
    """Context manager that makes ``device`` the current brick device, like ``torch.cuda.device``.

    ``None`` or a negative index leaves the current device unchanged.
    """

    def __init__(self, device):
        if isinstance(device, int) and not isinstance(device, bool) and device < 0:
            self.idx = -1
        else:
            self.idx = -1 if device is None else device_index(device, optional=False)
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _C._current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C._set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx != _C._current_device():
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of ``tensor`` current (no-op for non-brick tensors)."""

    def __init__(self, tensor: torch.Tensor):
        super().__init__(tensor.get_device() if tensor.device.type == "brick" else -1)
