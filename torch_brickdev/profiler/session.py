"""The profiling session: ``torch_brickdev.profiler.profile``, which times a region with the
registry and keeps its :class:`~torch_brickdev.profiler.report.Report`. Above both the registry's
surface (_registry.py) and the report (report.py)."""

from __future__ import annotations

import json
import os
import time
from typing import Optional, Union

import torch

from .. import _C
from ..argcheck import check_bool, describe, describe_value
from ._registry import disable, enable, is_enabled, reset, set_sync_mode, sync_mode
from ._stats import SyncMode
from . import machine
from .live import Publisher
from .modules import ModuleBricks
from . import roofline, shapes
from .report import Report


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


OP_TIMINGS = ("dispatcher", "kernels")


def check_ops(ops, where: str) -> str:
    """``ops`` of :class:`profile` (where ops are timed), checked: one of :data:`OP_TIMINGS`."""
    if ops not in OP_TIMINGS:
        raise ValueError(f"{where}: ops must be 'dispatcher' or 'kernels', got "
                         f"{describe_value(ops)}")
    return ops


class profile:
    """Profiles a region with the brick registry and keeps its :class:`Report`.

    >>> with torch_brickdev.profiler.profile(sync_mode="event") as p:
    ...     model(x)
    >>> print(p.report.table())

    The registry is reset on entry (``reset=False`` accumulates instead), every brick device is
    synchronized and every collective of brick's process groups waited for before the wall
    clock stops, and the previous sync mode is restored on exit. ``modules=True`` makes every
    ``nn.Module`` call a brick named by its qualified path (:mod:`.modules`); the report's
    ``metadata["modules"]`` lists them and ``report.table(by="module")`` shows their tree.
    ``live=True`` (or ``BRICK_LIVE=1``) publishes the registry while the region runs, for
    ``python -m torch_brickdev top`` (:mod:`.live`). ``record_shapes=True`` keeps each op call's
    input shapes and dtypes (:mod:`.shapes`): ``report.table(by="shape")``. ``roofline=True``
    (which records shapes) adds each brick's FLOPs, bytes, achieved rates and their fraction of
    the backing device's measured peaks (:mod:`.roofline`): ``report.table(roofline=True)``.

    ``ops`` says where ops are timed (ranges and autograd nodes are timed alike either way):
    ``"dispatcher"`` (the default) times every op the dispatcher runs, through PyTorch's
    RecordFunction, with the names PyTorch's profilers show: composites such as ``aten::linear``
    with the ops inside them, views, factories. ``"kernels"`` times every brick kernel and copy
    at brick's kernel entry: the ops that run device work (``aten::addmm`` for a Linear, the copy
    as ``aten::_copy_from``), no composites or views, and ops skip PyTorch's RecordFunction path,
    which is most of what profiling costs a model of many small ops. It records no input shapes
    (``record_shapes`` and ``roofline`` need the dispatcher's inputs); the report's
    ``metadata["ops"]`` says ``"kernels"``.
    """

    def __init__(self, sync_mode: Optional[Union[SyncMode, str]] = None, *, reset: bool = True,
                 metadata: Optional[dict] = None, modules: bool = False,
                 live: Optional[bool] = None, record_shapes: bool = False,
                 roofline: bool = False, ops: str = "dispatcher"):
        where = "brick profiler: profile()"
        self._mode = None if sync_mode is None else SyncMode.parse(sync_mode, arg="sync_mode",
                                                                     where=where)
        self._reset = check_bool(reset, "reset", where)
        self._metadata = _check_metadata(metadata, where)
        self._modules = ModuleBricks() if check_bool(modules, "modules", where) else None
        self._roofline = check_bool(roofline, "roofline", where)
        self._record_shapes = check_bool(record_shapes, "record_shapes", where) or self._roofline
        if check_ops(ops, where) == "kernels" and self._record_shapes:
            option = "roofline" if self._roofline else "record_shapes"
            raise ValueError(f"{where}: ops='kernels' records no input shapes (they are the "
                             f"dispatcher's): drop {option}=True, or time ops at the "
                             f"dispatcher (ops='dispatcher')")
        self._ops = ops
        # live=None: as BRICK_LIVE says (1: every profile of the process is watchable)
        self._live = (os.environ.get("BRICK_LIVE", "0") not in ("", "0")) if live is None \
            else check_bool(live, "live", where)
        self._publisher = None
        self._previous_mode: Optional[SyncMode] = None
        self.report = None
        self.wall_ns = 0

    def __enter__(self) -> "profile":
        if is_enabled():
            raise RuntimeError("brick profiler: a profile is already running (nesting is not supported)")
        # The publishing directory is checked before anything is changed (it may be refused).
        self._publisher = Publisher(modules=self._modules.names if self._modules is not None
                                    else None) if self._live else None
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
        self._machine_before = machine.sample()
        if self._modules is not None:
            self._modules.__enter__()
        self._start = time.perf_counter_ns()
        _C._profiler.set_record_shapes(self._record_shapes)  # read by enable()
        _C._profiler.set_op_timing(self._ops)
        try:
            enable()
        except BaseException:  # no profile, and no setting left behind
            self._restore_settings()
            raise
        if self._publisher is not None:
            try:
                self._publisher.start()
            except BaseException:  # e.g. a full disk: the region is not profiled at all
                disable()
                if self._modules is not None:
                    self._modules.__exit__(None, None, None)
                self._publisher.stop()
                set_sync_mode(self._previous_mode)
                self._restore_settings()
                raise
        return self

    def __exit__(self, *exc) -> bool:
        from ..distributed import wait_for_collectives

        if self._publisher is not None:
            self._publisher.stop()  # its file goes: top says the profile ended
            published = {"snapshots": self._publisher.snapshots,
                         "cost_ns": self._publisher.cost_ns}
        try:
            wait_for_collectives()  # collectives are device work too: their ranges end inside
            for index in _C._devices_in_use():
                torch.brick.synchronize(index)
            self.wall_ns = time.perf_counter_ns() - self._start
            ticks = machine.spans_enough_ticks(self.wall_ns)  # else /proc/stat's are noise
            denied = machine.machine_figures(self._machine_before, machine.sample(ticks=ticks))
        finally:
            disable()
            self._restore_settings()
            if self._modules is not None:
                self._modules.__exit__(*exc)
            mode = sync_mode()
            if self._previous_mode is not None and self._previous_mode != mode:
                set_sync_mode(self._previous_mode)

        # The caller's own entries win over the ones filled in here.
        metadata = {**_distributed_metadata(self._collectives_before), **(self._metadata or {})}
        if self._publisher is not None:
            # what publishing cost the process: the time its thread spent taking and writing
            # snapshots (it holds the GIL for part of it), against the region's wall time
            metadata.setdefault("live", {**published,
                                         "share": published["cost_ns"] / max(self.wall_ns, 1)})
        if self._modules is not None:
            # which range bricks are modules: Report.table(by="module") builds its tree from them
            metadata.setdefault("modules", list(self._modules.names))
        if self._record_shapes:
            metadata.setdefault("shapes", shapes.capture())
        if self._ops == "kernels":
            metadata.setdefault("ops", "kernels")
        self.report = Report.capture(wall_ns=self.wall_ns, sync_mode=mode, metadata=metadata or None,
                                     machine=denied)
        if self._roofline and "roofline" not in self.report.metadata:
            # after the region: the work estimates and a first measurement of the peaks are not
            # the region's time
            self.report = self.report.with_metadata(roofline=roofline.compute(
                self.report.paths, self.report.shape_stats(by="path")))
        return False

    @staticmethod
    def _restore_settings() -> None:
        """The per-profile settings back to their defaults, for the next enable()."""
        _C._profiler.set_record_shapes(False)
        _C._profiler.set_op_timing("dispatcher")


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
