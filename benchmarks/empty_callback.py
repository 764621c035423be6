"""The floor of any RecordFunction-based profiler: a global callback that does nothing.

PyTorch runs an op's RecordFunction machinery (the dispatcher's slow path, the RecordFunction
object, the callback calls) as soon as any global callback is registered; what a profiler adds
beyond that is its own cost. benchmarks/empty_callback.cpp is a callback pair that returns at
once, registered with brick's observer's own options; CMake builds it beside the module (with the
tests, or with -DBRICK_BUILD_BENCHMARKS=ON: `scripts/run.sh bench` does), and this module loads
it, so the benchmarks measure that floor in the same run as the profilers they compare with it.
"""

import ctypes
import os
from pathlib import Path

_LIBRARY = "libbrick_bench_empty_callback.so"
_ROOT = Path(__file__).resolve().parent.parent


class EmptyCallback:
    def __init__(self, library: ctypes.CDLL):
        self._set_enabled = library.brick_bench_empty_callback_set_enabled
        self._set_enabled.argtypes = [ctypes.c_int]
        self._set_enabled.restype = None

    def set_enabled(self, enabled: bool) -> None:
        self._set_enabled(1 if enabled else 0)


_module = None


def library_path() -> Path:
    """Where the build put the helper: $BRICK_BUILD_DIR (scripts/run.sh exports it), else the
    default build folder of setup.py."""
    return Path(os.environ.get("BRICK_BUILD_DIR", _ROOT / "build" / "release")) / _LIBRARY


def load() -> EmptyCallback:
    """The empty callback (``set_enabled(bool)``), loaded once. torch must be imported first
    (the library binds to the libtorch already loaded)."""
    global _module
    if _module is None:
        path = library_path()
        if not path.is_file():
            raise FileNotFoundError(
                f"{path} is missing: build it with the tests (BRICK_BUILD_TESTS=1) or with "
                "BRICK_CMAKE_ARGS=-DBRICK_BUILD_BENCHMARKS=ON, e.g. `scripts/run.sh bench`"
            )
        _module = EmptyCallback(ctypes.CDLL(str(path)))
    return _module
