"""Live bricks: a profiled process publishes its registry while it runs, for
``python -m torch_brickdev top`` to watch.

Asked for with ``profile(live=True)`` (``python -m torch_brickdev profile --live``, or
``BRICK_LIVE=1`` for every ``profile()`` of a process); nothing is published, and nothing costs,
otherwise. While a live profile runs, a daemon thread takes a registry snapshot (with each
brick's histogram) every ``interval`` seconds (0.5 by default, never less) and writes it, whole,
as ``<pid>.json`` in the publishing directory: written to a temporary file and renamed, so a
reader never sees half a snapshot.

The directory is ``$BRICK_LIVE_DIR`` or ``<tmp>/torch_brickdev-live-<uid>``: created with mode
0700 and refused when another user owns it or others may write it; files are 0600. Only the
same user can read a publisher (file modes). A publisher removes its file when its profile
ends; one that died leaves a file whose process is gone, which readers skip and remove (a pid
reused by another process is told apart by its start time).
"""

from __future__ import annotations

import json
import os
import stat
import sys
import tempfile
import threading
import time
from typing import Dict, List, Optional

from .. import _C

__all__ = ["LiveError", "Publisher", "live_dir", "publishers", "read_publisher"]

MIN_INTERVAL_S = 0.5
FORMAT = "torch_brickdev.live"
VERSION = 1


class LiveError(RuntimeError):
    """The publishing directory cannot be trusted or used (the reason names it)."""


def live_dir(create: bool = False) -> str:
    """The publishing directory, checked: owned by this user, writable by nobody else."""
    path = os.environ.get("BRICK_LIVE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torch_brickdev-live-{os.getuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError as error:
            raise LiveError(f"brick live: cannot create {path}: {error.strerror}") from None
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return path
    if not stat.S_ISDIR(info.st_mode):
        raise LiveError(f"brick live: {path} is not a directory")
    if info.st_uid != os.getuid():
        raise LiveError(f"brick live: {path} belongs to uid {info.st_uid}, not to this user "
                        f"(uid {os.getuid()}); set BRICK_LIVE_DIR to a directory of yours")
    if info.st_mode & 0o077:
        raise LiveError(f"brick live: {path} has mode {stat.S_IMODE(info.st_mode):04o}; "
                        "expected 0700 (others must not read or plant publishers)")
    return path


def _start_time(pid: int) -> Optional[int]:
    """The process's start time (clock ticks since boot), None where it cannot be read."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            text = f.read()
    except OSError:
        return None
    fields = text[text.rfind(")") + 2:].split()
    try:
        return int(fields[19])
    except (IndexError, ValueError):
        return None


def _alive(pid: int, started: Optional[int]) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return False  # another user's process under a reused pid: not ours to show
    return started is None or _start_time(pid) in (None, started)


class Publisher:
    """Publishes the registry every ``interval`` seconds from a daemon thread, and once more at
    ``stop()``."""

    def __init__(self, interval: float = MIN_INTERVAL_S, modules: Optional[Dict] = None):
        self.interval = max(float(interval), MIN_INTERVAL_S)
        self.path = os.path.join(live_dir(create=True), f"{os.getpid()}.json")
        self._modules = modules  # the module bricks' names, filled while the profile runs
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._started_ns = time.time_ns()
        self._start_time = _start_time(os.getpid())
        self._seq = 0
        self.snapshots = 0
        self.cost_ns = 0  # CPU time the publishing took, for its stated cost

    def _header(self) -> dict:
        rank = os.environ.get("RANK")
        return {"format": FORMAT, "version": VERSION, "pid": os.getpid(),
                "start_time": self._start_time, "rank": int(rank) if rank and rank.isdigit()
                else None, "argv": list(sys.argv), "started_ns": self._started_ns}

    def publish(self, final: bool = False) -> None:
        # The CPU time of the publishing thread: what it takes from the process (its wall time
        # also counts the waits for the GIL while the profiled code holds it).
        begin = time.thread_time_ns()
        bricks = _C._profiler.snapshot(["name"], histograms=True)["name"]
        self._seq += 1
        self.snapshots = self._seq
        data = {**self._header(), "seq": self._seq, "time_ns": time.time_ns(),
                "sync_mode": _C._profiler.sync_mode(), "final": final,
                "modules": list(self._modules) if self._modules is not None else None,
                "bricks": bricks}
        temporary = f"{self.path}.{self._seq}.tmp"
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f, separators=(",", ":"))
        os.replace(temporary, self.path)
        self.cost_ns += time.thread_time_ns() - begin

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            try:
                self.publish()
            except Exception:  # a full disk must not end the profiled program
                pass

    def start(self) -> None:
        self.publish()
        self._thread = threading.Thread(target=self._run, name="brick-live", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass


def read_publisher(path: str) -> Optional[dict]:
    """The snapshot at ``path``; None when it vanished, is not a live snapshot, or its process
    has ended (then the file is removed)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(data, dict) or data.get("format") != FORMAT or \
            not isinstance(data.get("pid"), int):
        return None
    if not _alive(data["pid"], data.get("start_time")):
        try:
            os.unlink(path)  # a publisher that died: leaves nothing for the next one
        except OSError:
            pass
        return None
    return data


def publishers() -> List[dict]:
    """The live publishers of this user, by pid."""
    directory = live_dir()
    try:
        names = os.listdir(directory)
    except FileNotFoundError:
        return []
    found = []
    for name in names:
        if name.endswith(".json") and name[:-5].isdigit():
            data = read_publisher(os.path.join(directory, name))
            if data is not None:
                found.append(data)
        elif name.endswith(".tmp"):
            pid = name.split(".", 1)[0]
            if pid.isdigit() and not _alive(int(pid), None):
                try:
                    os.unlink(os.path.join(directory, name))
                except OSError:
                    pass
    return sorted(found, key=lambda d: d["pid"])
