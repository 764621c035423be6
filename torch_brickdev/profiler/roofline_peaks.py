"""The backing device's peaks for the roofline (:mod:`.roofline`): a matmul's FLOP/s and a copy's
bytes/s, measured on brick itself (the backing device's kernels, through brick's own sync), the
best of several calibrated runs, cached per machine, dtype and thread count in
``$BRICK_ROOFLINE_CACHE`` or ``~/.cache/torch_brickdev/roofline.json``."""

from __future__ import annotations

import json
import os
import platform
import time
from typing import Tuple

import torch

from .. import _C
from . import machine

__all__ = ["FLOAT_DTYPES", "measure_peaks", "peaks"]

FLOAT_DTYPES = ("float32", "float64", "float16", "bfloat16")  # torch's names: torch.<name>


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
    """Measures the backing device's matmul FLOP/s and copy bytes/s in ``dtype`` on brick, and
    caches them for this machine. Returns the cache entry: ``flops_per_s`` (the best square
    matmul of three sizes), ``bytes_per_s`` (the best copy of four sizes, read plus written: in
    cache or in memory, whichever is faster, so that no op's traffic can exceed it) and
    ``memory_bytes_per_s`` (the largest copy's, beyond the caches), with how they were measured."""
    if dtype not in FLOAT_DTYPES:
        raise ValueError(f"brick roofline: measure_peaks(dtype=...) must be one of "
                         f"{', '.join(FLOAT_DTYPES)}, got {dtype!r}")
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
    entry = {
        "flops_per_s": flops_per_s,
        "bytes_per_s": max(copy_rates),
        "memory_bytes_per_s": copy_rates[-1],
        "how": (f"measured on brick ({_backing()} backing): the best of 5-40 timings of ~2 ms each "
                f"of {dtype} matmuls {'/'.join(f'{n}x{n}' for n in sizes)} and copies of "
                f"{'/'.join(str(m) for m in copy_mib)} MiB (bytes read plus written)"),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        # the share of the measurement the thread waited for a CPU: how busy the machine was
        "denied_share": machine.machine_figures(before, machine.sample())["denied_share"],
    }
    path = _cache_path()
    cache = _read_cache(path)
    cache[_machine_key(dtype)] = entry
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        temporary = f"{path}.{os.getpid()}.tmp"
        with open(temporary, "w", encoding="utf-8") as f:
            json.dump(cache, f, indent=2)
        os.replace(temporary, path)
    except OSError:
        pass  # a read-only home: measured again next time
    return entry


def _read_cache(path: str) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            cache = json.load(f)
        return cache if isinstance(cache, dict) else {}
    except (OSError, ValueError):
        return {}


def peaks(dtype: str = "float32") -> dict:
    """This machine's peaks for ``dtype`` (cached; measured once when missing)."""
    entry = _read_cache(_cache_path()).get(_machine_key(dtype))
    valid = isinstance(entry, dict) and all(
        isinstance(entry.get(k), (int, float)) and entry[k] > 0
        for k in ("flops_per_s", "bytes_per_s", "memory_bytes_per_s"))
    return entry if valid else measure_peaks(dtype)
