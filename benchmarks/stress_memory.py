"""Memory stress of brick's profiler: 1M profiled ops in event mode stay bounded.

Requirement (the reliability issue): 1 million profiled ops in Event mode: resident memory and
the event pool stay bounded (print start, peak and end).

Runs ``x.add_(y)`` on brick tensors, each 1000 inside a ``record_function`` range, with the
registry enabled in event mode and never reset. Every 50k ops it samples the resident set size
(/proc/self/statm), ``health()["live_events"]`` (the device events the profiler holds, pooled or
in use) and the registry's bricks (``stats(by="path")``). After the warm-up (the first 100k ops)
RSS must grow by less than --max-growth-mib and live_events must not grow at all; the exit
status is 1 otherwise.

``--legacy-ops N`` also runs N ops under PyTorch's legacy profiler
(``torch.autograd.profiler.profile(use_device="brick")``) and prints its RSS growth. That
profiler keeps every event in memory until it exits, so its growth is expected and not checked.

Run: python benchmarks/stress_memory.py [--ops 1000000] [--sample-every 50000]
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time

import torch

import torch_brickdev
import torch_brickdev.profiler as bp

record_function = torch.autograd.profiler.record_function

OPS_PER_RANGE = 1000
MIB = 1024 * 1024
_PAGE_SIZE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def rss_bytes() -> int:
    """The process's resident set size now (Linux /proc; psutil elsewhere)."""
    try:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * _PAGE_SIZE
    except OSError:
        import psutil  # not on Linux: needs psutil

        return psutil.Process().memory_info().rss


def run_ops(x: torch.Tensor, y: torch.Tensor, count: int) -> None:
    """`count` add_ ops, each OPS_PER_RANGE of them inside one record_function range."""
    while count > 0:
        n = min(OPS_PER_RANGE, count)
        with record_function("chunk"):
            for _ in range(n):
                x.add_(y)
        count -= n


def sample(ops_done: int) -> dict:
    bricks = bp.stats(by="path")
    return {
        "ops": ops_done,
        "rss": rss_bytes(),
        "live_events": bp.health()["live_events"],
        "bricks": len(bricks),
        "recorded_ops": sum(b.count for b in bricks if b.kind == "op"),
    }


def run(ops: int = 1_000_000, sample_every: int = 50_000, warmup: int = 100_000) -> dict:
    """Runs `ops` profiled ops (registry on, event mode, no reset) and returns the samples."""
    if bp.is_enabled():
        raise RuntimeError("stress_memory: the brick profiler is already enabled")
    x = torch.zeros(64, device="brick")
    y = torch.ones(64, device="brick")
    gc.collect()
    bp.reset()
    samples = [sample(0)]
    bp.enable("event")
    started = time.perf_counter()
    try:
        done = 0
        while done < ops:
            n = min(sample_every, ops - done)
            run_ops(x, y, n)
            done += n
            samples.append(sample(done))
    finally:
        bp.disable()
    wall_s = time.perf_counter() - started
    torch.brick.synchronize()
    # The last sample must see every op (a float32 counts exactly up to 2^24).
    values_right = ops > 2**24 or float(x[0]) == ops
    after_warmup = [s for s in samples if s["ops"] >= min(warmup, ops)]
    base = after_warmup[0]
    return {
        "ops": ops,
        "wall_s": wall_s,
        "samples": samples,
        "warmup": base["ops"],
        "rss_growth_after_warmup": max(s["rss"] for s in after_warmup) - base["rss"],
        "live_events_growth_after_warmup": max(s["live_events"] for s in after_warmup)
        - base["live_events"],
        "all_ops_recorded": samples[-1]["recorded_ops"] == ops and values_right,
        "health": bp.health(),
    }


def run_legacy(ops: int) -> dict:
    """`ops` ops under PyTorch's legacy profiler: RSS before, at the end inside it, and after."""
    x = torch.zeros(64, device="brick")
    y = torch.ones(64, device="brick")
    gc.collect()
    before = rss_bytes()
    with torch.autograd.profiler.profile(use_device="brick"):
        run_ops(x, y, ops)
        inside = rss_bytes()
    gc.collect()
    return {"ops": ops, "before": before, "inside": inside, "after": rss_bytes()}


def mib(n: int) -> str:
    return f"{n / MIB:.1f} MiB"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--sample-every", type=int, default=50_000)
    parser.add_argument("--warmup", type=int, default=100_000,
                        help="ops before the bounds apply (allocator and pool warm-up)")
    parser.add_argument("--max-growth-mib", type=float, default=16.0,
                        help="RSS growth allowed after the warm-up")
    parser.add_argument("--legacy-ops", type=int, default=0,
                        help="also run this many ops under the legacy profiler (not bounded)")
    parser.add_argument("--verbose", action="store_true", help="print every sample")
    args = parser.parse_args()
    if args.ops < 1 or args.sample_every < 1:
        parser.error("--ops and --sample-every must be at least 1")
    print(f"torch {torch.__version__}; brick runtime: {torch_brickdev.runtime_name()}; "
          f"{args.ops:,} profiled brick ops, registry in event mode, sampled every "
          f"{args.sample_every:,} ops")
    r = run(args.ops, args.sample_every, args.warmup)
    samples = r["samples"]
    if args.verbose:
        print(f"{'ops':>10} {'RSS':>12} {'live_events':>12} {'bricks':>7}")
        for s in samples:
            print(f"{s['ops']:>10,} {mib(s['rss']):>12} {s['live_events']:>12} {s['bricks']:>7}")
    for key, label, fmt in (("rss", "RSS", mib), ("live_events", "live_events", str),
                            ("bricks", "registry bricks", str)):
        values = [s[key] for s in samples]
        print(f"{label:<16} start {fmt(values[0]):>10}   peak {fmt(max(values)):>10}   "
              f"end {fmt(values[-1]):>10}")
    growth_ok = r["rss_growth_after_warmup"] < args.max_growth_mib * MIB
    events_ok = r["live_events_growth_after_warmup"] <= 0
    print(f"after {r['warmup']:,} ops of warm-up: RSS grew {mib(r['rss_growth_after_warmup'])} "
          f"(bound {args.max_growth_mib:g} MiB): {'ok' if growth_ok else 'FAILED'}; "
          f"live_events grew {r['live_events_growth_after_warmup']}: "
          f"{'ok' if events_ok else 'FAILED'}")
    print(f"every op recorded: {'yes' if r['all_ops_recorded'] else 'NO'}; "
          f"wall time {r['wall_s']:.2f} s, {args.ops / r['wall_s']:,.0f} ops/s")
    if args.legacy_ops > 0:
        legacy = run_legacy(args.legacy_ops)
        print(f"legacy profiler (keeps every event; not bounded, not checked), {args.legacy_ops:,} "
              f"ops: RSS {mib(legacy['before'])} before, {mib(legacy['inside'])} at its end "
              f"(+{mib(legacy['inside'] - legacy['before'])}), {mib(legacy['after'])} after")
    return 0 if growth_ok and events_ok and r["all_ops_recorded"] else 1


if __name__ == "__main__":
    sys.exit(main())
