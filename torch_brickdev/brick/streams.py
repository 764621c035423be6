import torch

from .. import _C
from ._utils import check_bool, check_int, describe, device_index

# A stream priority is a C int in the runtime; like torch.cuda, values beyond the device's
# range of priorities are clamped (the host runtime has one priority), not refused.
_INT32_MIN, _INT32_MAX = -2**31, 2**31 - 1


def _as_stream(stream_tuple) -> "torch.Stream":
    stream_id, index, device_type = stream_tuple
    return torch.Stream(stream_id=stream_id, device_index=index, device_type=device_type)


class _BrickKind(type):
    """Makes ``isinstance(x, torch.brick.Stream)`` true for any brick ``torch.Stream``."""

    _base: type

    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, cls._base) and obj.device.type == "brick"


class Stream(metaclass=_BrickKind):
    """A brick stream, like ``torch.cuda.Stream``: returns a ``torch.Stream`` on a brick device.

    Args:
        device: brick device of the stream (default: the current one).
        priority: 0 or negative; lower is higher priority. An int beyond the device's range is
            clamped to it, as for ``torch.cuda.Stream``.
    """

    _base = torch.Stream

    def __new__(cls, device=None, priority: int = 0) -> torch.Stream:
        where = "torch.brick.Stream()"
        priority = check_int(priority, "priority", where, low=_INT32_MIN, high=_INT32_MAX)
        index = device_index(device, where=where)
        return torch.Stream(device=torch.device("brick", index), priority=priority)


class Event(metaclass=_BrickKind):
    """A brick event, like ``torch.cuda.Event``: returns a ``torch.Event`` on the current brick
    device. (Plain ``torch.Event`` objects are returned because PyTorch's event methods accept
    no subclasses.)"""

    _base = torch.Event

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> torch.Event:
        where = "torch.brick.Event()"
        # Bools only, as torch.Event itself requires: a truthy "no" must not enable timing.
        check_bool(enable_timing, "enable_timing", where)
        check_bool(blocking, "blocking", where)
        if check_bool(interprocess, "interprocess", where):
            raise ValueError(
                f"{where}: interprocess must be False (interprocess events are not supported "
                f"by brick), got True"
            )
        return torch.Event(
            device=torch.device("brick", _C._current_device()),
            enable_timing=enable_timing,
            blocking=blocking,
        )


def current_stream(device=None) -> torch.Stream:
    """The calling thread's current stream on a brick device."""
    index = device_index(device, where="torch.brick.current_stream()")
    return _as_stream(_C._current_stream(index))


def default_stream(device=None) -> torch.Stream:
    """The default stream (id 0) of a brick device."""
    index = device_index(device, where="torch.brick.default_stream()")
    return _as_stream(_C._default_stream(index))


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` the current stream of its device for the calling thread (None: no-op)."""
    if _check_stream(stream, "torch.brick.set_stream()") is None:
        return
    _C._set_stream(stream.stream_id, stream.device_index)


def _check_stream(stream, where: str):
    """``stream`` if it is None or a brick ``torch.Stream``; raises otherwise."""
    if stream is None:
        return None
    if not isinstance(stream, torch.Stream):
        raise TypeError(f"{where}: stream must be a torch.Stream or None, got {describe(stream)}")
    if stream.device.type != "brick":
        raise ValueError(f"{where}: stream must be a brick stream, got one on {stream.device}")
    return stream


class StreamContext:
    """Makes a stream current within a ``with`` block (``None`` is a no-op), like
    ``torch.cuda.StreamContext``."""

    def __init__(self, stream):
        self.stream = _check_stream(stream, "torch.brick.stream()")
        self._previous = None

    def __enter__(self):
        if self.stream is not None:
            self._previous = current_stream(self.stream.device_index)
            set_stream(self.stream)
        return self.stream

    def __exit__(self, *exc):
        if self._previous is not None:
            set_stream(self._previous)
        return False


def stream(stream) -> StreamContext:
    """Makes ``stream`` current within a ``with`` block (``None``: no-op), like
    ``torch.cuda.stream``."""
    return StreamContext(stream)
