"""Overhead of brick's profiler, side by side in one run, printed as ratios.

The floor: any profiler built on RecordFunction pays for PyTorch's RecordFunction machinery as
soon as it registers a global callback. An empty callback (benchmarks/empty_callback.py) measures
that floor in the same run, and brick's own cost is what it adds on top.

Targets (from the hot-path issue), each printed with its verdict:
  registry, event mode (host runtime): at most 100 ns per op over no profiler, and at most 1.5x
                                       the empty callback's overhead; deferred and immediate no
                                       slower than event
  registry disabled:                   within 1% of no profiler at all
  brick's ProfilerStubs:               at most 150 ns per op (legacy profiler with
                                       use_device="brick" minus the legacy profiler CPU-only)
  torch.profiler's brick device activity: at most 150 ns per op over torch.profiler CPU-only
  report for 100k ops:                 at least 100x faster to build than key_averages()
For comparison it also prints torch.profiler (Kineto: CPU activity, and CPU + BRICK) on the same
workload.

Times are noisy on a small shared machine; instruction counts are not. With valgrind installed,
the instructions each configuration adds per op (callgrind, through PyTorch's own
torch.utils.benchmark.Timer.collect_callgrind) are printed beside the times, so a regression of
the op path shows even where times cannot (--no-instructions skips them: ~1 minute each).

The workload is a loop of small brick ops (add, mul, relu on 1k elements); per-op overhead is
(profiled time - unprofiled time) / ops, with the op count taken from the registry itself.
Each configuration runs in interleaved rounds; figures are medians.

Run: python benchmarks/bench_profiler.py [--rounds N] [--iterations N] [--no-instructions]
(The C++ registry's own start/stop cost is measured by the Google Benchmark program
build/release/registry_bench.)
"""

import argparse
import os
import shutil
import statistics
import sys
import time

import torch

import torch_brickdev  # noqa: F401
import torch_brickdev.profiler as bp
from torch_brickdev import _C

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import empty_callback  # noqa: E402


def workload(a, b, iterations):
    for _ in range(iterations):
        c = torch.add(a, b)
        c = torch.mul(c, b)
        torch.relu(c)


def timed(fn):
    start = time.perf_counter_ns()
    fn()
    return time.perf_counter_ns() - start


def run_plain(a, b, n):
    return timed(lambda: workload(a, b, n))


def run_empty_callback(a, b, n):
    module = empty_callback.load()
    module.set_enabled(True)
    try:
        return timed(lambda: workload(a, b, n))
    finally:
        module.set_enabled(False)


def run_registry(mode, ops="dispatcher"):
    def run(a, b, n):
        bp.reset()
        bp.set_sync_mode(mode)
        _C._profiler.set_op_timing(ops)
        bp.enable()
        try:
            return timed(lambda: workload(a, b, n))
        finally:
            bp.disable()
            _C._profiler.set_op_timing("dispatcher")

    return run


def run_disabled(a, b, n):
    # The registry was enabled and disabled before: the op path must be back to no cost.
    bp.enable()
    bp.disable()
    return timed(lambda: workload(a, b, n))


def run_legacy(a, b, n):
    with torch.autograd.profiler.profile(use_device="brick"):
        return timed(lambda: workload(a, b, n))


def run_legacy_cpu(a, b, n):
    with torch.autograd.profiler.profile():
        return timed(lambda: workload(a, b, n))


def run_kineto(a, b, n):
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        return timed(lambda: workload(a, b, n))


def run_kineto_brick(a, b, n):
    # The same, plus brick's device activity (its Kineto child profiler, PyTorch 2.12+).
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.PrivateUse1]
    with torch.profiler.profile(activities=activities):
        return timed(lambda: workload(a, b, n))


def report_build(ops: int):
    """One run recorded by both the legacy profiler and the registry; time each report."""
    a = torch.randn(16, device="brick")
    iterations = ops // 4  # 4 dispatcher ops per iteration
    bp.reset()
    bp.set_sync_mode("event")
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        bp.enable()
        workload(a, a, iterations)
        bp.disable()
    recorded = sum(s.count for s in bp.stats())
    t0 = time.perf_counter_ns()
    report = bp.Report.capture(wall_ns=1, sync_mode="event")
    report.to_json()
    brick_ns = time.perf_counter_ns() - t0
    t0 = time.perf_counter_ns()
    averages = prof.key_averages()
    legacy_ns = time.perf_counter_ns() - t0
    assert {r.key for r in averages} >= {b.name for b in report.bricks}
    return recorded, brick_ns, legacy_ns


_CALLGRIND_SETUP = """
import os, sys
sys.path.insert(0, {bench_dir!r})
import torch
import torch_brickdev
import torch_brickdev.profiler as bp
from torch_brickdev import _C
import empty_callback
a = torch.randn(1000, device="brick")
b = torch.randn(1000, device="brick")
c = torch.randn(1000, device="brick")
def workload(n):
    # In place: no allocation, whose instruction count varies with the heap's state.
    for _ in range(n):
        c.add_(b)
        c.mul_(b)
        c.sub_(a)
{start}
workload(100)
"""

# Ops timed at brick's kernels (profile(ops="kernels")): no RecordFunction on the op path.
KERNELS = "registry, event mode, ops at kernels"

_CALLGRIND_CONFIGS = {
    "no profiler": "",
    "empty RecordFunction callback (the floor)": "empty_callback.load().set_enabled(True)",
    "registry, event mode": "bp.set_sync_mode('event'); bp.enable()",
    "registry, deferred mode": "bp.set_sync_mode('deferred'); bp.enable()",
    KERNELS: "bp.set_sync_mode('event'); torch_brickdev._C._profiler.set_op_timing('kernels'); "
             "bp.enable()",
}


def _stop_profilers():
    # Timer runs the setup once in this process too (a smoke test): undo what it started.
    if bp.is_enabled():
        bp.disable()
    _C._profiler.set_op_timing("dispatcher")
    empty_callback.load().set_enabled(False)


def instructions_per_op(iterations: int = 200, number: int = 5):
    """Instructions per op of each configuration under callgrind (denoised by PyTorch's Timer),
    on an in-place variant of the workload (3 ops per iteration).

    The legacy profiler and torch.profiler are not measured: Kineto does not run under
    valgrind."""
    ops_per_iteration = 3
    from torch.utils.benchmark import Timer

    empty_callback.load()  # compiled here, not under valgrind
    bench_dir = os.path.dirname(os.path.abspath(__file__))
    counts = {}
    for name, start in _CALLGRIND_CONFIGS.items():
        timer = Timer(f"workload({iterations})",
                      setup=_CALLGRIND_SETUP.format(bench_dir=bench_dir, start=start))
        try:
            stats = timer.collect_callgrind(number=number, repeats=1)
        finally:
            _stop_profilers()
        stats = stats[0] if isinstance(stats, tuple) else stats
        counts[name] = stats.counts(denoise=True) / (ops_per_iteration * iterations * number)
    return counts


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--report-ops", type=int, default=100_000)
    parser.add_argument("--no-instructions", action="store_true",
                        help="skip the instruction counts (callgrind)")
    args = parser.parse_args()
    a = torch.randn(1000, device="brick")
    b = torch.randn(1000, device="brick")
    configs = {
        "no profiler": run_plain,
        "empty RecordFunction callback (the floor)": run_empty_callback,
        "registry disabled": run_disabled,
        "registry, event mode": run_registry("event"),
        "registry, deferred mode": run_registry("deferred"),
        "registry, immediate mode": run_registry("immediate"),
        KERNELS: run_registry("event", ops="kernels"),
        "legacy autograd profiler (use_device=brick)": run_legacy,
        "legacy autograd profiler (CPU only)": run_legacy_cpu,
        "torch.profiler (Kineto, CPU)": run_kineto,
    }
    if bp.kineto_available():
        configs["torch.profiler (Kineto, CPU + BRICK)"] = run_kineto_brick
    for run in configs.values():  # warm up
        run(a, b, args.iterations // 10)
    bp.reset()
    bp.enable()
    workload(a, b, 10)
    bp.disable()
    # Ops the dispatcher runs per iteration (relu runs aten::relu and aten::clamp_min).
    ops_per_iteration = sum(s.count for s in bp.stats()) // 10
    ops = ops_per_iteration * args.iterations

    samples = {name: [] for name in configs}
    for _ in range(args.rounds):
        for name, run in configs.items():
            samples[name].append(run(a, b, args.iterations))
    base = statistics.median(samples["no profiler"])
    print(f"torch {torch.__version__}; workload: {ops:,} small brick ops per run; "
          f"median of {args.rounds} interleaved rounds\n")
    print(f"{'configuration':<46}{'ns/op':>9}{'overhead ns/op':>16}{'vs none':>9}")
    figures = {}
    for name in configs:
        med = statistics.median(samples[name])
        per_op = med / ops
        overhead = (med - base) / ops
        figures[name] = (per_op, overhead, med / base)
        print(f"{name:<46}{per_op:>9.1f}{overhead:>16.1f}{med / base:>8.3f}x")

    def verdict(ok):
        return "ok" if ok else "OVER TARGET"

    floor_ns = figures["empty RecordFunction callback (the floor)"][1]
    event_ns = figures["registry, event mode"][1]
    print()
    print(f"empty RecordFunction callback (the floor): {floor_ns:.0f} ns/op")
    print(f"registry, event mode: {event_ns:.0f} ns/op over no profiler (target <= 100 ns): "
          f"{verdict(event_ns <= 100)}; {event_ns / floor_ns:.2f}x the floor (target <= 1.5x): "
          f"{verdict(event_ns <= 1.5 * floor_ns)}")
    for mode in ("deferred", "immediate"):
        ns = figures[f"registry, {mode} mode"][1]
        print(f"registry, {mode} mode: {ns:.0f} ns/op, {ns / floor_ns:.2f}x the floor, "
              f"{ns - event_ns:+.0f} ns/op vs event mode")
    kernels_ns = figures[KERNELS][1]
    print(f"{KERNELS}: {kernels_ns:.0f} ns/op, {kernels_ns / floor_ns:.2f}x the floor, "
          f"{kernels_ns - event_ns:+.0f} ns/op vs the dispatcher's (per op the dispatcher runs)")
    disabled_ratio = figures["registry disabled"][2]
    print(f"registry disabled: {disabled_ratio:.4f}x no profiler (target within 1%): "
          f"{'ok' if abs(disabled_ratio - 1) <= 0.01 else 'OUTSIDE TARGET'}")
    legacy_over = figures["legacy autograd profiler (use_device=brick)"][1]
    legacy_cpu_over = figures["legacy autograd profiler (CPU only)"][1]
    kineto_over = figures["torch.profiler (Kineto, CPU)"][1]
    stubs_ns = legacy_over - legacy_cpu_over
    print(f"brick's ProfilerStubs in the legacy profiler: {stubs_ns:.0f} ns/op (use_device=brick "
          f"{legacy_over:.0f} ns/op - CPU only {legacy_cpu_over:.0f} ns/op; target <= 150 ns): "
          f"{verdict(stubs_ns <= 150)}")
    print(f"for comparison: legacy profiler {legacy_over:.0f} ns/op, torch.profiler "
          f"{kineto_over:.0f} ns/op, registry {event_ns:.0f} ns/op "
          f"({kineto_over / max(event_ns, 1e-9):.1f}x less than torch.profiler)")

    if "torch.profiler (Kineto, CPU + BRICK)" in figures:
        device_ns = figures["torch.profiler (Kineto, CPU + BRICK)"][1] - figures[
            "torch.profiler (Kineto, CPU)"][1]
        print(f"brick's device activity in torch.profiler: {device_ns:.0f} ns/op (CPU + BRICK "
              f"minus CPU only; target <= 150 ns): {'ok' if device_ns <= 150 else 'OVER TARGET'}")
    else:
        print(f"brick's device activity in torch.profiler: not available with PyTorch "
              f"{torch.__version__} (needs 2.12+)")

    if args.no_instructions:
        pass
    elif shutil.which("valgrind") is None:
        print("\ninstructions per op: not measured (valgrind is not installed)")
    else:
        counts = instructions_per_op()
        base_count = counts["no profiler"]
        floor_count = counts["empty RecordFunction callback (the floor)"] - base_count
        print(f"\ninstructions per op (callgrind, in-place workload; the same on any machine; "
              f"the time column is this run's median on the timed workload):")
        print(f"{'configuration':<46}{'instr/op':>10}{'over none':>11}{'vs floor':>10}"
              f"{'ns over none':>14}")
        for name, count in counts.items():
            over = count - base_count
            ratio = f"{over / floor_count:.2f}x" if name != "no profiler" else ""
            print(f"{name:<46}{count:>10.0f}{over:>11.0f}{ratio:>10}{figures[name][1]:>14.0f}")

    recorded, brick_ns, legacy_ns = report_build(args.report_ops)
    speedup = legacy_ns / brick_ns
    print(f"\nreport for {recorded:,} recorded ops: registry {brick_ns / 1e6:.2f} ms, "
          f"key_averages() {legacy_ns / 1e6:.1f} ms: {speedup:.0f}x faster (target >= 100x): "
          f"{'ok' if speedup >= 100 else 'UNDER TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
