"""What the machine denied a profiled region: the time its thread waited for a CPU while other
processes ran, so that a verdict can tell a busy machine from a slow program.

``sample()`` before and ``machine_figures(before, sample())`` after give, for the region:

* ``wall_ns``, ``thread_cpu_ns`` (the profiling thread's CPU time), ``process_cpu_ns``;
* ``runqueue_wait_ns``: the time the profiling thread was runnable but waiting for a CPU
  (Linux schedstat, ``/proc/self/task/TID/schedstat``), ``process_runqueue_wait_ns`` summed over
  the process's threads (the backing kernels' own threads among them);
* ``involuntary_switches``: times the process was preempted (``getrusage``);
* ``steal_ns``: CPU time the hypervisor gave other guests, all CPUs together (``/proc/stat``);
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

Nothing here runs on the op path: two samples per profiled region.
"""

from __future__ import annotations

import os
import resource
import threading
import time
from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

__all__ = ["Sample", "machine_figures", "sample", "spans_enough_ticks"]

_TICK_NS = 1e9 / os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 1e7
# The figures /proc/stat counts in ticks (others_*, steal_ns) need the region to span this many
# clock ticks of the machine's CPUs together: their error is then a tick or two in 20, ~10 %.
_TICKS_FOR_A_FIGURE = 20
# The machine's CPUs, read once: os.cpu_count() reads sysfs, 60 us right after a garbage
# collection (the 2-core VM), a tenth of a profile's fixed cost; CPUs are rarely hot-plugged.
_MACHINE_CPUS = os.cpu_count() or 1


class _ProcFiles:
    """The /proc files a sample reads, kept open and read again from their start (pread): a
    profile samples twice, and opening a /proc file (its path walked anew) costs about as much
    as reading it (the 2-core VM: a sample of a 4-thread process 51 -> 29 us). One descriptor
    per file, closed when its thread is gone; none crosses a fork (the child's tasks are not
    the parent's)."""

    def __init__(self):
        self._lock = threading.Lock()
        self._pid = -1
        self._fds: Dict[str, int] = {}
        # The process's thread ids as the last listing of /proc/self/task found them.
        self.threads: Optional[List[str]] = None

    def read(self, path: str) -> Optional[str]:
        # The first 4 KiB: the files read are small, or only their first line is read
        # (/proc/stat, whose other lines grow with the machine's CPUs and interrupts).
        with self._lock:
            fd = self._open(path, 0)
            if fd is None:
                return None
            try:
                return os.pread(fd, 4096, 0).decode("ascii", "replace")
            except OSError:  # its task ended
                self._forget(path)
                return None

    def links(self, path: str) -> Optional[int]:
        """The link count of the directory `path`, kept open (for a /proc/PID/task directory:
        the process's thread count + 2)."""
        with self._lock:
            fd = self._open(path, os.O_DIRECTORY)
            if fd is None:
                return None
            try:
                return os.fstat(fd).st_nlink
            except OSError:
                self._forget(path)
                return None

    def _open(self, path: str, flags: int) -> Optional[int]:
        if self._pid != os.getpid():
            self._close_all()
            self._pid = os.getpid()
        fd = self._fds.get(path)
        if fd is None:
            try:
                fd = os.open(path, os.O_RDONLY | flags | getattr(os, "O_CLOEXEC", 0))
            except OSError:
                return None
            self._fds[path] = fd
        return fd

    def keep_only(self, prefix: str, paths: set) -> None:
        """Closes the files under `prefix` not in `paths` (threads that ended)."""
        with self._lock:
            for path in [p for p in self._fds if p.startswith(prefix) and p not in paths]:
                self._forget(path)

    def _forget(self, path: str) -> None:
        fd = self._fds.pop(path, None)
        if fd is not None and self._pid == os.getpid():
            try:
                os.close(fd)
            except OSError:
                pass

    def _close_all(self) -> None:
        # In a forked child the parent's descriptors are closed too: they name its tasks.
        for fd in self._fds.values():
            try:
                os.close(fd)
            except OSError:
                pass
        self._fds.clear()
        self.threads = None


_PROC = _ProcFiles()
_TASKS = "/proc/self/task/"


def _read(path: str) -> Optional[str]:
    return _PROC.read(path)


def _parse_schedstat(text: Optional[str]) -> Optional[tuple]:
    """(cpu ns, run-queue wait ns) of one thread, None where the kernel does not keep them."""
    try:
        cpu, wait = (int(x) for x in text.split()[:2])
    except (AttributeError, ValueError):
        return None
    return cpu, wait


def _list_threads() -> Optional[List[str]]:
    """The process's thread ids, listed from /proc (and kept for the next sample)."""
    try:
        tids = os.listdir(_TASKS)
    except OSError:
        return None
    _PROC.keep_only(_TASKS, {f"{_TASKS}{tid}/schedstat" for tid in tids})
    _PROC.threads = tids
    return tids


def _read_schedstats(tids: List[str]) -> Tuple[Dict[int, tuple], bool]:
    """The schedstat of each thread of `tids`, and whether every one was read."""
    stats, complete = {}, True
    for tid in tids:
        stat = _parse_schedstat(_read(f"{_TASKS}{tid}/schedstat"))
        if stat is None:  # the thread ended (or the kernel keeps no schedstat)
            complete = False
        else:
            stats[int(tid)] = stat
    return stats, complete


def _schedstats() -> Dict[int, tuple]:
    """Per thread of the process, its schedstat (cpu ns, run-queue wait ns).

    The threads are listed again only when their number (the task directory's link count, less
    2) differs from the last listing's, or one of them could not be read (it ended: a thread
    that started since then means one ended, as the number is the same): listing the directory
    costs 46-80 us right after a garbage collection, counting its links 33 us (the 2-core VM)."""
    links = _PROC.links(_TASKS.rstrip("/"))  # first: in a forked child it forgets the parent's
    tids, listed = _PROC.threads, False
    if tids is None or links is None or links - 2 != len(tids):
        tids, listed = _list_threads(), True
    if tids is None:
        return {}
    stats, complete = _read_schedstats(tids)
    if not complete and not listed:
        tids = _list_threads()
        stats = _read_schedstats(tids)[0] if tids is not None else {}
    return stats


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


def spans_enough_ticks(wall_ns: int) -> bool:
    """Whether a region of ``wall_ns`` spans enough clock ticks of the machine's CPUs together
    for the figures /proc/stat counts in ticks (``others_*``, ``steal_ns``) to mean anything."""
    return wall_ns * _MACHINE_CPUS >= _TICKS_FOR_A_FIGURE * _TICK_NS


def sample(ticks: bool = True) -> Sample:
    """The counters now, for the calling thread and its process. ``ticks=False`` leaves out the
    machine's tick counts (/proc/stat, the costliest read: 45-97 us right after a garbage
    collection on the 2-core VM), for the end of a region too short for them
    (``spans_enough_ticks``)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    busy, steal = _cpu_times() if ticks else (None, None)
    stats = _schedstats()
    return Sample(time.perf_counter_ns(), time.thread_time_ns(),
                  int((usage.ru_utime + usage.ru_stime) * 1e9), usage.ru_nivcsw,
                  stats.get(threading.get_native_id()),
                  {tid: stat[1] for tid, stat in stats.items()}, steal, busy)


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
    try:
        figures["cpus"] = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        figures["cpus"] = _MACHINE_CPUS
    ticked = spans_enough_ticks(wall)
    if ticked and before.steal_ns is not None and after.steal_ns is not None:
        figures["steal_ns"] = int(after.steal_ns - before.steal_ns)
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
