import torch

from .. import _C
from ._utils import device_index

_BRICK = None  # filled lazily: the brick torch.device type needs the backend renamed first


def _as_stream(stream_tuple) -> "torch.Stream":
    stream_id, index, device_type = stream_tuple
    return torch.Stream(stream_id=stream_id, device_index=index, device_type=device_type)


class Stream(torch.Stream):
    """A brick stream (``torch.Stream`` on a brick device), like ``torch.cuda.Stream``.

    Args:
        device: brick device of the stream (default: the current one).
        priority: 0 or negative; lower is higher priority.
    """

    def __new__(cls, device=None, priority: int = 0, **kwargs):
        if kwargs:  # internal construction from ids, as torch.Stream supports
            return super().__new__(cls, **kwargs)
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise TypeError(f"torch.brick.Stream: priority must be an int, got {type(priority).__name__}")
        index = device_index(device)
        return super().__new__(cls, device=torch.device("brick", index), priority=priority)


class Event(torch.Event):
    """A brick event (``torch.Event`` on a brick device), like ``torch.cuda.Event``."""

    def __new__(cls, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False):
        if interprocess:
            raise ValueError("torch.brick.Event: interprocess events are not supported")
        return super().__new__(
            cls, device=torch.device("brick", _C._current_device()), enable_timing=enable_timing,
            blocking=blocking,
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
