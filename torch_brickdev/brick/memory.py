from typing import Any, Dict, Tuple

import torch

from .. import _C
from ._utils import check_bool, device_index


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


def reset_accumulated_memory_stats(device=None) -> None:
    """Zeroes the accumulated figures (``*.allocated`` and ``*.freed``) of a brick device."""
    _C._reset_accumulated_memory_stats(
        device_index(device, where="torch.brick.reset_accumulated_memory_stats()"))


def memory_reserved(device=None) -> int:
    """Bytes the allocator holds for a brick device. Brick caches nothing on the host runtime
    (this equals :func:`memory_allocated` there); on CUDA backing it is PyTorch's CUDA caching
    allocator's figure for the GPU, which brick and plain ``cuda`` tensors share."""
    index = device_index(device, where="torch.brick.memory_reserved()")
    return torch.accelerator.memory_stats(index)["reserved_bytes.all.current"]


def max_memory_reserved(device=None) -> int:
    """Peak of :func:`memory_reserved` since start or the last :func:`reset_peak_memory_stats`."""
    index = device_index(device, where="torch.brick.max_memory_reserved()")
    return torch.accelerator.memory_stats(index)["reserved_bytes.all.peak"]


def mem_get_info(device=None) -> Tuple[int, int]:
    """``(free, total)`` bytes of the memory behind a brick device: the GPU's on CUDA backing;
    on the host runtime the machine's (free is Linux's MemAvailable)."""
    return tuple(_C._mem_get_info(device_index(device, where="torch.brick.mem_get_info()")))


def empty_cache() -> None:
    """Releases cached, unused memory: PyTorch's CUDA caching allocator's on CUDA backing; on the
    host runtime brick caches nothing, so there is nothing to release."""
    _C._empty_cache()


def memory_summary(device=None, abbreviated: bool = False) -> str:
    """A readable table of a brick device's memory statistics (``torch.cuda.memory_summary``'s
    figures that brick keeps). ``abbreviated`` leaves out the allocation counts."""
    index = device_index(device, where="torch.brick.memory_summary()")
    check_bool(abbreviated, "abbreviated", "torch.brick.memory_summary()")
    stats = torch.accelerator.memory_stats(index)
    adopted = memory_stats(index)["adopted_bytes.all.current"]
    rows = [("Allocated memory", "allocated_bytes", True), ("Reserved memory", "reserved_bytes", True),
            ("Requested memory", "requested_bytes", True)]
    if not abbreviated:
        rows += [("Allocations", "allocation", False), ("Segments", "segment", False)]

    def shown(value: int, is_bytes: bool) -> str:
        if not is_bytes:
            return str(value)
        for unit in ("B", "KiB", "MiB", "GiB"):
            if abs(value) < 1024 or unit == "GiB":
                return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
            value /= 1024
        return str(value)

    header = f"{'':<18}{'current':>14}{'peak':>14}{'allocated':>14}{'freed':>14}"
    lines = [f"brick:{index} memory summary ({_C._backing_device_type()} backing)", header]
    for label, key, is_bytes in rows:
        figures = [stats[f"{key}.all.{kind}"] for kind in ("current", "peak", "allocated", "freed")]
        lines.append(f"{label:<18}" + "".join(f"{shown(v, is_bytes):>14}" for v in figures))
    lines.append(f"{'Adopted memory':<18}{shown(adopted, True):>14}  (backing-device results "
                 "brick took over without copying, included above)")
    return "\n".join(lines)


def memory_snapshot():
    """The allocator's segments, as ``torch.cuda.memory_snapshot()``: on CUDA backing, PyTorch's
    CUDA caching allocator's segments of the GPUs behind brick devices (shared with plain
    ``cuda`` tensors). The host runtime keeps no list of its blocks (each is its own malloc, so
    the op path takes no lock), and says so."""
    backing = [_C._backing_device_index(i) for i in range(_C._device_count())]
    if not backing or backing[0] < 0:
        raise RuntimeError(
            "torch.brick.memory_snapshot(): the host runtime keeps no list of its allocations "
            "(each tensor's memory is its own block, freed when the tensor dies, and keeping a "
            "list would put a lock on every op); use torch.brick.memory_stats() or "
            "torch.brick.memory_summary() for its figures")
    return [segment for segment in torch.cuda.memory_snapshot() if segment["device"] in backing]
