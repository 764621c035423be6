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
In event mode, ``profile(device_timing="traced")`` reads the device's own record of its work
instead of events (CUPTI on a GPU): each brick is the sum of the work queued inside it.

``torch.profiler.profile(activities=[ProfilerActivity.CPU, ProfilerActivity.PrivateUse1])`` also
sees brick (PyTorch 2.12+): every kernel and copy brick launches is a device activity on the
brick device's stream track, linked to its CPU op (see :func:`kineto_available`); every
collective of brick's c10d backend is one on the device's ``collectives`` track, and
:func:`trace_analysis` runs HolisticTraceAnalysis over the ranks' traces.
"""

from torch_brickdev._lazy import lazy_exports

# Where each name of the API lives; a submodule loads when one of its names is first used (PEP
# 562). Reading a report (report, diff, merge) then needs neither torch nor the native module: the
# command line's JSON commands start at once. ``import torch_brickdev`` loads torch and brick first.
_EXPORTS = {
    "BrickStats": "_stats", "SyncMode": "_stats",
    **dict.fromkeys(("all_brick_stats", "clear_timeline", "disable", "enable", "health",
                     "is_enabled", "device_timing", "mark", "range_pop", "range_push", "reset",
                     "set_device_timing", "set_sync_mode", "stats", "sync_mode", "work_tracer"),
                    "_registry"),
    "kineto_available": "_kineto", "kineto_stats": "_kineto",
    "Report": "report", "ReportError": "report", "WrittenFigures": "report",
    "load_report": "report",
    "compare_with_key_averages": "report_key_averages", "folded_by_pytorch": "report_key_averages",
    "ShapeStats": "shapes",
    "profile": "session",
    "export_chrome_trace": "trace",
    "MergedReport": "merge", "merge_reports": "merge",
    "BrickChange": "diff", "ReportDiff": "diff", "diff_reports": "diff",
    "late_collective_stragglers": "trace_analysis", "trace_analysis": "trace_analysis",
}

__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, globals())
