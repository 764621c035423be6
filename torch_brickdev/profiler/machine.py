"""What the machine denied a profiled region: the time its thread waited for a CPU while other
processes ran, so that a verdict can tell a busy machine from a slow program.

``sample()`` before and ``machine_figures(before, sample())`` after give, for the region:

* ``wall_ns``, ``thread_cpu_ns`` (the profiling thread's CPU time), ``process_cpu_ns``;
* ``runqueue_wait_ns``: the time the profiling thread was runnable but waiting for a CPU
  (Linux schedstat, ``/proc/thread-self/schedstat``), ``process_runqueue_wait_ns`` summed over
  the process's threads (the backing kernels' own threads among them);
* ``involuntary_switches``: times the process was preempted (``getrusage``);
* ``steal_ns``: CPU time the hypervisor gave other guests, all CPUs together (``/proc/stat``);
* ``others_cpu_ns``: CPU time the rest of the machine used meanwhile (every CPU's busy time in
  ``/proc/stat`` less this process's), and ``others_share``, that over ``wall_ns * cpus``: other
  processes that ran beside the region on CPUs of their own (a build on the sibling core, say)
  slow it without making it wait, through the caches, memory and a shared physical core;
  ``/proc/stat`` counts in clock ticks (10 ms): ``others_share`` is given only for a region of at
  least 20 ticks of the machine's CPUs together (100 ms on 2 CPUs);
* ``cpus`` (those the process may run on) and ``load_1m`` (the run-queue average);
* ``denied_share``: ``runqueue_wait_ns / wall_ns``, the share of the region the thread wanted a
  CPU and did not get one; ``denied_source`` says how it was measured: ``"runqueue"``, or
  ``"off-cpu"`` (``1 - thread_cpu_ns / wall_ns``) where schedstat is not available: an upper
  bound, since it also counts the thread's own waits (I/O, a device).

Nothing here runs on the op path: two samples per profiled region.
"""

from __future__ import annotations

import os
import resource
import time
from dataclasses import dataclass
from typing import Dict, Optional

__all__ = ["Sample", "machine_figures", "sample"]

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7
# others_share needs the region to span this many clock ticks of the machine's CPUs together
# (/proc/stat counts in ticks): its error is then a tick or two in 20, about 10 %.
_TICKS_FOR_A_SHARE = 20


def _read(path: str) -> Optional[str]:
    # os.open/os.read: half the cost of open() and its text wrapper, which a profile's exit
    # pays for every thread of the process. The files read are small (/proc/stat is the
    # largest: its first line, the only one read, comes first).
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return None
    try:
        return os.read(fd, 1 << 16).decode("ascii", "replace")
    except OSError:
        return None
    finally:
        os.close(fd)


def _schedstat(path: str) -> Optional[tuple]:
    """(cpu ns, run-queue wait ns) of one thread, None where the kernel does not keep them."""
    text = _read(path)
    try:
        cpu, wait = (int(x) for x in text.split()[:2])
    except (AttributeError, ValueError):
        return None
    return cpu, wait


def _process_waits() -> Dict[int, int]:
    waits = {}
    try:
        tids = os.listdir("/proc/self/task")
    except OSError:
        return waits
    for tid in tids:
        stat = _schedstat(f"/proc/self/task/{tid}/schedstat")
        if stat is not None:
            waits[int(tid)] = stat[1]
    return waits


def _cpu_times() -> tuple:
    """(busy ns, steal ns) of all CPUs together since boot, from /proc/stat's first line: busy
    is user, nice, system, irq and softirq time (guest time is inside user); None each where
    the line does not hold them."""
    text = _read("/proc/stat")
    if not text or not text.startswith("cpu "):
        return None, None
    fields = text.split("\n", 1)[0].split()
    try:
        busy = sum(int(fields[i]) for i in (1, 2, 3, 6, 7)) * _TICK_NS
    except (IndexError, ValueError):
        busy = None
    steal = int(fields[8]) * _TICK_NS if len(fields) > 8 and fields[8].isdigit() else None
    return busy, steal


@dataclass(frozen=True)
class Sample:
    wall_ns: int
    thread_cpu_ns: int
    process_cpu_ns: int
    involuntary_switches: int
    thread_schedstat: Optional[tuple]
    process_waits: Dict[int, int]
    steal_ns: Optional[float]
    machine_busy_ns: Optional[float] = None  # every CPU's busy time since boot


def sample() -> Sample:
    """The counters now, for the calling thread and its process."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    busy, steal = _cpu_times()
    return Sample(time.perf_counter_ns(), time.thread_time_ns(),
                  int((usage.ru_utime + usage.ru_stime) * 1e9), usage.ru_nivcsw,
                  _schedstat("/proc/thread-self/schedstat"), _process_waits(), steal, busy)


def machine_figures(before: Sample, after: Sample) -> dict:
    """The region's figures (see the module's doc), JSON-ready. Call from the thread that took
    ``before``."""
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
        figures["process_runqueue_wait_ns"] = sum(
            w - before.process_waits.get(tid, 0) for tid, w in after.process_waits.items())
        figures["denied_share"] = min(1.0, wait / wall)
        figures["denied_source"] = "runqueue"
    else:
        figures["denied_share"] = min(1.0, max(0.0, 1 - thread_cpu / wall))
        figures["denied_source"] = "off-cpu"
    if before.steal_ns is not None and after.steal_ns is not None:
        figures["steal_ns"] = int(after.steal_ns - before.steal_ns)
    try:
        figures["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        figures["cpus"] = os.cpu_count() or 1
    if before.machine_busy_ns is not None and after.machine_busy_ns is not None:
        # /proc/stat covers every CPU of the machine, the affinity mask perhaps fewer
        others = max(0, int(after.machine_busy_ns - before.machine_busy_ns)
                     - figures["process_cpu_ns"])
        figures["others_cpu_ns"] = others
        capacity = wall * (os.cpu_count() or 1)
        if capacity >= _TICKS_FOR_A_SHARE * _TICK_NS:  # else a tick or two would be the share
            figures["others_share"] = min(1.0, others / capacity)
    try:
        figures["load_1m"] = os.getloadavg()[0]
    except OSError:
        pass
    return figures
