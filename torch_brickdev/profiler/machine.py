"""What the machine denied a profiled region: the time its thread waited for a CPU while other
processes ran, so that a verdict can tell a busy machine from a slow program.

``sample()`` before and ``machine_figures(before, sample())`` after give, for the region:

* ``wall_ns``, ``thread_cpu_ns`` (the profiling thread's CPU time), ``process_cpu_ns``;
* ``runqueue_wait_ns``: the time the profiling thread was runnable but waiting for a CPU
  (Linux schedstat, ``/proc/self/task/TID/schedstat``), ``process_runqueue_wait_ns`` summed over
  the process's threads, and ``kernel_thread_runqueue_wait_ns`` the longest of one thread of the
  intra-op pool (``kernel_thread_ids()``: the threads a parallel kernel's work runs on, the
  profiling thread among them). A parallel op ends when its slowest thread does: a pool thread
  kept waiting delays it while the profiling thread, finished with its share, waits at the
  barrier without queueing for a CPU;
* ``involuntary_switches``: times the process was preempted (``getrusage``);
* ``steal_ns``: CPU time the hypervisor gave other guests, all CPUs together (``/proc/stat``),
  and ``steal_share``, that over ``wall_ns * cpus``: the share of each CPU's time stolen;
* ``others_cpu_ns``: CPU time the rest of the machine used meanwhile (every CPU's busy time in
  ``/proc/stat`` less this process's), and ``others_share``, that over ``wall_ns * cpus``: other
  processes that ran beside the region on CPUs of their own (a build on the sibling core, say)
  slow it without making it wait, through the caches, memory and a shared physical core;
  ``/proc/stat`` counts in clock ticks (10 ms): ``steal_ns`` and the ``others_*`` figures are
  given only for a region of at least 20 ticks of the machine's CPUs together (100 ms on 2
  CPUs), where a tick or two is not the whole figure;
* ``cpus`` (those the process may run on) and ``load_1m`` (the run-queue average);
* ``denied_share``: ``runqueue_wait_ns / wall_ns``, the share of the region the thread wanted a
  CPU and did not get one; ``denied_source`` says how it was measured: ``"runqueue"``, or
  ``"off-cpu"`` (``1 - thread_cpu_ns / wall_ns``) where schedstat is not available: an upper
  bound, since it also counts the thread's own waits (I/O, a device).

``denied(figures, wall_ns)`` reads them back as evidence for a verdict: the run-queue wait (the
profiling thread's, or an intra-op thread's where longer) plus the stolen share of the wall.
Only a measured wait counts: idle time, sleep, I/O and locks are the program's own, and other
processes busy on CPUs of their own did not make it wait.

Nothing here runs on the op path: two samples per profiled region.
"""

from __future__ import annotations

import math
import os
from typing import Dict, Iterable, NamedTuple, Optional, Tuple

__all__ = ["DENIED_COVER", "Denied", "Sample", "TICKED_WALL_NS", "denied", "kernel_thread_ids",
           "machine_figures", "sample", "spans_enough_ticks"]

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7
# The figures /proc/stat counts in ticks (others_*, steal_ns) need the region to span this many
# clock ticks of the machine's CPUs together: their error is then a tick or two in 20, ~10 %.
_TICKS_FOR_A_FIGURE = 20
# The machine's CPUs, read once: os.cpu_count() reads sysfs, 60 us right after a garbage
# collection (the 2-core VM), a tenth of a profile's fixed cost; CPUs are rarely hot-plugged.
_MACHINE_CPUS = os.cpu_count() or 1


class Sample(NamedTuple):
    """The counters at one instant (``sample()``), in the native sample's field order."""

    wall_ns: int
    thread_cpu_ns: int
    process_cpu_ns: int
    involuntary_switches: int
    thread_schedstat: Optional[Tuple[int, int]]  # (cpu ns, run-queue wait ns) of the thread
    thread_waits: Tuple[Tuple[int, int], ...]  # (thread id, run-queue wait ns) per thread
    steal_ns: Optional[int]
    machine_busy_ns: Optional[int] = None  # every CPU's busy time since boot

    @property
    def process_waits(self) -> Dict[int, int]:
        """Run-queue wait ns per thread id of the process."""
        return dict(self.thread_waits)


# The shortest region whose tick figures mean something (``spans_enough_ticks``).
TICKED_WALL_NS = int(math.ceil(_TICKS_FOR_A_FIGURE * _TICK_NS / _MACHINE_CPUS))


def spans_enough_ticks(wall_ns: int) -> bool:
    """Whether a region of ``wall_ns`` spans enough clock ticks of the machine's CPUs together
    for the figures /proc/stat counts in ticks (``others_*``, ``steal_ns``) to mean anything."""
    return wall_ns >= TICKED_WALL_NS


def sample(ticks: bool = True) -> Sample:
    """The counters now, for the calling thread and its process. ``ticks=False`` leaves out the
    machine's tick counts (/proc/stat, the costliest read), for the end of a region too short
    for them (``spans_enough_ticks``). One native call (profiler/machine_sample.h): the /proc
    files stay open, the threads are listed again only when they changed."""
    from .. import _C  # here: reading a report's figures needs no native module

    return tuple.__new__(Sample, _C._profiler.machine_sample(ticks))


def kernel_thread_ids() -> Tuple[int, ...]:
    """The Linux thread ids of the intra-op pool (at::parallel_for's threads, the calling one
    among them); starts the pool where it had not started."""
    from .. import _C

    return tuple(_C._profiler.intra_op_thread_ids())


def machine_figures(before: Sample, after: Sample, kernel_threads: Iterable[int] = ()) -> dict:
    """The region's figures (see the module's doc), JSON-ready. Call from the thread that took
    ``before``; ``kernel_threads``: the intra-op pool's thread ids (``kernel_thread_ids()``)."""
    wall = max(after.wall_ns - before.wall_ns, 1)
    thread_cpu = after.thread_cpu_ns - before.thread_cpu_ns
    figures = {
        "wall_ns": wall,
        "thread_cpu_ns": thread_cpu,
        "process_cpu_ns": after.process_cpu_ns - before.process_cpu_ns,
        "involuntary_switches": after.involuntary_switches - before.involuntary_switches,
    }
    # schedstat counts when the kernel keeps it: the thread's own CPU time advanced with it.
    tracked = (before.thread_schedstat is not None and after.thread_schedstat is not None
               and after.thread_schedstat[0] > before.thread_schedstat[0])
    if tracked:
        wait = after.thread_schedstat[1] - before.thread_schedstat[1]
        figures["runqueue_wait_ns"] = wait
        earlier = dict(before.thread_waits)
        figures["process_runqueue_wait_ns"] = sum(
            w - earlier.get(tid, 0) for tid, w in after.thread_waits)
        waits = {tid: w - earlier[tid] for tid, w in after.thread_waits if tid in earlier}
        pool = [waits[tid] for tid in kernel_threads if tid in waits]
        if pool:
            figures["kernel_thread_runqueue_wait_ns"] = max(pool)
        figures["denied_share"] = min(1.0, wait / wall)
        figures["denied_source"] = "runqueue"
    else:
        figures["denied_share"] = min(1.0, max(0.0, 1 - thread_cpu / wall))
        figures["denied_source"] = "off-cpu"
    try:
        figures["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        figures["cpus"] = _MACHINE_CPUS
    ticked = spans_enough_ticks(wall)
    if ticked and before.steal_ns is not None and after.steal_ns is not None:
        figures["steal_ns"] = int(after.steal_ns - before.steal_ns)
        figures["steal_share"] = min(1.0, max(0.0, figures["steal_ns"] / (wall * _MACHINE_CPUS)))
    if ticked and before.machine_busy_ns is not None and after.machine_busy_ns is not None:
        # /proc/stat covers every CPU of the machine, the affinity mask perhaps fewer
        others = max(0, int(after.machine_busy_ns - before.machine_busy_ns)
                     - figures["process_cpu_ns"])
        figures["others_cpu_ns"] = others
        figures["others_share"] = min(1.0, others / (wall * _MACHINE_CPUS))
    try:
        figures["load_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return figures


# The share of a slowdown the time the machine denied the thread must cover for a verdict to put
# the slowdown down to the machine: a thread that lost its CPU also runs slower for a while after
# (its caches refilled), so its waits need not cover all of it.
DENIED_COVER = 0.5


class Denied(NamedTuple):
    """What the machine denied a region's thread (``denied``), in ns of its wall."""

    runqueue_ns: float  # runnable, waiting for a CPU while other processes ran
    steal_ns: float  # its share of the time the hypervisor gave other guests
    kernel_thread: bool = False  # the wait is an intra-op thread's, longer than the region's own

    @property
    def ns(self) -> float:
        return self.runqueue_ns + self.steal_ns

    def text(self) -> str:
        stolen = f" + steal {self.steal_ns / 1e6:.1f} ms" if self.steal_ns else ""
        whose = " of an intra-op thread" if self.kernel_thread else ""
        return f"run-queue wait{whose} {self.runqueue_ns / 1e6:.1f} ms{stolen}"


def _fraction(value) -> Optional[float]:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and 0 <= value <= 1
    return float(value) if ok else None


def denied(figures: dict, wall_ns: float) -> Optional[Denied]:
    """The CPU time the machine denied a region's thread, from its figures (``machine_figures``,
    a report's ``machine``): the run-queue wait (``denied_share``) plus the stolen share
    (``steal_share``) of the wall they were measured over (their ``wall_ns``, else the region's
    ``wall_ns``). None where no run-queue wait was measured: ``denied_source`` "off-cpu" counts
    the thread's own sleep, I/O and locks too, so it is no evidence that the machine denied
    anything."""
    if not isinstance(figures, dict) or figures.get("denied_source") != "runqueue":
        return None
    waited = _fraction(figures.get("denied_share"))
    measured = figures.get("wall_ns")
    if isinstance(measured, int) and not isinstance(measured, bool) and measured > 0:
        wall_ns = measured
    if waited is None or not wall_ns > 0:
        return None
    stolen = _fraction(figures.get("steal_share")) or 0.0
    runqueue, kernel = waited * wall_ns, figures.get("kernel_thread_runqueue_wait_ns")
    if isinstance(kernel, int) and not isinstance(kernel, bool) and kernel > runqueue:
        return Denied(min(float(kernel), wall_ns), stolen * wall_ns, kernel_thread=True)
    return Denied(runqueue, stolen * wall_ns)
