"""Chrome trace export for ``torch.autograd.profiler.profile(use_device="brick")``.

PyTorch's own export in this mode writes CPU events only. :func:`export_chrome_trace` writes
everything it writes, plus:

* the device timeline: one track per brick device stream, an ``"X"`` event per op and range
  with the device start and duration brick's events measured (``cat`` ``kernel`` for ops with
  no nested op, ``gpu_user_annotation`` for the rest, as Kineto names them);
* a flow arrow from each CPU op to its device event;
* brick's own ``mark`` / ``range_push`` / ``range_pop`` entries;
* ``distributedInfo`` with the rank.

How device events are matched to ops: PyTorch calls brick's ``ProfilerStubs.record`` once when
an op starts and once when it ends, on the op's thread, and brick logs every call in order. On
each thread, the ops' start and end boundaries sorted in time are therefore the logged calls in
order: the k-th boundary is the k-th call. A thread whose counts disagree (a record failed, an
op crossed threads) gets no device events, and the trace says so in ``brickInfo``.
"""

from __future__ import annotations

import json
import os
import tempfile
import weakref
from collections import defaultdict
from dataclasses import dataclass
from typing import Optional, Union

import torch

from .. import _C
from ..argcheck import check_int, check_path, describe, type_name
from .report import Report

_SKIPPED_EVENTS = ("[memory]", "[OutOfMemory]")
_ANNOTATION_TID_BASE = 10_000_000


@dataclass
class _ProfileState:
    """What brick keeps per legacy profile, so that repeated exports agree."""

    clock_offset_ns: Optional[int] = None  # one per profile: device events land alike each time
    base_trace: Optional[str] = None  # PyTorch's export, which it writes once per profile


# Kept beside PyTorch's profile objects (never set on them), for as long as each one lives.
_states: "weakref.WeakKeyDictionary[torch.autograd.profiler.profile, _ProfileState]" = \
    weakref.WeakKeyDictionary()


def _state(prof) -> _ProfileState:
    return _states.setdefault(prof, _ProfileState())


def _distributed_info(rank: Optional[int]) -> dict:
    from ..distributed import group_info

    info = group_info()  # the group, or torchrun's RANK/WORLD_SIZE once it is destroyed
    if info is not None:
        return {"backend": info["backend"], "rank": info["rank"] if rank is None else rank,
                "world_size": info["world_size"]}
    return {"backend": "none", "rank": 0 if rank is None else rank, "world_size": 1}


def _boundaries(events):
    """Start and end points of one thread's ops, in the order PyTorch reached them."""
    points = []
    for i, e in enumerate(events):
        points.append((e.end_ns(), 0, -e.start_ns(), i, False))  # exits first at a tie,
        points.append((e.start_ns(), 1, -e.end_ns(), i, True))   # outer enters first
    points.sort()
    return points


def _check_finished_profile(prof, where: str) -> None:
    if not isinstance(prof, torch.autograd.profiler.profile):
        raise TypeError(
            f"{where}: prof must be a torch.autograd.profiler.profile, got {describe(prof)}"
        )
    if getattr(prof, "kineto_results", None) is None:
        raise RuntimeError(f"{where}: the profiler has not finished (leave its with block first)")


def device_intervals(prof):
    """Matches each op of a legacy-profiler run to its device interval.

    Returns ``(matches, info)``: ``matches`` is a list of ``(kineto_event, device, stream,
    device_start_ns, device_end_ns)`` on the CPU time base of PyTorch's events (``c10::getTime``
    nanoseconds); ``info`` counts what matched and what could not be."""
    _check_finished_profile(prof, "brick profiler: device_intervals()")
    return _device_intervals(prof)


def _python_function_test():
    """How to tell a with_stack=True python_function event: PyTorch says so from 2.12 on
    (``_KinetoEvent.is_python_function``); before it (2.11, the GPU machines'), by the names the
    Python tracer gives them (``file.py(12): f``, ``nn.Module: Linear_0``, ``<built-in ...>``)."""
    if hasattr(torch._C._autograd._KinetoEvent, "is_python_function"):
        return lambda e: e.is_python_function()

    def named_like_python(e):
        name = e.name()
        return ".py(" in name or name.startswith(("nn.Module: ", "nn.Optimizer", "<built-in "))

    return named_like_python


def _device_intervals(prof):
    results = prof.kineto_results
    is_python_function = _python_function_test()
    trace_start = results.trace_start_ns()
    by_thread = defaultdict(list)
    for e in results.events():
        # Only op and range events call ProfilerStubs.record (python_function events of
        # with_stack=True and memory events do not).
        # (is_python_function first: PyTorch 2.13 can garble a python_function event's name.)
        if (is_python_function(e) or e.device_type() != torch.autograd.DeviceType.CPU
                or e.name() in _SKIPPED_EVENTS):
            continue
        by_thread[e.start_thread_id()].append(e)
    timeline = _C._profiler.timeline()
    state = _state(prof)
    if state.clock_offset_ns is None:
        state.clock_offset_ns = timeline["steady_to_cpu_offset_ns"]
    offset = state.clock_offset_ns
    records = defaultdict(list)
    for thread, cpu_ns, device_ns, device, stream in timeline["records"]:
        if cpu_ns >= trace_start:
            # On the CPU time base; a synchronous runtime's device reached a record when it
            # was made. -1: unknown.
            if device_ns == _C._profiler.DEVICE_AT_CPU_TIME:
                at = cpu_ns
            else:
                at = device_ns + offset if device_ns >= 0 else -1
            records[thread].append((at, device, stream))
    matches, unmatched_threads = [], []
    for thread, events in by_thread.items():
        logged = records.get(thread, [])
        crossed = any(e.start_thread_id() != e.end_thread_id() for e in events)
        if crossed or len(logged) < 2 * len(events):
            unmatched_threads.append(thread)
            continue
        start_of, end_of = {}, {}
        for k, (_, _, _, i, is_start) in enumerate(_boundaries(events)):
            (start_of if is_start else end_of)[i] = logged[k]
        for i, e in enumerate(events):
            (d0, device, stream), (d1, _, _) = start_of[i], end_of[i]
            if d0 >= 0 and d1 >= 0:
                matches.append((e, device, stream, d0, d1))
    info = {
        "matched_ops": len(matches),
        "unmatched_threads": unmatched_threads,
        "dropped_records": timeline["dropped_records"],
    }
    return matches, info


def _check_output_path(path, where: str) -> str:
    """``path`` as a str, refused before any work when the file cannot be written there."""
    path = check_path(path, "path", where)
    if os.path.isdir(path):
        raise IsADirectoryError(f"{where}: path {path!r} is a directory; expected a file path")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise FileNotFoundError(f"{where}: the folder of path {path!r} does not exist ({folder})")
    return path


def _roofline_args(report, where: str) -> dict:
    """Per brick name, the roofline figures a trace event of that name carries."""
    if report is None:
        return {}
    if not isinstance(report, Report):
        raise TypeError(f"{where}: report must be a torch_brickdev Report or None, got "
                        f"{type_name(report)}")
    rows = report.roofline(by="name")
    if not rows:
        raise ValueError(f"{where}: the report has no roofline; profile with roofline=True")
    calls = {b.name: b.count for b in report.bricks if b.kind != "host"}  # the roofline's rows
    return {r.path: {"GFLOP/s": round(r.flops_per_s / 1e9, 3),
                     "GB/s": round(r.bytes_per_s / 1e9, 3),
                     "% peak FLOP/s": round(100 * r.flops_fraction, 2),
                     "% peak bytes/s": round(100 * r.bytes_fraction, 2),
                     "bound": r.bound,
                     "FLOPs per call": r.flops // max(calls.get(r.path, 1), 1),
                     "bytes per call": r.bytes // max(calls.get(r.path, 1), 1)}
            for r in rows if r.bound != "-"}


def export_chrome_trace(prof, path: Union[str, os.PathLike], *, rank: Optional[int] = None,
                        report=None) -> str:
    """Writes PyTorch's chrome trace of ``prof`` plus brick's device timeline to ``path``.

    ``prof`` is a finished ``torch.autograd.profiler.profile(use_device="brick")``. Returns the
    path. The file loads in Perfetto (ui.perfetto.dev), chrome://tracing and
    HolisticTraceAnalysis. ``report``: a brick Report of the same region made with
    ``profile(roofline=True)``; each CPU op and range named like one of its bricks then carries
    the brick's roofline in its args (``brick roofline``: GFLOP/s, GB/s, their percentage of the
    peaks, the bound, FLOPs and bytes per call, all over the brick's calls in the region)."""
    where = "brick profiler: export_chrome_trace()"
    _check_finished_profile(prof, where)
    path = _check_output_path(path, where)
    rank = check_int(rank, "rank", where, low=0, optional=True)
    roofline_args = _roofline_args(report, where)
    # PyTorch's export can be saved once per profile: keep its text for later exports.
    state = _state(prof)
    base_text = state.base_trace
    if base_text is None:
        fd, tmp = tempfile.mkstemp(suffix=".json")
        os.close(fd)
        try:
            try:
                prof.export_chrome_trace(tmp)
            except RuntimeError as error:
                if "already saved" not in str(error):
                    raise
                raise RuntimeError(
                    "export_chrome_trace: PyTorch's trace of this profile was already saved by "
                    "prof.export_chrome_trace(), and PyTorch saves a profile's trace only once; "
                    "call torch_brickdev.profiler.export_chrome_trace first (it can be called "
                    "again and again)"
                ) from None
            with open(tmp, encoding="utf-8") as f:
                base_text = f.read()
        finally:
            os.unlink(tmp)
        state.base_trace = base_text
    trace = json.loads(base_text)

    events = trace.setdefault("traceEvents", [])
    base_ns = int(trace.get("baseTimeNanoseconds", 0))

    def us(ns: int) -> float:
        return round((ns - base_ns) / 1000.0, 3)

    # Where PyTorch put each CPU op (its pid and system thread id), to anchor the flow arrows.
    cpu_slots = {}
    cpu_pid = os.getpid()
    for ev in events:
        if ev.get("ph") == "X" and ev.get("cat") in ("cpu_op", "user_annotation"):
            if ev.get("name") in roofline_args:
                ev.setdefault("args", {})["brick roofline"] = roofline_args[ev["name"]]
            external = (ev.get("args") or {}).get("External id")
            cpu_slots[(ev["name"], round(float(ev["ts"]), 3))] = (ev["pid"], ev["tid"], external)
            cpu_pid = ev["pid"]

    matches, info = _device_intervals(prof)
    # Ops with a nested op on the same thread are shown as annotations around their children.
    parents = set()
    by_thread = defaultdict(list)
    for m in matches:
        by_thread[m[0].start_thread_id()].append(m[0])
    for thread_events in by_thread.values():
        thread_events.sort(key=lambda e: (e.start_ns(), -e.end_ns()))
        stack = []
        for e in thread_events:
            while stack and stack[-1].end_ns() <= e.start_ns():
                stack.pop()
            if stack:
                parents.add(id(stack[-1]))
            stack.append(e)

    # Track ids: pid = brick device index, tid = stream id + 1 (trace tools such as HTA treat
    # thread id 0 as "not a device stream"; the real id is in args and the track name).
    tracks = set()
    for correlation, (e, device, stream, d0, d1) in enumerate(matches, start=1):
        tid = stream + 1
        tracks.add((device, stream))
        name = e.name()
        slot = cpu_slots.get((name, us(e.start_ns())))
        args = {"device": device, "stream": stream, "correlation": correlation,
                "brick device ns": d1 - d0}
        if slot is not None and slot[2] is not None:
            args["External id"] = slot[2]
        events.append({
            "ph": "X",
            "cat": "gpu_user_annotation" if id(e) in parents else "kernel",
            "name": name,
            "pid": device,
            "tid": tid,
            "ts": us(d0),
            "dur": round((d1 - d0) / 1000.0, 3),
            "args": args,
        })
        if slot is not None:
            common = {"cat": "ac2g", "name": "ac2g", "id": correlation}
            events.append({**common, "ph": "s", "pid": slot[0], "tid": slot[1], "ts": us(e.start_ns())})
            events.append({**common, "ph": "f", "bp": "e", "pid": device, "tid": tid, "ts": us(d0)})
    for device in sorted({d for d, _ in tracks}):
        events.append({"ph": "M", "name": "process_name", "pid": device, "tid": 0,
                       "args": {"name": f"brick:{device}"}})
        events.append({"ph": "M", "name": "process_labels", "pid": device, "tid": 0,
                       "args": {"labels": "brick device"}})
    for device, stream in sorted(tracks):
        events.append({"ph": "M", "name": "thread_name", "pid": device, "tid": stream + 1,
                       "args": {"name": f"stream {stream}"}})

    timeline = _C._profiler.timeline()
    # The profile's window on the annotations' clock (perf_counter_ns is the steady clock).
    offset = state.clock_offset_ns
    if getattr(prof, "profiling_end_time_ns", 0):
        window_start = prof.profiling_start_time_ns + offset
        window_end = prof.profiling_end_time_ns + offset
    else:  # older torch: the span of the profile's events
        window_start = prof.kineto_results.trace_start_ns()
        window_end = max((e.end_ns() for e in prof.kineto_results.events()), default=window_start)
    for name, thread, start, end, is_range in timeline["annotations"]:
        if start < window_start or end > window_end:
            continue
        tid = _ANNOTATION_TID_BASE + thread
        entry = {"cat": "brick_annotation", "name": name, "pid": cpu_pid, "tid": tid, "ts": us(start)}
        if is_range:
            events.append({**entry, "ph": "X", "dur": round((end - start) / 1000.0, 3)})
        else:
            events.append({**entry, "ph": "i", "s": "t"})
        events.append({"ph": "M", "name": "thread_name", "pid": cpu_pid, "tid": tid,
                       "args": {"name": f"brick annotations (thread {thread})"}})

    trace["distributedInfo"] = _distributed_info(rank)
    trace["brickInfo"] = {"runtime": _C._runtime_name(), "devices": _C._device_count(), **info}
    with open(path, "w", encoding="utf-8") as f:
        json.dump(trace, f)
    return path
