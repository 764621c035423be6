"""The backing device's peaks for the roofline (:mod:`.roofline`): a matmul's FLOP/s and a copy's
bytes/s, measured on brick itself (the backing device's kernels, through brick's own sync), the
best of several calibrated runs, cached per machine, dtype and thread count in
``$BRICK_ROOFLINE_CACHE`` or ``~/.cache/torch_brickdev/roofline.json``.

Other processes that took the CPUs during a measurement read the peaks low, and a low peak lets
later ops exceed it. A measurement during which the thread waited for a CPU more than
``BUSY_SHARE`` of the time is cached as provisional (``"final": false``): the next process that
needs the peaks measures again and keeps the best figures of the measurements, until one ran on
a quiet machine. A report's roofline says when its peaks are provisional. ``peaks(refresh=True)``,
:func:`measure_peaks` or ``BRICK_ROOFLINE_REFRESH=1`` (once per process) measure again now,
replacing the cached entry. The cache file is data: one that cannot be read as a cache (not JSON,
not an object, an entry of the wrong shape, over ``MAX_CACHE_BYTES``) is ignored with a warning
naming it and what is wrong, and rewritten.
"""

from __future__ import annotations

import json
import math
import os
import platform
import time
import warnings
from typing import Optional, Tuple

import torch

from .. import _C
from ..argcheck import check_bool
from . import machine

__all__ = ["BUSY_SHARE", "FLOAT_DTYPES", "entry_problem", "measure_peaks", "peaks", "provisional"]

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")  # torch's names: torch.<name>
# A measurement whose thread waited for a CPU longer than this share of it is provisional.
BUSY_SHARE = 0.2
MAX_CACHE_BYTES = 1 << 20  # a few hundred entries; more is no cache this module wrote
_RATES = ("flops_per_s", "bytes_per_s", "memory_bytes_per_s")
# The cache keys measured by this process: a provisional entry is measured again once per
# process, not by every profile of a busy one (a measurement takes seconds).
_MEASURED_HERE = set()


def _cache_path() -> str:
    return os.environ.get("BRICK_ROOFLINE_CACHE") or os.path.join(
        os.path.expanduser("~"), ".cache", "torch_brickdev", "roofline.json")


def _backing() -> str:
    return _C._backing_device_type()


def _machine_key(dtype: str) -> str:
    backing = _backing()
    if backing == "cuda":
        where = torch.cuda.get_device_name(torch.brick.current_device())
    else:
        where = f"{platform.processor() or platform.machine()} x{os.cpu_count()}"
        try:
            with open("/proc/cpuinfo") as f:
                model = next((line.split(":", 1)[1].strip() for line in f
                              if line.startswith("model name")), None)
            where = f"{model} x{os.cpu_count()}" if model else where
        except OSError:
            pass
    return (f"{backing}|{where}|{torch.get_num_threads()} threads|torch {torch.__version__}|"
            f"{dtype}")


def _best_seconds(fn, timing_seconds: float = 0.002, budget_seconds: float = 0.15,
                  repeats: Tuple[int, int] = (5, 40)) -> Tuple[float, int]:
    """(best seconds per call, calls per timing): calls per timing calibrated to last
    ``timing_seconds``, the best of at least ``repeats[0]`` and at most ``repeats[1]`` timings
    within ``budget_seconds``. Short timings, many of them: on a machine other processes share,
    some run without the thread losing its CPU (a 50 ms timing never does on a busy 2-core VM,
    and peaks measured below the kernels' real rate would let later ops exceed them)."""
    fn()
    torch.brick.synchronize()
    calls = 1
    while True:
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.brick.synchronize()
        elapsed = time.perf_counter() - start
        if elapsed >= timing_seconds or calls >= 1 << 16:
            break
        calls *= 2
    best, timings, deadline = elapsed / calls, 1, time.perf_counter() + budget_seconds
    while timings < repeats[0] or (timings < repeats[1] and time.perf_counter() < deadline):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.brick.synchronize()
        best = min(best, (time.perf_counter() - start) / calls)
        timings += 1
    return best, calls


def measure_peaks(dtype: str = "float32") -> dict:
    """Measures the backing device's matmul FLOP/s and copy bytes/s in ``dtype`` on brick now,
    and caches them for this machine, replacing what was cached. Returns the cache entry:
    ``flops_per_s`` (the best square matmul of three sizes), ``bytes_per_s`` (the best copy of
    four sizes, read plus written: in cache or in memory, whichever is faster, so that no op's
    traffic can exceed it) and ``memory_bytes_per_s`` (the largest copy's, beyond the caches),
    with how and when they were measured, ``denied_share`` (the share of the measurement the
    thread waited for a CPU) and ``final`` (False: the machine was busy, see the module's doc)."""
    _check_dtype(dtype, "measure_peaks")
    entry = _measure(dtype)
    _store(dtype, entry)
    return entry


def peaks(dtype: str = "float32", refresh: bool = False) -> dict:
    """This machine's peaks for ``dtype``: as cached, measured when missing, measured again
    (keeping the best figures) when the cached ones are provisional and this process has not
    measured them yet. ``refresh=True`` (or ``BRICK_ROOFLINE_REFRESH=1``, once per process)
    measures them again now, replacing the cached entry."""
    _check_dtype(dtype, "peaks")
    check_bool(refresh, "refresh", "brick roofline: peaks()")
    key = _machine_key(dtype)
    if refresh or (key not in _MEASURED_HERE and _C._profiler.env_flag("BRICK_ROOFLINE_REFRESH")):
        return measure_peaks(dtype)
    path = _cache_path()
    cached = _read_cache(path).get(key)
    problem = None if cached is None else entry_problem(cached)
    if problem is not None:
        _note(f"{path}: the entry for {key!r} {problem}; it is ignored and the peaks are "
              "measured again")
        cached = None
    if cached is None:
        return measure_peaks(dtype)
    if provisional(cached) and key not in _MEASURED_HERE:
        entry = _best_of(cached, _measure(dtype))
        _store(dtype, entry)
        return entry
    return cached


def provisional(entry: dict) -> bool:
    """Whether ``entry``'s peaks were measured only on a busy machine (and may be low): its
    ``final`` flag, or for an entry without one, its ``denied_share`` over :data:`BUSY_SHARE`."""
    final = entry.get("final")
    if isinstance(final, bool):
        return not final
    denied = entry.get("denied_share")
    return _is_number(denied) and denied > BUSY_SHARE


def entry_problem(entry) -> Optional[str]:
    """What is wrong with a cache (or report) entry of peaks, or None: its rates must be finite
    numbers > 0, ``how`` and ``measured_at`` text, ``denied_share`` (when present) a number in
    [0, 1], ``final`` (when present) a bool."""
    if not isinstance(entry, dict):
        return f"must be an object, got {type(entry).__name__}"
    for key in _RATES:
        value = entry.get(key)
        if not (_is_number(value) and math.isfinite(value) and value > 0):
            return f"has {key} {value!r}; expected a finite number > 0"
    for key in ("how", "measured_at"):
        if not isinstance(entry.get(key), str):
            return f"has {key} {entry.get(key)!r}; expected text"
    denied = entry.get("denied_share")
    if denied is not None and not (_is_number(denied) and 0 <= denied <= 1):
        return f"has denied_share {denied!r}; expected a number in [0, 1]"
    if entry.get("final") is not None and not isinstance(entry.get("final"), bool):
        return f"has final {entry.get('final')!r}; expected true or false"
    return None


def _is_number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _check_dtype(dtype, function: str) -> None:
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"brick roofline: {function}(dtype=...) must be one of "
                         f"{', '.join(FLOAT_DTYPES)}, got {dtype!r}")


def _measure(dtype: str) -> dict:
    """One measurement of the peaks (see :func:`measure_peaks`), not cached."""
    torch_dtype = getattr(torch, dtype)
    cuda = _backing() == "cuda"
    before = machine.sample()
    sizes = (2048, 4096, 8192) if cuda else (512, 1024, 2048)
    flops_per_s = 0.0
    for n in sizes:
        a = torch.randn(n, n, device="brick").to(torch_dtype)
        b = torch.randn(n, n, device="brick").to(torch_dtype)
        seconds, _ = _best_seconds(lambda: torch.mm(a, b))
        flops_per_s = max(flops_per_s, 2 * n ** 3 / seconds)
    itemsize = torch_dtype.itemsize
    copy_rates = []
    copy_mib = (1, 8, 64, 1024) if cuda else (1, 8, 64, 256)
    for mib in copy_mib:
        src = torch.empty(mib * 2**20 // itemsize, dtype=torch_dtype, device="brick").fill_(1)
        dst = torch.empty_like(src)
        seconds, _ = _best_seconds(lambda: dst.copy_(src))
        copy_rates.append(2 * src.nbytes / seconds)
    # the share of the measurement the thread waited for a CPU: how busy the machine was
    denied = machine.machine_figures(before, machine.sample())["denied_share"]
    return {
        "flops_per_s": flops_per_s,
        "bytes_per_s": max(copy_rates),
        "memory_bytes_per_s": copy_rates[-1],
        "how": (f"measured on brick ({_backing()} backing): the best of 5-40 timings of ~2 ms each "
                f"of {dtype} matmuls {'/'.join(f'{n}x{n}' for n in sizes)} and copies of "
                f"{'/'.join(str(m) for m in copy_mib)} MiB (bytes read plus written)"),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "denied_share": denied,
        "final": denied <= BUSY_SHARE,
        "measurements": 1,
    }


def _best_of(cached: dict, new: dict) -> dict:
    """A provisional entry and a new measurement as one entry: each rate the better of the two
    (a busy machine only ever reads them low), final once either measurement was."""
    merged = dict(new)
    for key in _RATES:
        merged[key] = max(cached[key], new[key])
    merged["denied_share"] = min(cached.get("denied_share", 1.0), new["denied_share"])
    merged["final"] = new["final"] or not provisional(cached)
    previous = cached.get("measurements")
    merged["measurements"] = (previous if isinstance(previous, int) and previous > 0 else 1) + 1
    merged["how"] = f"{new['how']}; the best of {merged['measurements']} measurements"
    return merged


def _store(dtype: str, entry: dict) -> None:
    key = _machine_key(dtype)
    _MEASURED_HERE.add(key)
    path = _cache_path()
    cache = _read_cache(path, quiet=True)
    cache[key] = entry
    temporary = f"{path}.{os.getpid()}.tmp"
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(cache, f, indent=2)
        os.replace(temporary, path)
    except OSError as error:
        try:
            os.unlink(temporary)
        except OSError:
            pass
        _note(f"cannot write the roofline peaks' cache {path}: {error.strerror or error}; the "
              "next process measures them again")


def _read_cache(path: str, quiet: bool = False) -> dict:
    """The cache file's entries by key; {} where there is none, or (with a warning unless
    ``quiet``) where the file cannot be read as one."""
    try:
        with open(path, "rb") as f:
            raw = f.read(MAX_CACHE_BYTES + 1)
    except FileNotFoundError:
        return {}
    except OSError as error:
        problem = f"cannot be read ({error.strerror or error})"
    else:
        problem = None
        if len(raw) > MAX_CACHE_BYTES:
            problem = f"is larger than {MAX_CACHE_BYTES} bytes"
        else:
            try:
                cache = json.loads(raw.decode("utf-8"))
            except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError
                problem = f"is not JSON ({type(error).__name__}: {error})"
            else:
                if isinstance(cache, dict):
                    return cache
                problem = f"holds {type(cache).__name__}, not an object of entries"
    if not quiet:
        _note(f"{path} {problem}; it is ignored and the peaks are measured again")
    return {}


def _note(message: str) -> None:
    warnings.warn(f"brick roofline: {message}", RuntimeWarning, stacklevel=3)
