"""The native registry's Python surface: control, sync modes, stats and the context manager."""

from __future__ import annotations

import enum
import json
import time
from dataclasses import dataclass
from typing import List, Optional, Union

import torch

from .. import _C
from ..argcheck import check_bool, describe

_native = _C._profiler


class SyncMode(str, enum.Enum):
    """What a brick's duration measures (see the module documentation)."""

    IMMEDIATE = "immediate"
    DEFERRED = "deferred"
    EVENT = "event"

    @classmethod
    def parse(cls, mode: Union["SyncMode", str], *, arg: str = "mode",
              where: str = "brick profiler: SyncMode.parse()") -> "SyncMode":
        """The member named ``mode`` (case-insensitive). ``arg`` and ``where`` name the caller's
        argument and function in error messages."""
        if isinstance(mode, SyncMode):
            return mode
        valid = ", ".join(repr(m.value) for m in cls)
        if not isinstance(mode, str):
            raise TypeError(
                f"{where}: {arg} must be a SyncMode or a str ({valid}), "
                f"got {describe(mode)}"
            )
        try:
            return cls(mode.lower())
        except ValueError:
            raise ValueError(
                f"{where}: {arg}={mode!r} is not a sync mode; expected one of {valid}"
            ) from None


@dataclass(frozen=True)
class BrickStats:
    """Figures of one brick: an op (``aten::mm``) or a range (``record_function("MLP")``).

    Aggregated by name, ``path`` is the name itself; aggregated by call path (``by="path"``),
    it holds the ancestors too (``"Layer0/MLP/aten::mm"``) and ``depth`` their number.
    """

    name: str
    path: str
    kind: str  # "op" or "range"
    device: int  # brick device index; -1 when recorded on several devices
    depth: int
    count: int
    total_ns: int
    min_ns: int
    max_ns: int
    last_ns: int
    p50_ns: float
    p90_ns: float
    p99_ns: float

    def avg_us(self) -> float:
        """The canonical per-call figure: ``total_ns / count / 1000``."""
        return self.total_ns / self.count / 1000.0 if self.count else 0.0

    def to_dict(self) -> dict:
        d = {k: getattr(self, k) for k in self.__dataclass_fields__}
        d["avg_us"] = self.avg_us()
        return d


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


def sync_mode() -> SyncMode:
    return SyncMode(_native.sync_mode())


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


def _check_metadata(metadata, where: str) -> dict:
    """A copy of ``metadata``, checked now rather than when the report is written at the end of
    the run: it must be a dict that ``json.dumps`` accepts (the report is JSON, without NaN)."""
    if metadata is None:
        return {}
    if not isinstance(metadata, dict):
        raise TypeError(
            f"{where}: metadata must be a dict or None, got {describe(metadata)}"
        )
    try:
        json.dumps(metadata, allow_nan=False)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"{where}: metadata must be JSON-serializable (it is written to the "
            f"report), got {error}"
        ) from None
    return dict(metadata)


class profile:
    """Profiles a region with the brick registry and keeps its :class:`Report`.

    >>> with torch_brickdev.profiler.profile(sync_mode="event") as p:
    ...     model(x)
    >>> print(p.report.table())

    The registry is reset on entry (``reset=False`` accumulates instead), every brick device is
    synchronized and every collective of brick's process groups waited for before the wall
    clock stops, and the previous sync mode is restored on exit.
    """

    def __init__(self, sync_mode: Optional[Union[SyncMode, str]] = None, *, reset: bool = True,
                 metadata: Optional[dict] = None):
        where = "brick profiler: profile()"
        self._mode = None if sync_mode is None else SyncMode.parse(sync_mode, arg="sync_mode",
                                                                     where=where)
        self._reset = check_bool(reset, "reset", where)
        self._metadata = _check_metadata(metadata, where)
        self._previous_mode: Optional[SyncMode] = None
        self.report = None
        self.wall_ns = 0

    def __enter__(self) -> "profile":
        if is_enabled():
            raise RuntimeError("brick profiler: a profile is already running (nesting is not supported)")
        self._previous_mode = sync_mode()
        if self._mode is not None:
            set_sync_mode(self._mode)
        if self._reset:
            reset()
        from ..distributed import collective_counters, wait_for_collectives

        wait_for_collectives()  # earlier collectives end before: the region's counts are its own
        for index in _C._devices_in_use():  # no CUDA context made on an unused GPU
            torch.brick.synchronize(index)
        self._collectives_before = collective_counters()
        self._start = time.perf_counter_ns()
        enable()
        return self

    def __exit__(self, *exc) -> bool:
        from ..distributed import wait_for_collectives

        try:
            wait_for_collectives()  # collectives are device work too: their ranges end inside
            for index in _C._devices_in_use():
                torch.brick.synchronize(index)
            self.wall_ns = time.perf_counter_ns() - self._start
        finally:
            disable()
            mode = sync_mode()
            if self._previous_mode is not None and self._previous_mode != mode:
                set_sync_mode(self._previous_mode)
        from .report import Report

        # The caller's own entries win over the ones filled in here.
        metadata = {**_distributed_metadata(self._collectives_before), **(self._metadata or {})}
        self.report = Report.capture(wall_ns=self.wall_ns, sync_mode=mode, metadata=metadata or None)
        return False


def _distributed_metadata(before: dict) -> dict:
    """Where a profiled process is one rank of a group: ``distributed`` (rank, world size,
    backend) and ``collectives`` (per collective brick's c10d backend ran in the region: calls,
    input bytes of this rank, group size, and the time in the collective, enqueue to completion,
    summed over ``timed_calls``). The engine's own bricks (``gloo:all_reduce`` …) hold the time
    its worker spent. Empty for a process that is no rank."""
    from .. import distributed

    info = distributed.group_info()
    if info is None:
        return {}
    collectives = {}
    for name, now in distributed.collective_counters().items():
        earlier = before.get(name, dict.fromkeys(now, 0))
        delta = {key: now[key] - earlier[key] for key in ("calls", "bytes", "time_ns", "timed_calls")}
        if delta["calls"]:
            collectives[name] = {**delta, "group_size": now["group_size"]}
    return {"distributed": info, "collectives": collectives}
