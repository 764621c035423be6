import torch

from .. import _C
from ._utils import describe, device_index

# torch.cuda's "no device" index: what tensor.get_device() returns for a CPU tensor.
# torch.cuda.set_device and torch.cuda.device treat it as a no-op, and so does brick.
_NO_DEVICE = -1


def is_available() -> bool:
    """True when at least one brick device can be used."""
    return _C._device_count() > 0


def is_initialized() -> bool:
    """Whether brick's runtime exists: it is created on first use (a brick tensor, a device
    query), not at import, so that importing brick initializes no GPU."""
    return _C._runtime_created_in_pid() != -1


def device_count() -> int:
    """Number of brick devices."""
    return _C._device_count()


def current_device() -> int:
    """Index of the calling thread's current brick device."""
    return _C._current_device()


def set_device(device) -> None:
    """Sets the calling thread's current brick device (an int, ``"brick:N"`` or a device).

    ``-1`` is a no-op, as for ``torch.cuda.set_device``; other negative indices are errors.
    """
    if _is_no_device(device):
        return
    _C._set_device(device_index(device, optional=False, where="torch.brick.set_device()"))


def synchronize(device=None) -> None:
    """Waits for all work on all streams of a brick device (default: the current one)."""
    _C._synchronize(device_index(device, where="torch.brick.synchronize()"))


def _is_no_device(device) -> bool:
    return isinstance(device, int) and not isinstance(device, bool) and device == _NO_DEVICE


class device:
    """Context manager that makes ``device`` the current brick device, like ``torch.cuda.device``.

    ``None`` or ``-1`` leaves the current device unchanged (other negative indices are errors).
    """

    def __init__(self, device):
        if device is None or _is_no_device(device):
            self.idx = _NO_DEVICE
        else:
            self.idx = device_index(device, optional=False, where="torch.brick.device()")
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
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"torch.brick.device_of(): tensor must be a torch.Tensor, got {describe(tensor)}"
            )
        super().__init__(tensor.get_device() if tensor.device.type == "brick" else _NO_DEVICE)
