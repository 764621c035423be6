"""The brick profiler.

Two ways to read brick's timings:

* PyTorch's legacy autograd profiler: ``torch.autograd.profiler.profile(use_device="brick")``.
  Brick implements PyTorch's ProfilerStubs, so ``key_averages()`` shows ``Self BRICK``,
  ``BRICK total`` and ``BRICK time avg``; :func:`export_chrome_trace` writes a trace that also
  holds the device timeline.
* The native brick registry (this module): every op and every ``record_function`` range is a
  *brick*, aggregated per name (and per call path) with count, total/min/max/last ns, the
  canonical mean ``avg_us() = total_ns / count / 1000`` and percentiles.

Sync modes (:class:`SyncMode`) say what a brick's duration measures:

* ``event`` (default): a pooled device event is recorded on the current stream at the brick's
  start and stop and resolved later: device execution time, without synchronizing.
* ``immediate``: the device is synchronized, then the clock read, at start and stop: wall time
  including device execution; it serializes an asynchronous device.
* ``deferred``: only the CPU clock is read: the cost of launching the work. On an asynchronous
  device all bricks then look alike.

On the host runtime the device executes on the calling thread, so the three agree closely.

``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])`` also
sees brick (PyTorch 2.12+): every kernel and copy brick launches is a device activity on the
brick device's stream track, linked to its CPU op (see :func:`kineto_available`); every
collective of brick's c10d backend is one on the device's ``collectives`` track, and
:func:`trace_analysis` runs HolisticTraceAnalysis over the ranks' traces.
"""

from ._stats import BrickStats, SyncMode
from ._registry import (
    all_brick_stats,
    clear_timeline,
    disable,
    enable,
    health,
    is_enabled,
    mark,
    range_pop,
    range_push,
    reset,
    set_sync_mode,
    stats,
    sync_mode,
)
from ._kineto import kineto_available, kineto_stats
from ._kineto import warn_where_unavailable as _warn_where_unavailable
from .report import Report, ReportError, WrittenFigures, load_report
from .report_key_averages import compare_with_key_averages, folded_by_pytorch
from .shapes import ShapeStats
from .session import profile
from .trace import export_chrome_trace
from .merge import MergedReport, merge_reports
from .diff import BrickChange, ReportDiff, diff_reports
from .trace_analysis import late_collective_stragglers, trace_analysis

__all__ = [
    "BrickChange",
    "BrickStats",
    "MergedReport",
    "Report",
    "ReportDiff",
    "ReportError",
    "ShapeStats",
    "SyncMode",
    "WrittenFigures",
    "all_brick_stats",
    "clear_timeline",
    "compare_with_key_averages",
    "diff_reports",
    "folded_by_pytorch",
    "disable",
    "enable",
    "export_chrome_trace",
    "health",
    "is_enabled",
    "kineto_available",
    "kineto_stats",
    "late_collective_stragglers",
    "load_report",
    "mark",
    "merge_reports",
    "profile",
    "range_pop",
    "range_push",
    "reset",
    "set_sync_mode",
    "stats",
    "sync_mode",
    "trace_analysis",
]

# torch.profiler on a PyTorch without Kineto's PrivateUse1 registry: a warning, not silence.
_warn_where_unavailable()
