"""The native registry's Python surface: control, sync modes, stats, health and the timeline's
marks and ranges. The session that profiles a region and builds its report is session.py."""

from __future__ import annotations

from typing import List, Optional, Tuple, Union

from .. import _C
from ..argcheck import describe
from ._stats import BrickStats, SyncMode, check_brick_fields

_native = _C._profiler
check_brick_fields(_native.REPORT_FIELDS, "the native registry's report fields "
                   "(torch_brickdev._C._profiler.REPORT_FIELDS)",
                   "torch_brickdev._C is out of date: rebuild it")


def enable(sync_mode: Optional[Union[SyncMode, str]] = None) -> None:
    """Starts recording every op and range into the registry (optionally setting the mode)."""
    if sync_mode is not None:
        sync_mode = SyncMode.parse(sync_mode, arg="sync_mode", where="brick profiler: enable()")
    if is_enabled():
        raise RuntimeError("brick profiler: enable() called while already enabled")
    if sync_mode is not None:
        set_sync_mode(sync_mode)
    _native.enable()


def disable() -> None:
    """Stops recording. The figures stay until :func:`reset`."""
    _native.disable()


def is_enabled() -> bool:
    return _native.is_enabled()


def reset() -> None:
    """Zeroes every brick's figures."""
    _native.reset()


def set_sync_mode(mode: Union[SyncMode, str]) -> None:
    """Sets the sync mode; not allowed while profiling (a region is timed in one mode)."""
    _native.set_sync_mode(SyncMode.parse(mode, where="brick profiler: set_sync_mode()").value)


# The native mode's name to its member: a dict lookup, where calling the enum costs a profile's
# entry and exit several microseconds each right after a garbage collection.
_SYNC_MODES = {mode.value: mode for mode in SyncMode}


def sync_mode() -> SyncMode:
    return _SYNC_MODES[_native.sync_mode()]


def stats(by: str = "name") -> List[BrickStats]:
    """Every brick with a count above zero, none omitted.

    ``by="name"`` merges every call path of a name into one entry; ``by="path"`` keeps one entry
    per call path (nested ranges keep their parents, for per-layer breakdowns).
    """
    if not isinstance(by, str):
        raise TypeError(
            f"brick profiler: stats(): by must be a str, 'name' or 'path', got {describe(by)}"
        )
    if by not in ("name", "path"):
        raise ValueError(f"brick profiler: stats(): by must be 'name' or 'path', got {by!r}")
    return [BrickStats(**d) for d in _native.snapshot([by])[by]]


all_brick_stats = stats


def health() -> dict:
    """What the profiler could not time: unbalanced exits, timing failures, pending events."""
    return dict(_native.health())


def work_tracer() -> Tuple[Optional[str], Optional[str]]:
    """The device's work tracer that ``profile(device_timing="traced")`` reads: ``(name,
    None)`` (``"CUPTI"`` on a GPU, ``"host"`` on the host runtime), or ``(None, why there is
    none)``. Creates the runtime."""
    name, why = _native.work_tracer()
    return name, why


def set_device_timing(timing: str) -> None:
    """What gives brick's device times from now on, in every profiler that reads them: the
    legacy profiler's ops (``torch.autograd.profiler.profile(use_device="brick")``, from its next
    record on) and :func:`profile` where its ``device_timing`` is not given. ``"events"`` (the
    default) a pair of device events around each op or brick; ``"traced"`` the device's own
    record of the work each queued (:func:`work_tracer`: CUPTI on a GPU), the sum of its
    durations. Raises where there is no work tracer, saying why."""
    where = "brick profiler: set_device_timing()"
    if not isinstance(timing, str):
        raise TypeError(f"{where}: timing must be 'events' or 'traced', got {describe(timing)}")
    if timing not in ("events", "traced"):
        raise ValueError(f"{where}: timing must be 'events' or 'traced', got {timing!r}")
    if timing == "traced":
        name, why = _native.work_tracer()
        if name is None:
            raise RuntimeError(f"{where}: 'traced' needs the device's work tracer, and there is "
                               f"none: {why}")
    _native.set_default_device_timing(timing)


def device_timing() -> str:
    """What gives brick's device times (:func:`set_device_timing`): ``"events"`` or
    ``"traced"``."""
    return _native.default_device_timing()


def mark(name: str) -> None:
    """Puts an instant marker on brick's timeline (shown in :func:`export_chrome_trace`)."""
    _check_name(name, "mark")
    _native.mark(name)


def range_push(name: str) -> None:
    """Opens a range on brick's timeline for the calling thread."""
    _check_name(name, "range_push")
    _native.range_push(name)


def range_pop() -> None:
    """Closes the calling thread's innermost range opened by :func:`range_push`."""
    _native.range_pop()


def clear_timeline() -> None:
    """Empties the log of the legacy profiler's record() calls and the marks and ranges (the
    data :func:`export_chrome_trace` reads); export the profiles you want first."""
    _native.clear_timeline()


def _check_name(name, where: str) -> None:
    if not isinstance(name, str):
        raise TypeError(f"brick profiler: {where}() needs a str name, got {describe(name)}")
    if not name:
        raise ValueError(f"brick profiler: {where}() needs a non-empty name, got ''")
