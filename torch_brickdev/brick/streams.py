import torch

from .. import _C
from ._utils import device_index

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
        priority: 0 or negative; lower is higher priority.
    """

    _base = torch.Stream

    def __new__(cls, device=None, priority: int = 0) -> torch.Stream:
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(
                f"torch.brick.Stream: priority must be an int, got {type(priority).__name__}"
            )
        return torch.Stream(device=torch.device("brick", device_index(device)), priority=priority)


class Event(metaclass=_BrickKind):
    """A brick event, like ``torch.cuda.Event``: returns a ``torch.Event`` on the current brick
    device. (Plain ``torch.Event`` objects are returned because PyTorch's event methods accept
    no subclasses.)"""

    _base = torch.Event

    def __new__(
        cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False
    ) -> torch.Event:
        if interprocess:
            raise ValueError("torch.brick.Event: interprocess events are not supported")
        return torch.Event(
            device=torch.device("brick", _C._current_device()),
            enable_timing=bool(enable_timing),
            blocking=bool(blocking),
        )


def current_stream(device=None) -> torch.Stream:
    """The calling thread's current stream on a brick device."""
    return _as_stream(_C._current_stream(device_index(device)))


def default_stream(device=None) -> torch.Stream:
    """The default stream (id 0) of a brick device."""
    return _as_stream(_C._default_stream(device_index(device)))


def set_stream(stream: torch.Stream) -> None:
    """Makes ``stream`` the current stream of its device for the calling thread."""
    if stream is None:
        return
    if not isinstance(stream, torch.Stream):
        raise TypeError(f"torch.brick.set_stream: expected a torch.Stream, got {type(stream).__name__}")
    if stream.device.type != "brick":
        raise ValueError(f"torch.brick.set_stream: expected a brick stream, got one on {stream.device}")
    _C._set_stream(stream.stream_id, stream.device_index)


class StreamContext:
    """Makes a stream current within a ``with`` block (``None`` is a no-op), like
    ``torch.cuda.StreamContext``."""

    def __init__(self, stream):
        self.stream = stream
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
    return StreamContext(stream)
