"""Live bricks: a profiled process publishes its registry while it runs, for
``python -m torch_brickdev top`` to watch.

Asked for with ``profile(live=True)`` (``python -m torch_brickdev profile --live``, or
``BRICK_LIVE=1`` for every ``profile()`` of a process); nothing is published, and nothing costs,
otherwise. While a live profile runs, a daemon thread takes a registry snapshot (with each
brick's histogram) every ``interval`` seconds (0.5 by default, never less) and writes it, whole,
as ``<pid>.json`` in the publishing directory: written to a temporary file and renamed, so a
reader never sees half a snapshot.

The directory is ``$BRICK_LIVE_DIR`` or ``<tmp>/torch_brickdev-live-<uid>``: created with mode
0700 and refused when another user owns it, others may write it or it is a symbolic link; files
are 0600. A publisher opens the directory once, at its start, and writes and removes its files
through that descriptor only, so a directory swapped for a link afterwards redirects nothing.
Where its file cannot be written (a directory in its place, a full disk), the publisher warns
once, removes what it wrote and publishes no more; the profile goes on.

A publisher removes its file when its profile ends; one that died leaves a file whose process is
gone, which readers skip and remove (a pid reused by another process is told apart by its start
time). Readers read only regular files, at most ``MAX_SNAPSHOT_BYTES`` each, without following
links or waiting on FIFOs; a file that is no well-formed snapshot of this version (the schema in
``_check_snapshot``) is skipped with a one-line note naming it and what is wrong.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import sys
import tempfile
import threading
import time
import warnings
from dataclasses import dataclass, field
from typing import Dict, List, Optional

from ..argcheck import show_json

__all__ = ["LiveError", "Publisher", "Scan", "live_dir", "publishers", "scan"]

MIN_INTERVAL_S = 0.5
FORMAT = "torch_brickdev.live"
VERSION = 1
# A snapshot takes ~0.5 KB per brick (its histogram included): 16 MiB is tens of thousands of
# bricks, and bounds what a reader holds for a file someone else left there.
MAX_SNAPSHOT_BYTES = 16 << 20
MAX_SNAPSHOTS = 256  # files one reading reads: torchrun ranks of a host, with room
MAX_PID = 2**22  # Linux's PID_MAX_LIMIT: no process id is larger
_MAX_INT_DIGITS = 20  # an int64's digits and sign: a longer literal is no snapshot's
_INT64_END = 2**63
# Histogram counts added over MAX_SNAPSHOTS publishers stay below the registry's int64.
_COUNT_END = 2**53

_DIRECTORY_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC
_CREATE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


class LiveError(RuntimeError):
    """The publishing directory cannot be trusted or used (the reason names it)."""


# ---- the directory ----------------------------------------------------------------------------


def _directory_path() -> str:
    return os.environ.get("BRICK_LIVE_DIR") or os.path.join(
        tempfile.gettempdir(), f"torch_brickdev-live-{os.getuid()}")


def _check_directory(path: str, info: os.stat_result) -> None:
    if not stat.S_ISDIR(info.st_mode):
        kind = " (a symbolic link)" if stat.S_ISLNK(info.st_mode) else ""
        raise LiveError(f"brick live: {path} is not a directory{kind}")
    if info.st_uid != os.getuid():
        raise LiveError(f"brick live: {path} belongs to uid {info.st_uid}, not to this user "
                        f"(uid {os.getuid()}); set BRICK_LIVE_DIR to a directory of yours")
    if info.st_mode & 0o077:
        raise LiveError(f"brick live: {path} has mode {stat.S_IMODE(info.st_mode):04o}; "
                        "expected 0700 (others must not read or plant publishers)")


def live_dir(create: bool = False) -> str:
    """The publishing directory, checked: owned by this user, writable by nobody else, not a
    symbolic link."""
    path = _directory_path()
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
    _check_directory(path, info)
    return path


def _open_directory(path: str) -> int:
    """A descriptor of the directory at ``path``, checked as opened (no link followed): what is
    read and written through it stays there whatever later happens to ``path``."""
    try:
        fd = os.open(path, _DIRECTORY_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as error:
        if error.errno in (errno.ELOOP, errno.ENOTDIR):
            _check_directory(path, os.lstat(path))  # raises, naming what it is
        raise LiveError(f"brick live: cannot open {path}: {error.strerror}") from None
    try:
        _check_directory(path, os.fstat(fd))
    except BaseException:
        os.close(fd)
        raise
    return fd


def _unlink_quietly(name: str, directory_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=directory_fd)
    except OSError:
        pass


# ---- processes --------------------------------------------------------------------------------


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


# ---- publishing -------------------------------------------------------------------------------


class _PublishFailed(Exception):
    """A snapshot could not be written: the message names the file and why."""


class Publisher:
    """Publishes the registry at ``start()``, then every ``interval`` seconds from a daemon
    thread, and when ``publish()`` is called, until ``stop()``. Nothing it does raises into the
    profiled program once it started: a snapshot it cannot write warns once and ends the
    publishing."""

    def __init__(self, interval: float = MIN_INTERVAL_S, modules: Optional[Dict] = None):
        self.interval = max(float(interval), MIN_INTERVAL_S)
        self.directory = live_dir(create=True)  # refused here, before the profile changes anything
        self.name = f"{os.getpid()}.json"
        self.path = os.path.join(self.directory, self.name)
        self._modules = modules  # the module bricks' names, filled while the profile runs
        self._directory_fd: Optional[int] = None
        self._lock = threading.Lock()  # the thread and a caller of publish() take turns
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._started_ns = time.time_ns()
        self._start_time = _start_time(os.getpid())
        self._seq = 0
        self._published = False  # the file is there, to be removed at the end
        self._failed = False
        self.snapshots = 0
        self.cost_ns = 0  # CPU time the publishing took, for its stated cost

    def _snapshot(self) -> bytes:
        from .. import _C  # here: `top` reads the files without it until there are bricks

        bricks = _C._profiler.snapshot(["name"], histograms=True)["name"]
        rank = os.environ.get("RANK")
        data = {"format": FORMAT, "version": VERSION, "pid": os.getpid(),
                "start_time": self._start_time,
                "rank": int(rank) if rank and rank.isdigit() else None, "argv": list(sys.argv),
                "started_ns": self._started_ns, "seq": self._seq, "time_ns": time.time_ns(),
                "sync_mode": _C._profiler.sync_mode(),
                "modules": list(self._modules) if self._modules is not None else None,
                "bricks": bricks}
        # json.dumps encodes in C; json.dump to a file takes the pure-Python encoder (~4x).
        return json.dumps(data, separators=(",", ":")).encode()

    def _create(self, name: str) -> int:
        try:
            return os.open(name, _CREATE_FLAGS, 0o600, dir_fd=self._directory_fd)
        except FileExistsError:
            # The name holds this pid: an earlier process of the same pid was killed mid-write
            # (readers keep it, the pid being alive). Whatever it is, it is no one else's.
            os.unlink(name, dir_fd=self._directory_fd)
            return os.open(name, _CREATE_FLAGS, 0o600, dir_fd=self._directory_fd)

    def _write(self, payload: bytes) -> None:
        temporary = f"{self.name}.{self._seq}.tmp"
        where = os.path.join(self.directory, temporary)
        try:
            fd = self._create(temporary)
        except OSError as error:
            raise _PublishFailed(f"cannot create {where}: {error.strerror}") from None
        try:
            try:
                view = memoryview(payload)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
        except OSError as error:
            _unlink_quietly(temporary, self._directory_fd)
            raise _PublishFailed(f"cannot write {where}: {error.strerror}") from None
        try:
            os.replace(temporary, self.name, src_dir_fd=self._directory_fd,
                       dst_dir_fd=self._directory_fd)
        except OSError as error:
            _unlink_quietly(temporary, self._directory_fd)
            raise _PublishFailed(f"cannot publish {self.path}: {error.strerror}") from None
        self._published = True

    def publish(self) -> None:
        """Writes one snapshot (none once a write failed or the publisher stopped)."""
        with self._lock:
            if self._failed or self._directory_fd is None:
                return
            # The CPU time of the publishing thread: what it takes from the process (its wall
            # time also counts the waits for the GIL while the profiled code holds it).
            begin = time.thread_time_ns()
            self._seq += 1
            try:
                self._write(self._snapshot())
                self.snapshots = self._seq
            except _PublishFailed as failure:
                self._fail(str(failure))
            except Exception as error:  # e.g. out of memory: the profiled program goes on
                self._fail(f"cannot take a snapshot for {self.path}: {error}")
            finally:
                self.cost_ns += time.thread_time_ns() - begin

    def _fail(self, why: str) -> None:
        self._failed = True
        if self._published:  # a snapshot that no longer changes would read as a stalled process
            _unlink_quietly(self.name, self._directory_fd)
            self._published = False
        message = f"brick live: {why}; the profile goes on unpublished"
        try:
            warnings.warn(message, RuntimeWarning, stacklevel=2)
        except Exception:  # warnings made errors: publishing still never raises into the program
            print(message, file=sys.stderr)

    def _run(self) -> None:
        while not self._stop.wait(self.interval) and not self._failed:
            self.publish()

    def start(self) -> None:
        self._directory_fd = _open_directory(self.directory)
        self.publish()
        self._thread = threading.Thread(target=self._run, name="brick-live", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            if self._directory_fd is None:
                return
            if self._published:
                _unlink_quietly(self.name, self._directory_fd)
                self._published = False
            os.close(self._directory_fd)
            self._directory_fd = None


# ---- reading ----------------------------------------------------------------------------------


class _Malformed(Exception):
    """A file that is no well-formed snapshot: the message says what is wrong."""


@dataclass
class Scan:
    """One reading of the publishing directory."""

    directory: str
    publishers: List[dict] = field(default_factory=list)  # live ones, by pid
    skipped: List[str] = field(default_factory=list)  # one line per file: its path, what is wrong


def _parse_int(text: str) -> int:
    if len(text) > _MAX_INT_DIGITS:  # converting a long literal is slow, and none is valid
        raise ValueError(f"an integer literal of {len(text.lstrip('-'))} digits")
    return int(text)


def _file_kind(mode: int) -> str:
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
                       (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return f"mode {mode:o}"


def _read(directory_fd: int, name: str) -> Optional[object]:
    """The JSON in the file ``name``, None when it vanished; raises _Malformed."""
    try:
        fd = os.open(name, _READ_FLAGS, dir_fd=directory_fd)
    except FileNotFoundError:
        return None
    except OSError as error:
        if error.errno == errno.ELOOP:
            raise _Malformed("a symbolic link, not a snapshot") from None
        raise _Malformed(f"cannot open: {error.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _Malformed(f"not a regular file ({_file_kind(info.st_mode)})")
        chunks, size = [], 0
        while size <= MAX_SNAPSHOT_BYTES:  # the file may grow after the fstat
            chunk = os.read(fd, MAX_SNAPSHOT_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as error:
        raise _Malformed(f"cannot read: {error.strerror}") from None
    finally:
        os.close(fd)
    if size > MAX_SNAPSHOT_BYTES:
        raise _Malformed(f"larger than {MAX_SNAPSHOT_BYTES} bytes (no snapshot is)")
    try:
        return json.loads(b"".join(chunks), parse_int=_parse_int)
    except RecursionError:
        raise _Malformed("not JSON: nested too deeply") from None
    except ValueError as error:
        raise _Malformed(f"not JSON: {error}") from None


def _int(data: dict, key: str, low: int = 0, end: int = _INT64_END, optional: bool = False):
    if key not in data:
        raise _Malformed(f"{key}: missing")
    value = data[key]
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value < end:
        expected = f"an integer in {low}..{end - 1}" + (" or null" if optional else "")
        raise _Malformed(f"{key}: expected {expected}, got {show_json(value)}")


def _strings(data: dict, key: str, optional: bool = False) -> None:
    if key not in data:
        raise _Malformed(f"{key}: missing")
    value = data[key]
    if value is None and optional:
        return
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise _Malformed(f"{key}: expected an array of strings"
                         + (" or null" if optional else "") + f", got {show_json(value)}")


def _check_brick(index: int, brick, buckets: bool) -> None:
    if not isinstance(brick, dict):
        raise _Malformed(f"bricks[{index}]: expected an object, got {show_json(brick)}")
    name = brick.get("name")
    if not isinstance(name, str):
        raise _Malformed(f"bricks[{index}] name: expected a string, got {show_json(name)}")
    where = f"bricks[{index}] {name[:40]!r}"
    try:
        if not isinstance(brick.get("kind"), str):
            raise _Malformed(f"kind: expected a string, got {show_json(brick.get('kind'))}")
        _int(brick, "count")
        _int(brick, "total_ns")
        histogram = brick.get("histogram")
        if not isinstance(histogram, list) or not all(
                isinstance(pair, list) and len(pair) == 2 and
                all(isinstance(n, int) and not isinstance(n, bool) for n in pair) and
                0 <= pair[1] < _COUNT_END and abs(pair[0]) < 2**31 for pair in histogram):
            raise _Malformed("histogram: expected an array of [bucket, count] integer pairs "
                             f"(counts below 2**53), got {show_json(histogram)}")
        if buckets:
            from .. import _C  # loads torch: asked for only by readers that take percentiles

            try:  # the registry owns the buckets' range
                _C._profiler.percentile_of_buckets(histogram, 1.0)
            except ValueError as error:
                raise _Malformed(f"histogram: {str(error).split(': ', 1)[-1]}") from None
    except _Malformed as error:
        raise _Malformed(f"{where}: {error}") from None


def _check_snapshot(data, pid_of_name: int, buckets: bool) -> None:
    """Raises _Malformed naming the first field that breaks the schema: the fields a reader
    reads, each of its JSON type and range."""
    if not isinstance(data, dict):
        raise _Malformed(f"not a JSON object ({show_json(data)})")
    if data.get("format") != FORMAT:
        raise _Malformed(f"format {show_json(data.get('format'))}, expected {FORMAT!r}")
    if data.get("version") != VERSION:
        raise _Malformed(f"version {show_json(data.get('version'))}; this reader reads version "
                         f"{VERSION}")
    _int(data, "pid", 1, MAX_PID + 1)
    if data["pid"] != pid_of_name:
        raise _Malformed(f"pid {data['pid']} in the file of pid {pid_of_name}")
    for key in ("seq", "started_ns", "time_ns"):
        _int(data, key)
    if data["time_ns"] < data["started_ns"]:
        raise _Malformed(f"time_ns {data['time_ns']} before started_ns {data['started_ns']}")
    _int(data, "start_time", optional=True)
    _int(data, "rank", end=2**31, optional=True)
    _strings(data, "argv")
    _strings(data, "modules", optional=True)
    if not isinstance(data.get("sync_mode"), str):
        raise _Malformed(f"sync_mode: expected a string, got {show_json(data.get('sync_mode'))}")
    bricks = data.get("bricks")
    if not isinstance(bricks, list):
        raise _Malformed(f"bricks: expected an array, got {show_json(bricks)}")
    for index, brick in enumerate(bricks):
        _check_brick(index, brick, buckets)


def _pid_of(name: str) -> Optional[str]:
    """The pid part of a publisher's file name (``<pid>.json``, ``<pid>.json.<seq>.tmp``)."""
    if name.endswith(".json"):
        pid = name[:-5]
    elif name.endswith(".tmp"):
        pid = name.split(".", 1)[0]
    else:
        return None
    return pid if pid.isascii() and pid.isdigit() else None


def scan(buckets: bool = True) -> Scan:
    """The live publishers of this user, by pid, and a note for each file skipped. ``buckets``
    also checks each histogram's buckets against the registry's range (which loads torch): what
    a reader that takes percentiles of them needs, and ``top --list`` does without."""
    directory = live_dir()
    found = Scan(directory)
    try:
        directory_fd = _open_directory(directory)
    except FileNotFoundError:
        return found
    try:
        snapshots = 0
        for name in sorted(os.listdir(directory_fd)):
            pid_text = _pid_of(name)
            if pid_text is None:
                continue
            path = os.path.join(directory, name)
            pid = int(pid_text) if len(pid_text) <= _MAX_INT_DIGITS else MAX_PID + 1
            if not 1 <= pid <= MAX_PID:
                found.skipped.append(f"{path}: pid {pid_text} is not a process id "
                                     f"(expected 1..{MAX_PID})")
                continue
            if not _alive(pid, None):  # what a process that died left, whatever it holds
                _unlink_quietly(name, directory_fd)
                continue
            if name.endswith(".tmp"):
                continue
            snapshots += 1
            if snapshots > MAX_SNAPSHOTS:
                found.skipped.append(f"{path}: past the {MAX_SNAPSHOTS} snapshots read at once")
                continue
            try:
                data = _read(directory_fd, name)
                if data is None:
                    continue
                _check_snapshot(data, pid, buckets)
            except _Malformed as error:
                found.skipped.append(f"{path}: {error}")
                continue
            if _alive(pid, data["start_time"]):
                found.publishers.append(data)
            else:
                _unlink_quietly(name, directory_fd)  # its pid now names a later process
    finally:
        os.close(directory_fd)
    found.publishers.sort(key=lambda d: d["pid"])
    return found


def publishers() -> List[dict]:
    """The live publishers of this user, by pid (files that are no snapshot skipped)."""
    return scan().publishers
