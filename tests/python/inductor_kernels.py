"""Inductor's caches for a test module: a fresh directory, seeded with the C++ kernels that
earlier runs compiled and loaded.

Inductor generates every kernel's source and its Python wrapper anew in each run; only g++'s
output for a kernel whose source and compile command are byte-identical is reused (Inductor
keys each ``.so`` by a hash of both and compiles only where that file is missing). Nothing else
carries over: the FX graph and AOT autograd caches, the generated wrappers and every in-process
cache start empty, so brick's code generation runs for real each time and a change to it is
never hidden by an earlier run's graphs.

What carries over is ``$BRICK_CACHE_DIR/inductor-kernels/<torch, Python, compiler>/`` (default
``~/.cache/torch_brickdev``): the kernels this process loaded, published when the module ends.
A kernel counts only once it was loaded (it is in this process's memory map), so a compile cut
short (a test that timed out, a killed run) never publishes a partial file; each file is
written beside its final name and renamed over it, so a reader never sees half of one. Files
no run has used for two weeks are removed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from typing import Iterator, Set

UNUSED_FOR_S = 14 * 24 * 3600  # a kernel no run used for this long is deleted
_PARTIAL_AGE_S = 3600  # a temporary file left by a killed publish is deleted after this


def _compiler_identity() -> str:
    """The C++ compiler Inductor calls, as a name that changes when the compiler does."""
    from torch._inductor import config

    compiler = config.cpp.cxx[1] or "g++"
    path = shutil.which(compiler)
    if path is None:
        return compiler
    stat = os.stat(os.path.realpath(path))
    return f"{os.path.basename(os.path.realpath(path))}-{stat.st_size}-{int(stat.st_mtime)}"


def store_dir() -> str:
    """Where loaded kernels outlive the run, one folder per torch, Python and compiler."""
    import torch

    root = os.environ.get("BRICK_CACHE_DIR") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "torch_brickdev")
    python = f"py{sys.version_info.major}{sys.version_info.minor}"
    return os.path.join(root, "inductor-kernels",
                        f"torch-{torch.__version__}-{python}-{_compiler_identity()}")


def _kernels_in(directory: str) -> Iterator[str]:
    """The compiled kernels under ``directory``, as paths relative to it (``ab/cab...so``)."""
    if not os.path.isdir(directory):
        return
    for sub in os.listdir(directory):
        folder = os.path.join(directory, sub)
        if len(sub) != 2 or not os.path.isdir(folder):  # Inductor's folders: two hash letters
            continue
        for name in os.listdir(folder):
            if name.endswith(".so"):
                yield os.path.join(sub, name)


def _loaded_files() -> Set[str]:
    """The files mapped into this process (each loaded shared library among them)."""
    try:
        with open("/proc/self/maps") as maps:
            return {line.split(None, 5)[5].strip() for line in maps if line.count(" ") >= 5
                    and "/" in line}
    except OSError:  # not Linux: nothing is published
        return set()


def seed(cache_dir: str, store: str) -> int:
    """Copies the stored kernels into ``cache_dir``; returns how many."""
    copied = 0
    for relative in _kernels_in(store):
        target = os.path.join(cache_dir, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        with contextlib.suppress(OSError):  # another process pruning it: compiled again instead
            shutil.copyfile(os.path.join(store, relative), target)
            copied += 1
    return copied


def publish(cache_dir: str, store: str) -> int:
    """Stores the kernels under ``cache_dir`` that this process loaded, marks them used, and
    prunes the store; returns how many were stored."""
    loaded = _loaded_files()
    stored = 0
    for relative in _kernels_in(cache_dir):
        source = os.path.realpath(os.path.join(cache_dir, relative))
        if source not in loaded:
            continue
        target = os.path.join(store, relative)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        if not os.path.exists(target):
            partial = f"{target}.partial-{os.getpid()}"
            shutil.copyfile(source, partial)
            os.replace(partial, target)
        os.utime(target)
        stored += 1
    now = time.time()
    for sub in os.listdir(store) if os.path.isdir(store) else ():
        folder = os.path.join(store, sub)
        for name in os.listdir(folder) if os.path.isdir(folder) else ():
            path = os.path.join(folder, name)
            with contextlib.suppress(OSError):
                age = now - os.stat(path).st_mtime
                if age > (_PARTIAL_AGE_S if ".partial-" in name else UNUSED_FOR_S):
                    os.remove(path)
    return stored


@contextlib.contextmanager
def seeded_inductor_cache() -> Iterator[str]:
    """Inductor's caches in a new temporary folder seeded from the store, for the block; the
    kernels loaded in it are published when it ends. In-process caches are cleared on entry
    and exit, so nothing compiled earlier in the process is reused."""
    from torch._inductor.utils import clear_caches

    store = store_dir()
    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    with tempfile.TemporaryDirectory(prefix="brick-inductor-") as cache_dir:
        seed(cache_dir, store)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
        clear_caches()
        try:
            yield cache_dir
        finally:
            try:
                with contextlib.suppress(OSError):  # a full or read-only disk: nothing kept
                    publish(cache_dir, store)
            finally:
                clear_caches()
                if previous is None:
                    os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
                else:
                    os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous
