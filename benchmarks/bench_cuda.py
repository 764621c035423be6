"""Brick on CUDA: the decode demo on a CUDA-backed brick device against plain ``cuda``, and the
cost of profiling it, side by side in one run, printed as ratios.

Targets (from the CUDA backing issue):
  brick-on-CUDA decode / plain cuda decode:             at most 1.05x the time
  Event-mode profiled throughput / unprofiled:          at least 0.9x
  Event-mode per-op device time vs CUPTI kernel time:   within 5% for ops of 20 us or more
  ... and per brick of a decode (its small kernels):     within 5% or 0.5 us per call
  traced timing (profile(device_timing="traced"), and the legacy profiler under
  set_device_timing("traced")): the same per brick, profiled throughput
  at least 0.9x, and unprofiled speed after the profiles at least 0.98x of before any
Immediate and Deferred modes are printed for comparison.

Needs a GPU and a CUDA build of PyTorch (brick's runtime must be "cuda"); exits 0 with a note
elsewhere. Run: python benchmarks/bench_cuda.py [--rounds N] [--tokens N]
"""

import argparse
import contextlib
import statistics
import sys
import time

import torch

import torch_brickdev
import torch_brickdev.profiler as bp
from torch_brickdev.tools import demo


def decode_seconds(model, config, device, region_factory=None):
    """Wall seconds of one decode of `config.tokens` tokens (device synchronized at both ends)."""
    sync = torch.brick.synchronize if device.startswith("brick") else torch.cuda.synchronize
    sync()
    start = time.perf_counter()
    with torch.no_grad():
        demo.decode(model, config, device, region=region_factory() if region_factory else None)
    sync()
    return time.perf_counter() - start


def cupti_agreement(sizes=(2048, 3072, 4096), repeats=10):
    """(size, brick µs, CUPTI µs) per fp32 matmul size: in one run, each aten::mm timed by brick's
    registry in Event mode and by torch.profiler (CUPTI) as the device time of the kernels it
    launched. An event pair times the stream, so an op queued on an idle stream also holds its
    own launch latency; each size's first call ("first<n>") is left out of both sides, and the
    compared calls ("mm<n>") queue behind work as a busy model's do."""
    inputs = {n: (torch.randn(n, n, device="brick"), torch.randn(n, n, device="brick"))
              for n in sizes}
    for a, b in inputs.values():
        torch.mm(a, b)
    torch.brick.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with bp.profile(sync_mode="event"):
            for n in sizes:
                a, b = inputs[n]
                with torch.autograd.profiler.record_function(f"first{n}"):
                    torch.mm(a, b)
                for _ in range(repeats):
                    with torch.autograd.profiler.record_function(f"mm{n}"):
                        torch.mm(a, b)
            torch.brick.synchronize()
    brick_us = {s.path: s.avg_us() for s in bp.stats(by="path")}
    cupti_us = {n: [] for n in sizes}
    for event in prof.events():
        parent = event.cpu_parent
        if event.name == "aten::mm" and parent is not None and parent.name.startswith("mm"):
            cupti_us[int(parent.name[2:])].append(event.device_time_total)
    for n, times in cupti_us.items():
        if len(times) != repeats:
            raise RuntimeError(f"torch.profiler found {len(times)} aten::mm calls under mm{n}, "
                               f"expected {repeats}")
    return [(n, brick_us[f"mm{n}/aten::mm"], statistics.fmean(cupti_us[n])) for n in sizes]


def device_times_by_path(function_events, paths):
    """torch.profiler's device time and calls per brick path: each event's path is its name
    joined to its enclosing events' (``cpu_parent``), as brick's registry joins a brick's;
    events whose path brick does not have (the profiler's own, the prefill) are left out.
    ``{path: (calls, device µs)}``."""
    found = {}

    def path_of(event):
        names = []
        while event is not None:
            names.append(event.name)
            event = event.cpu_parent
        return "/".join(reversed(names))

    for event in function_events:
        path = path_of(event)
        if path in paths:
            calls, us = found.get(path, (0, 0.0))
            found[path] = (calls + 1, us + event.device_time_total)
    return found


def within_target(us, cupti_us):
    """A brick's device time per call against CUPTI's: within 5 % or 0.5 µs, whichever is
    larger."""
    return abs(us - cupti_us) <= max(0.05 * cupti_us, 0.5)


def decode_agreement(model, config, device="brick:0"):
    """Every brick of one profiled decode, timed by brick's registry in Event mode and by
    torch.profiler (CUPTI: the kernels each call launched) in the same run: rows of (path,
    calls, brick µs per call, CUPTI µs per call, within target). The target: within 5 % or
    0.5 µs per call, whichever is larger. A decode's ops are small kernels on a stream the host
    barely keeps fed, where an event pair can time the launch gap with the kernel."""
    with torch.no_grad():
        demo.decode(model, config, device)  # warm: kernels, pools, caches
    torch.brick.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities) as prof:
        with bp.profile(sync_mode="event") as session, torch.no_grad():
            demo.decode(model, config, device)
        torch.brick.synchronize()
    bricks = {s.path: s for s in session.report.paths if s.kind != "host"}
    cupti = device_times_by_path(prof.events(), set(bricks))
    rows = []
    for path, stats in sorted(bricks.items(), key=lambda item: -item[1].total_ns):
        if path not in cupti:
            continue
        calls, cupti_total_us = cupti[path]
        brick_us, cupti_us = stats.total_ns / 1e3 / stats.count, cupti_total_us / calls
        ok = calls == stats.count and within_target(brick_us, cupti_us)
        rows.append((path, stats.count, calls, brick_us, cupti_us, ok))
    return rows, sorted(set(bricks) - set(cupti))


def traced_decode_times(model, config, device="brick:0"):
    """Every brick of one decode profiled with ``device_timing="traced"`` (CUPTI's records of
    the work each brick queued): ``{path: (calls, µs per call)}``, or None with the reason when
    there is no tracer. A run of its own: CUPTI gives its records to one client, so torch.profiler
    cannot watch the same decode."""
    tracer, why = bp.work_tracer()
    if tracer is None:
        return None, why
    with torch.no_grad():
        demo.decode(model, config, device)
    torch.brick.synchronize()
    with bp.profile(sync_mode="event", device_timing="traced") as session, torch.no_grad():
        demo.decode(model, config, device)
    health = bp.health()
    if health["traced_lost"] or health["timing_failures"]:
        return None, f"the tracer lost work: {health}"
    return {s.path: (s.count, s.total_ns / 1e3 / s.count)
            for s in session.report.paths if s.kind != "host"}, None


def legacy_traced_decode_times(model, config, paths, device="brick:0"):
    """The legacy profiler's device time per op path of one decode with the process's device
    timing traced (``bp.set_device_timing("traced")``: brick's stubs read the work the device
    traced between each op's records): ``{path: (calls, µs per call)}``, or None with the
    reason."""
    tracer, why = bp.work_tracer()
    if tracer is None:
        return None, why
    with torch.no_grad():
        demo.decode(model, config, device)
    torch.brick.synchronize()
    bp.set_device_timing("traced")
    try:
        with torch.autograd.profiler.profile(use_device="brick") as prof, torch.no_grad():
            demo.decode(model, config, device)
    finally:
        bp.set_device_timing("events")
    if bp.health()["stub_failures"]:
        return None, f"the legacy profiler's records failed: {bp.health()}"
    return {path: (calls, us / calls)
            for path, (calls, us) in device_times_by_path(prof.function_events, paths).items()}, None


def per_op_costs(ops=2000):
    """Host µs per small op (a 256-element add, launch-bound) on plain cuda and on brick in each
    sync mode, the profile held open (its start and stop not counted); then a profile's start
    plus stop, and one timing event's record, brick's against PyTorch's."""
    def run(device, factory):
        sync = torch.brick.synchronize if device == "brick" else torch.cuda.synchronize
        x = torch.zeros(256, device=device)
        with (factory() if factory else contextlib.nullcontext()):
            for _ in range(100):  # warm: pools, caches
                x = x + 1
            sync()
            start = time.perf_counter()
            for _ in range(ops):
                x = x + 1
            sync()
            return (time.perf_counter() - start) / ops * 1e6

    rows = {"cuda (plain)": run("cuda", None), "brick, no profiler": run("brick", None)}
    for mode in ("event", "immediate", "deferred"):
        rows[f"brick, {mode}"] = run("brick", lambda mode=mode: bp.profile(sync_mode=mode))
    rows["brick, event, kernels"] = run("brick",
                                        lambda: bp.profile(sync_mode="event", ops="kernels"))
    if bp.work_tracer()[0] is not None:
        rows["brick, event, traced"] = run(
            "brick", lambda: bp.profile(sync_mode="event", device_timing="traced"))
    print(f"Host cost per small op ({ops} adds of 256 floats, profile held open):")
    for name, us in rows.items():
        print(f"  {name:<22}{us:8.2f} us/op  ({us - rows['brick, no profiler']:+7.2f} vs brick)")
    for mode in ("event", "immediate", "deferred"):
        start = time.perf_counter()
        for _ in range(20):
            with bp.profile(sync_mode=mode):
                pass
        print(f"  an empty bp.profile(sync_mode={mode!r}): "
              f"{(time.perf_counter() - start) / 20 * 1e3:.3f} ms to start and stop")
    for name, event_type in (("torch.cuda.Event", torch.cuda.Event),
                             ("torch.brick.Event", torch.brick.Event)):
        event = event_type(enable_timing=True)
        start = time.perf_counter()
        for _ in range(ops):
            event.record()
        elapsed = (time.perf_counter() - start) / ops * 1e6
        event.synchronize()
        print(f"  {name}(enable_timing=True).record(): {elapsed:.2f} us")


def print_decode_table(rows, unmatched, columns):
    """Event mode's device time per brick path against CUPTI's (decode_agreement's rows), with
    a column for each of ``columns`` that ran (``{name: {path: (calls, µs per call)}}``), and
    how many of each are within the target ('!': missed)."""
    print(f"  {'brick path':<50}{'calls':>7}{'CUPTI us':>10}{'event us':>10}{'error':>8}"
          f"{'traced us':>10}{'error':>8}{'legacy us':>10}{'error':>8}")
    missed_by = {name: 0 for name, times in columns.items() if times}
    for path, calls, cupti_calls, brick_us, cupti_us, within in rows:
        error = (brick_us - cupti_us) / cupti_us if cupti_us else float("inf")
        calls_text = str(calls) if calls == cupti_calls else f"{calls}/{cupti_calls}"
        line = (f"  {path[-50:]:<50}{calls_text:>7}{cupti_us:>10.2f}{brick_us:>10.2f}"
                f"{100 * error:>7.1f}%{'' if within else '!'}")
        for name in missed_by:
            column_calls, us = columns[name].get(path, (0, float("nan")))
            column_error = (us - cupti_us) / cupti_us if cupti_us else float("inf")
            column_within = column_calls == cupti_calls and within_target(us, cupti_us)
            missed_by[name] += not column_within
            line += f"{us:>10.2f}{100 * column_error:>7.1f}%{'' if column_within else '!'}"
        print(line)
    missed = sum(not row[-1] for row in rows)
    print(f"  event: {len(rows) - missed} of {len(rows)} bricks within the target; "
          f"{len(unmatched)} brick paths torch.profiler does not have ('!': missed)")
    for name, missed_here in missed_by.items():
        print(f"  {name}: {len(rows) - missed_here} of {len(rows)} within the target")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=None,
                        help="the decode's width (default: the demo's CPU-sized 512); 4096 with "
                             "--heads 32 --kv-heads 8 is a Llama-3-8B-wide layer")
    parser.add_argument("--heads", type=int, default=None)
    parser.add_argument("--kv-heads", type=int, default=None)
    args = parser.parse_args()
    if torch_brickdev.runtime_name() != "cuda":
        print(f"bench_cuda: skipped: {torch_brickdev.runtime_note()}")
        return 0

    sizes = {name: value for name, value in (("hidden", args.hidden), ("heads", args.heads),
                                             ("kv_heads", args.kv_heads)) if value is not None}
    config = demo.DecodeConfig(tokens=args.tokens, **sizes)
    models = {device: demo.build_model(config, device) for device in ("brick:0", "cuda:0")}
    models["cuda:0"].load_state_dict(models["brick:0"].state_dict())
    configurations = {
        "cuda (plain)": ("cuda:0", None),
        "brick, no profiler": ("brick:0", None),
        "brick, event": ("brick:0", lambda: bp.profile(sync_mode="event")),
        # Ops timed at brick's kernels: no RecordFunction on the op path.
        "brick, event, kernels": ("brick:0", lambda: bp.profile(sync_mode="event", ops="kernels")),
        "brick, immediate": ("brick:0", lambda: bp.profile(sync_mode="immediate")),
        "brick, deferred": ("brick:0", lambda: bp.profile(sync_mode="deferred")),
        # For scale: what PyTorch's own profiler (CPU ops + CUPTI kernels) costs plain cuda.
        "cuda, torch.profiler": ("cuda:0", lambda: torch.profiler.profile(activities=[
            torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA])),
    }
    tracer, no_tracer_why = bp.work_tracer()
    if tracer is not None:
        configurations["brick, event, traced"] = (
            "brick:0", lambda: bp.profile(sync_mode="event", device_timing="traced"))
    else:
        print(f"traced device timing: no tracer ({no_tracer_why})")
    # Unprofiled speed before any profile, against after them all (CUPTI left attached slowed
    # unprofiled work in some reports): the same rounds at both ends.
    decode_seconds(models["brick:0"], config, "brick:0")
    never_profiled = [decode_seconds(models["brick:0"], config, "brick:0")
                      for _ in range(args.rounds)]
    for device, factory in configurations.values():  # warm-up: kernels, allocator, pools
        decode_seconds(models[device], config, device, factory)
    times = {name: [] for name in configurations}
    for _ in range(args.rounds):  # interleaved rounds, medians
        for name, (device, factory) in configurations.items():
            times[name].append(decode_seconds(models[device], config, device, factory))
    median = {name: statistics.median(values) for name, values in times.items()}
    after_profiles = [decode_seconds(models["brick:0"], config, "brick:0")
                      for _ in range(args.rounds)]

    print(f"device: {torch.cuda.get_device_name(0)}; torch {torch.__version__}; "
          f"{config.layers} layers, hidden {config.hidden}, {config.tokens} tokens, "
          f"median of {args.rounds} interleaved rounds")
    print(f"{'configuration':<22}{'ms/decode':>11}{'tokens/s':>11}{'vs cuda':>9}{'vs brick':>10}")
    for name, seconds in median.items():
        print(f"{name:<22}{seconds * 1e3:>11.2f}{config.tokens / seconds:>11.1f}"
              f"{seconds / median['cuda (plain)']:>8.3f}x"
              f"{median['brick, no profiler'] / seconds:>9.3f}x")
    overhead = median["brick, no profiler"] / median["cuda (plain)"]
    event_throughput = median["brick, no profiler"] / median["brick, event"]
    ok = True
    print(f"brick-on-CUDA / cuda time: {overhead:.3f}x (target <= 1.05x): "
          f"{'ok' if overhead <= 1.05 else 'MISSED'}")
    ok &= overhead <= 1.05
    print(f"event-profiled throughput / unprofiled: {event_throughput:.3f}x (target >= 0.9x): "
          f"{'ok' if event_throughput >= 0.9 else 'MISSED'}")
    ok &= event_throughput >= 0.9
    print(f"event-profiled throughput / unprofiled, ops at kernels: "
          f"{median['brick, no profiler'] / median['brick, event, kernels']:.3f}x")
    if "brick, event, traced" in median:
        traced_throughput = median["brick, no profiler"] / median["brick, event, traced"]
        print(f"traced-profiled throughput / unprofiled: {traced_throughput:.3f}x "
              f"(target >= 0.9x): {'ok' if traced_throughput >= 0.9 else 'MISSED'}")
    after = statistics.median(never_profiled) / statistics.median(after_profiles)
    print(f"unprofiled speed after the profiles / before any: {after:.3f}x (target >= 0.98x; "
          f"before {statistics.median(never_profiled) * 1e3:.2f} ms, after "
          f"{statistics.median(after_profiles) * 1e3:.2f} ms): "
          f"{'ok' if after >= 0.98 else 'MISSED'}")

    per_op_costs()
    print("Event-mode device time vs CUPTI kernel time (matmul, fp32, each size's first call "
          "left out):")
    for n, brick_us, cupti_us in cupti_agreement():
        error = abs(brick_us - cupti_us) / cupti_us
        verdict = "ok" if error <= 0.05 else "MISSED"
        print(f"  {n}x{n}: brick {brick_us:9.1f} us, CUPTI {cupti_us:9.1f} us, "
              f"difference {100 * error:4.1f}% (target <= 5%): {verdict}")
        ok &= error <= 0.05
    rows, unmatched = decode_agreement(models["brick:0"], config)
    traced, traced_why = traced_decode_times(models["brick:0"], config)
    legacy, legacy_why = legacy_traced_decode_times(models["brick:0"], config,
                                                    {row[0] for row in rows})
    print(f"Device time per brick of one decode against CUPTI's kernel time ({config.tokens} "
          f"tokens; target: within 5% or 0.5 us per call, whichever is larger): Event mode in "
          f"the same run as torch.profiler; traced timing (CUPTI through brick) in a run of its "
          f"own, {'below' if traced else 'not run: ' + str(traced_why)}; the legacy profiler "
          f"traced (brick's stubs), {'below' if legacy else 'not run: ' + str(legacy_why)}")
    print_decode_table(rows, unmatched, {"traced": traced, "legacy traced": legacy})
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
