from typing import Any, Dict

from .. import _C
from ._utils import device_index


def memory_stats(device=None) -> Dict[str, Any]:
    """Allocator statistics of a brick device, with ``torch.cuda.memory_stats`` key names.

    ``adopted_bytes.all.current`` counts results whose memory the backing device allocated and
    brick took over without copying; they are included in ``allocated_bytes``.
    """
    return dict(_C._memory_stats(device_index(device, where="torch.brick.memory_stats()")))


def memory_allocated(device=None) -> int:
    """Bytes currently held by tensors on a brick device."""
    index = device_index(device, where="torch.brick.memory_allocated()")
    return _C._memory_stats(index)["allocated_bytes.all.current"]


def max_memory_allocated(device=None) -> int:
    """Peak of :func:`memory_allocated` since start or the last :func:`reset_peak_memory_stats`."""
    index = device_index(device, where="torch.brick.max_memory_allocated()")
    return _C._memory_stats(index)["allocated_bytes.all.peak"]


def reset_peak_memory_stats(device=None) -> None:
    """Resets the peak figures of a brick device to its current usage."""
    _C._reset_peak_memory_stats(device_index(device, where="torch.brick.reset_peak_memory_stats()"))
