"""Concurrency stress of brick's profiler registry: exact counts across resets.

Requirement (the reliability issue): 8 threads each running 100k brick ops inside nested ranges,
with the registry on, while another thread snapshots and resets: no crash, no deadlock, and the
counts exact (completed bricks == calls made, accounting for the resets).

Each worker thread runs ``x.add_(y)`` on brick tensors (one op brick per call) inside three
nested ``record_function`` ranges: "worker" (its whole loop), "block" (every 100 ops) and "step"
(every 10 ops). Meanwhile a monitor thread loops: reset(), then a few stats() + health() readings.
Between two resets no brick's count may go down, health()["discarded_by_reset"] never goes down,
and (on the host runtime, where a brick is recorded before its op returns) every call completed
before a reading is either in stats() or discarded, none twice. Afterwards, exactly:

    sum of the counts in stats() + health()["discarded_by_reset"] == ops + ranges made

Prints a short table; exits 1 if the counts are not exact or a check failed, 2 on a deadlock.

Run: python benchmarks/stress_concurrency.py [--threads 8] [--ops 100000] [--timeout 600]
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time

import torch

import torch_brickdev
import torch_brickdev.profiler as bp

record_function = torch.autograd.profiler.record_function

OPS_PER_BLOCK = 100
OPS_PER_STEP = 10
READINGS_PER_RESET = 3


def run(threads: int = 8, ops: int = 100_000, timeout_s: float = 600.0) -> dict:
    """Runs the stress and returns its figures (see the module documentation)."""
    if bp.is_enabled():
        raise RuntimeError("stress_concurrency: the brick profiler is already enabled")
    # The host runtime records a brick before its op returns, so live readings can be bounded.
    bounded_readings = torch_brickdev.runtime_name() == "host"
    xs = [torch.zeros(16, device="brick") for _ in range(threads)]
    ys = [torch.ones(16, device="brick") for _ in range(threads)]
    ops_made = [0] * threads
    ranges_made = [0] * threads
    errors: list = []
    violations: list = []
    finished = [False] * threads
    start_line = threading.Barrier(threads + 1)
    monitor_figures = {"resets": 0, "snapshots": 0}

    def calls_made() -> int:
        return sum(ops_made) + sum(ranges_made)

    def worker(index: int) -> None:
        try:
            x, y = xs[index], ys[index]
            start_line.wait()
            with record_function("worker"):
                while ops_made[index] < ops:
                    with record_function("block"):
                        for _ in range(OPS_PER_BLOCK // OPS_PER_STEP):
                            left = ops - ops_made[index]
                            if left <= 0:
                                break
                            with record_function("step"):
                                for _ in range(min(OPS_PER_STEP, left)):
                                    x.add_(y)
                                    ops_made[index] += 1
                            ranges_made[index] += 1
                    ranges_made[index] += 1
            ranges_made[index] += 1
            # Outstanding device events (an asynchronous runtime) resolve on their own thread.
            bp.stats()
        except BaseException as error:  # reported by the main thread
            errors.append(f"worker {index}: {error!r}")
        finally:
            finished[index] = True

    def monitor(discarded_at_start: int) -> None:
        try:
            start_line.wait()
            highest_discarded = 0
            while True:  # while workers run, at least once
                bp.reset()
                monitor_figures["resets"] += 1
                previous: dict = {}
                for _ in range(READINGS_PER_RESET):
                    made_before = calls_made()
                    snapshot = bp.stats(by="path")
                    discarded = bp.health()["discarded_by_reset"] - discarded_at_start
                    made_after = calls_made()
                    monitor_figures["snapshots"] += 1
                    # Hand the GIL over: the workers' ops release it while they run and must get
                    # it back; a monitor spinning in Python would starve them (a GIL convoy).
                    time.sleep(0)
                    for brick in snapshot:
                        if brick.count < previous.get(brick.path, 0):
                            violations.append(f"count of {brick.path} went down between resets: "
                                              f"{previous[brick.path]} -> {brick.count}")
                        previous[brick.path] = brick.count
                    if discarded < highest_discarded:
                        violations.append(f"discarded_by_reset went down: "
                                          f"{highest_discarded} -> {discarded}")
                    highest_discarded = max(highest_discarded, discarded)
                    live = sum(brick.count for brick in snapshot)
                    # At most one call per worker is recorded but not yet added to calls_made().
                    in_bounds = made_before <= live + discarded <= made_after + threads
                    if bounded_readings and not in_bounds:
                        violations.append(f"reading out of bounds: made {made_before}.."
                                          f"{made_after}, live {live} + discarded {discarded}")
                if all(finished):
                    return
        except BaseException as error:
            errors.append(f"monitor: {error!r}")

    bp.reset()
    discarded_at_start = bp.health()["discarded_by_reset"]
    health_at_start = bp.health()
    workers = [threading.Thread(target=worker, args=(i,), name=f"stress-worker-{i}", daemon=True)
               for i in range(threads)]
    monitor_thread = threading.Thread(target=monitor, args=(discarded_at_start,),
                                      name="stress-monitor", daemon=True)
    bp.enable("event")
    try:
        started = time.perf_counter()
        for thread in workers + [monitor_thread]:
            thread.start()
        deadline = started + timeout_s
        for thread in workers + [monitor_thread]:
            thread.join(max(0.0, deadline - time.perf_counter()))
        wall_s = time.perf_counter() - started
        stuck = [t.name for t in workers + [monitor_thread] if t.is_alive()]
    finally:
        bp.disable()

    final = bp.stats(by="path")
    health = bp.health()
    ops_total, ranges_total = sum(ops_made), sum(ranges_made)
    recorded = {kind: sum(b.count for b in final if b.kind == kind) for kind in ("op", "range")}
    discarded = health["discarded_by_reset"] - discarded_at_start
    wrong_values = [i for i, x in enumerate(xs) if not bool((x == ops_made[i]).all())]
    if wrong_values:
        errors.append(f"workers {wrong_values}: x != the number of add_ calls made")
    for key in ("timing_failures", "unbalanced_exits"):
        if health[key] != health_at_start[key]:
            errors.append(f"health()[{key!r}] went from {health_at_start[key]} to {health[key]}")
    return {
        "threads": threads,
        "ops_per_thread": ops,
        "ops": ops_total,
        "ranges": ranges_total,
        "calls": ops_total + ranges_total,
        "expected_calls": threads * ops + threads * (1 + -(-ops // OPS_PER_BLOCK)
                                                     + -(-ops // OPS_PER_STEP)),
        "resets": monitor_figures["resets"],
        "snapshots": monitor_figures["snapshots"],
        "recorded_ops": recorded["op"],
        "recorded_ranges": recorded["range"],
        "recorded": recorded["op"] + recorded["range"],
        "discarded": discarded,
        "exact": recorded["op"] + recorded["range"] + discarded == ops_total + ranges_total,
        "wall_s": wall_s,
        "stuck": stuck,
        "errors": errors,
        "violations": violations,
        "health": health,
    }


def print_table(r: dict) -> None:
    rows = [
        ("threads", f"{r['threads']}"),
        ("ops per thread", f"{r['ops_per_thread']:,}"),
        ("calls made (ops + ranges)", f"{r['calls']:,} ({r['ops']:,} + {r['ranges']:,})"),
        ("snapshots / resets taken", f"{r['snapshots']:,} / {r['resets']:,}"),
        ("recorded after last reset (ops + ranges)",
         f"{r['recorded']:,} ({r['recorded_ops']:,} + {r['recorded_ranges']:,})"),
        ("discarded by resets", f"{r['discarded']:,}"),
        ("recorded + discarded", f"{r['recorded'] + r['discarded']:,}"),
        ("exact", "yes" if r["exact"] else "NO"),
        ("wall time", f"{r['wall_s']:.2f} s"),
        ("ops/s (all threads)", f"{r['ops'] / r['wall_s']:,.0f}"),
    ]
    width = max(len(name) for name, _ in rows)
    for name, value in rows:
        print(f"{name:<{width}}  {value}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=8)
    parser.add_argument("--ops", type=int, default=100_000, help="brick ops per thread")
    parser.add_argument("--timeout", type=float, default=600.0,
                        help="seconds before the run counts as deadlocked")
    args = parser.parse_args()
    if args.threads < 1 or args.ops < 1:
        parser.error("--threads and --ops must be at least 1")
    print(f"torch {torch.__version__}; brick runtime: {torch_brickdev.runtime_name()}; "
          f"registry in event mode; {args.threads} threads x {args.ops:,} ops "
          f"in nested record_function ranges, one thread snapshotting and resetting")
    result = run(args.threads, args.ops, args.timeout)
    print_table(result)
    if result["stuck"]:
        print(f"DEADLOCK: still running after {args.timeout:.0f} s: {', '.join(result['stuck'])}")
        sys.stdout.flush()
        return 2
    for problem in result["errors"] + result["violations"][:20]:
        print(f"FAILED: {problem}")
    if result["calls"] != result["expected_calls"]:
        print(f"FAILED: {result['calls']:,} calls made, {result['expected_calls']:,} planned")
        return 1
    ok = result["exact"] and not result["errors"] and not result["violations"]
    return 0 if ok else 1


if __name__ == "__main__":
    code = main()
    if code == 2:  # a deadlocked thread must not hold the interpreter's exit up
        sys.stdout.flush()
        os._exit(code)
    sys.exit(code)
