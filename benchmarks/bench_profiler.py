"""Overhead of brick's profiler, side by side in one run, printed as ratios.

Targets (from the brick profiler issue):
  registry in Event mode:      at most 0.3 us per op over no profiler (Kineto's is 0.9-1.2 us)
  registry disabled:           within 1% of no profiler at all
  report for 100k ops:         at least 100x faster to build than key_averages() on the same run
  torch.profiler's brick device activity: at most 150 ns per op over torch.profiler CPU-only
For comparison it also prints PyTorch's legacy profiler (use_device="brick", and CPU only: the
difference is the cost of brick's ProfilerStubs, whose record() runs twice per op) and
torch.profiler (Kineto: CPU activity, and CPU + BRICK) on the same workload.

The workload is a loop of small brick ops (add, mul, relu on 1k elements); per-op overhead is
(profiled time - unprofiled time) / ops, with the op count taken from the registry itself.
Each configuration runs in interleaved rounds; figures are medians.

Run: python benchmarks/bench_profiler.py [--rounds N] [--iterations N]
(The C++ registry's own start/stop cost is measured by the Google Benchmark program
build/release/registry_bench.)
"""

import argparse
import statistics
import sys
import time

import torch

import torch_brickdev  # noqa: F401
import torch_brickdev.profiler as bp


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


def run_registry(mode):
    def run(a, b, n):
        bp.reset()
        bp.set_sync_mode(mode)
        bp.enable()
        try:
            return timed(lambda: workload(a, b, n))
        finally:
            bp.disable()

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


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--iterations", type=int, default=3000)
    parser.add_argument("--report-ops", type=int, default=100_000)
    args = parser.parse_args()
    a = torch.randn(1000, device="brick")
    b = torch.randn(1000, device="brick")
    configs = {
        "no profiler": run_plain,
        "registry disabled": run_disabled,
        "registry, event mode": run_registry("event"),
        "registry, deferred mode": run_registry("deferred"),
        "registry, immediate mode": run_registry("immediate"),
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
    ops = sum(s.count for s in bp.stats()) // 10 * args.iterations

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

    event_overhead_us = figures["registry, event mode"][1] / 1000
    disabled_ratio = figures["registry disabled"][2]
    print()
    print(f"registry, event mode: {event_overhead_us:.3f} us/op overhead (target <= 0.3 us): "
          f"{'ok' if event_overhead_us <= 0.3 else 'OVER TARGET'}")
    print(f"registry disabled: {disabled_ratio:.4f}x no profiler (target within 1%): "
          f"{'ok' if abs(disabled_ratio - 1) <= 0.01 else 'OUTSIDE TARGET'}")
    legacy_over = figures["legacy autograd profiler (use_device=brick)"][1] / 1000
    legacy_cpu_over = figures["legacy autograd profiler (CPU only)"][1] / 1000
    kineto_over = figures["torch.profiler (Kineto, CPU)"][1] / 1000
    stubs_ns = (legacy_over - legacy_cpu_over) * 1000
    print(f"brick's ProfilerStubs in the legacy profiler: {stubs_ns:.0f} ns/op "
          f"(use_device=brick {legacy_over:.2f} us/op - CPU only {legacy_cpu_over:.2f} us/op)")
    print(f"for comparison: legacy profiler {legacy_over:.2f} us/op, torch.profiler "
          f"{kineto_over:.2f} us/op, registry {event_overhead_us:.3f} us/op "
          f"({kineto_over / max(event_overhead_us, 1e-9):.1f}x less than torch.profiler)")

    if "torch.profiler (Kineto, CPU + BRICK)" in figures:
        device_ns = figures["torch.profiler (Kineto, CPU + BRICK)"][1] - figures[
            "torch.profiler (Kineto, CPU)"][1]
        print(f"brick's device activity in torch.profiler: {device_ns:.0f} ns/op (CPU + BRICK "
              f"minus CPU only; target <= 150 ns): {'ok' if device_ns <= 150 else 'OVER TARGET'}")
    else:
        print(f"brick's device activity in torch.profiler: not available with PyTorch "
              f"{torch.__version__} (needs 2.12+)")

    recorded, brick_ns, legacy_ns = report_build(args.report_ops)
    speedup = legacy_ns / brick_ns
    print(f"\nreport for {recorded:,} recorded ops: registry {brick_ns / 1e6:.2f} ms, "
          f"key_averages() {legacy_ns / 1e6:.1f} ms: {speedup:.0f}x faster (target >= 100x): "
          f"{'ok' if speedup >= 100 else 'UNDER TARGET'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
