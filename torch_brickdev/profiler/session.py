"""The profiling session: ``torch_brickdev.profiler.profile``, which times a region with the
registry and keeps its :class:`~torch_brickdev.profiler.report.Report`. Above both the registry's
surface (_registry.py) and the report (report.py)."""

from __future__ import annotations

import json
import time
from typing import NamedTuple, Optional, Tuple, Union

from ..argcheck import check_bool, describe, describe_value
from ._registry import _native, disable, is_enabled, set_sync_mode, sync_mode, work_tracer
from ._stats import DEVICE_TIMINGS, OP_TIMINGS, SyncMode, shapes_refused
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

    ``device_timing`` says what gives Event mode its device times (None: :func:`device_timing`,
    ``"events"`` unless :func:`set_device_timing` says otherwise): ``"events"`` a pair of device
    events around each brick's work on its stream, the interval between them;
    ``"traced"`` the device's own record of every kernel, copy and memset (CUPTI on a GPU; on the
    host, brick's launches), each brick the sum of the durations of the work queued inside it,
    its nested bricks' included: no gaps between launches, no event per op.
    :func:`work_tracer` says whether there is a tracer and why not; without one, entering the
    profile raises, saying why. The report's ``metadata["device_timing"]`` names the tracer.
    """

    def __init__(self, sync_mode: Optional[Union[SyncMode, str]] = None, *, reset: bool = True,
                 metadata: Optional[dict] = None, modules: bool = False,
                 live: Optional[bool] = None, record_shapes: bool = False,
                 roofline: bool = False, ops: str = "dispatcher",
                 device_timing: Optional[str] = None):
        where = "brick profiler: profile()"
        self._mode = None if sync_mode is None else SyncMode.parse(sync_mode, arg="sync_mode",
                                                                     where=where)
        # Checked inline: right after a garbage collection each check_bool call costs ~9 us.
        for arg, value in (("reset", reset), ("modules", modules), ("roofline", roofline),
                           ("record_shapes", record_shapes)):
            if value.__class__ is not bool:
                check_bool(value, arg, where)  # raises, naming the argument
        if live is not None and live.__class__ is not bool:
            check_bool(live, "live", where)
        self._reset = reset
        self._metadata = _check_metadata(metadata, where) if metadata is not None else {}
        self._modules = ModuleBricks() if modules else None
        self._roofline = roofline
        self._record_shapes = record_shapes or roofline
        if ops not in OP_TIMINGS:
            check_ops(ops, where)  # raises
        option = shapes_refused(ops, record_shapes, roofline)
        if option is not None:
            raise ValueError(f"{where}: ops='kernels' records no input shapes (they are the "
                             f"dispatcher's): drop {option}=True, or time ops at the "
                             f"dispatcher (ops='dispatcher')")
        self._ops = ops
        if device_timing is None:
            device_timing = _native.default_device_timing()
        if device_timing not in DEVICE_TIMINGS:
            raise ValueError(f"{where}: device_timing must be 'events' or 'traced', got "
                             f"{describe_value(device_timing)}")
        if device_timing == "traced" and self._mode is not None and self._mode != SyncMode.EVENT:
            raise ValueError(f"{where}: device_timing='traced' gives Event mode's device times, "
                             f"but sync_mode is {self._mode.value!r}: use sync_mode='event'")
        self._device_timing = device_timing
        # live=None: as BRICK_LIVE says (1: every profile of the process is watchable)
        self._live = _native.env_flag("BRICK_LIVE") if live is None else live
        self._publisher = None
        self._previous_mode: Optional[SyncMode] = None
        self._report: Optional[Report] = None
        self._captured: Optional[_Captured] = None
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
        distributed = _distributed()
        distributed.wait_for_collectives()  # earlier collectives end first: the counts are the region's
        self._collectives_before = distributed.collective_counters()
        if self._modules is not None:
            self._modules.__enter__()
        try:
            self._kernel_threads = machine.kernel_thread_ids()
            # resets, waits for the devices, samples the machine, enables (nothing left if it fails)
            sample, self._start, self._registry_start = _native.begin_region(
                self._reset, self._record_shapes, self._ops, self._device_timing)
        except BaseException:
            if self._modules is not None:
                self._modules.__exit__(None, None, None)
            set_sync_mode(self._previous_mode)
            raise
        self._machine_before = tuple.__new__(machine.Sample, sample)
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
        if self._publisher is not None:
            self._publisher.stop()  # its file goes: top says the profile ended
        distributed = _distributed()
        try:
            distributed.wait_for_collectives()  # collectives are device work: their ranges end inside
            # waits for the devices, samples the machine, disables, takes the registry's rows
            self.wall_ns, machine_after, rows, span = _native.end_region(
                self._start, self._registry_start, machine.TICKED_WALL_NS)
        finally:
            if is_enabled():  # waiting for the collectives failed
                disable()
                self._restore_settings()
            if self._modules is not None:
                self._modules.__exit__(*exc)
            mode = _native.sync_mode()
            if self._previous_mode is not None and self._previous_mode.value != mode:
                set_sync_mode(self._previous_mode)
        # What the report is made of, taken now; made into the report when first read.
        info = distributed.group_info()
        self._captured = _Captured(
            wall_ns=self.wall_ns, bricks_span_ns=span, sync_mode=mode, rows=rows,
            # the counters since the figures' reset: a report holds its own losses only
            health=dict(_native.health(since_reset=True)),
            machine=(self._machine_before, tuple.__new__(machine.Sample, machine_after)),
            kernel_threads=self._kernel_threads,
            group_info=info,
            collectives=(self._collectives_before,
                         distributed.collective_counters() if info is not None else {}),
            shapes=shapes.capture() if self._record_shapes else None,
            modules=None if self._modules is None else list(self._modules.names),
            published=None if self._publisher is None else {
                "snapshots": self._publisher.snapshots, "cost_ns": self._publisher.cost_ns},
            created_ns=time.time_ns())
        self._report = None
        if self._roofline:
            self.report  # noqa: B018  (the peaks are measured now, on a machine as the region had it)
        return False

    @property
    def report(self) -> Optional[Report]:
        """The profiled region's :class:`Report` (None before the region ended). Its figures are
        those of the region's end; the Python objects are made when first read, so that they are
        not the profiled program's time (~0.3 ms right after a garbage collection)."""
        captured = self._captured  # once: another thread may read the report meanwhile
        if self._report is None and captured is not None:
            self._report = self._make_report(captured)
            self._captured = None
        return self._report

    @report.setter
    def report(self, value: Optional[Report]) -> None:
        self._report, self._captured = value, None

    def _make_report(self, captured: "_Captured") -> Report:
        # The caller's own entries win over the ones filled in here.
        metadata = {**_distributed_metadata(captured.group_info, *captured.collectives),
                    **(self._metadata or {})}
        if captured.published is not None:
            # what publishing cost the process: the time its thread spent taking and writing
            # snapshots (it holds the GIL for part of it), against the region's wall time
            metadata.setdefault("live", {**captured.published, "share":
                                         captured.published["cost_ns"] / max(captured.wall_ns, 1)})
        if captured.modules is not None:
            # which range bricks are modules: Report.table(by="module") builds its tree from them
            metadata.setdefault("modules", captured.modules)
        if captured.shapes is not None:
            metadata.setdefault("shapes", captured.shapes)
        if self._ops == "kernels":
            metadata.setdefault("ops", "kernels")
        if self._device_timing == "traced":
            metadata.setdefault("device_timing", {"timing": "traced",
                                                  "tracer": work_tracer()[0]})
        report = Report.capture(wall_ns=captured.wall_ns, sync_mode=captured.sync_mode,
                                metadata=metadata or None,
                                machine=machine.machine_figures(
                                    *captured.machine, kernel_threads=captured.kernel_threads),
                                rows=captured.rows, health=captured.health,
                                created_ns=captured.created_ns,
                                bricks_span_ns=captured.bricks_span_ns)
        if self._roofline and "roofline" not in report.metadata:
            # after the region: the work estimates and a first measurement of the peaks are not
            # the region's time
            # (host rows ran on the CPU: no device roofline)
            report = report.with_metadata(roofline=roofline.compute(
                [p for p in report.paths if p.kind != "host"], report.shape_stats(by="path")))
        return report

    @staticmethod
    def _restore_settings() -> None:
        """The per-profile settings back to their defaults, for the next enable()."""
        _native.restore_settings()


def _distributed_metadata(info: Optional[dict], before: dict, after: dict) -> dict:
    """Where a profiled process is one rank of a group (``info``: distributed.group_info()):
    ``distributed`` (rank, world size, backend) and ``collectives`` (per collective brick's c10d
    backend ran in the region, from its counters ``before`` and ``after``: calls, input bytes of
    this rank, group size, and the time in the collective, enqueue to completion, summed over
    ``timed_calls``). The engine's own bricks (``gloo:all_reduce`` …) hold the time its worker
    spent. Empty for a process that is no rank."""
    if info is None:
        return {}
    collectives = {}
    for name, now in after.items():
        earlier = before.get(name, dict.fromkeys(now, 0))
        delta = {key: now[key] - earlier[key] for key in ("calls", "bytes", "time_ns", "timed_calls")}
        if delta["calls"]:
            collectives[name] = {**delta, "group_size": now["group_size"]}
    return {"distributed": info, "collectives": collectives}


class _Captured(NamedTuple):
    """What a profile's exit took for its report: the registry's rows (kept in C++), the two
    machine samples, the health counters, the distributed state, the shapes, the module bricks,
    what live publishing cost."""

    wall_ns: int
    bricks_span_ns: Optional[int]  # from the first top-level brick's start to the last one's end
    sync_mode: str
    rows: object  # _C._profiler.CapturedRows
    health: dict
    machine: Tuple[machine.Sample, machine.Sample]
    kernel_threads: Tuple[int, ...]  # the intra-op pool's thread ids (machine.kernel_thread_ids)
    group_info: Optional[dict]
    collectives: Tuple[dict, dict]  # counters before and after the region
    shapes: Optional[list]
    modules: Optional[list]  # the module bricks' names
    published: Optional[dict]
    created_ns: int


_DISTRIBUTED = None


def _distributed():
    """torch_brickdev.distributed, imported when first profiled (it imports torch.distributed),
    then kept: an import statement costs a profile ~18 us right after a garbage collection."""
    global _DISTRIBUTED
    if _DISTRIBUTED is None:
        from .. import distributed

        _DISTRIBUTED = distributed
    return _DISTRIBUTED
