"""Brick on CUDA: the decode demo on a CUDA-backed brick device against plain ``cuda``, and the
cost of profiling it, side by side in one run, printed as ratios.

Targets (from the CUDA backing issue):
  brick-on-CUDA decode / plain cuda decode:             at most 1.05x the time
  Event-mode profiled throughput / unprofiled:          at least 0.9x
  Event-mode per-op device time vs CUPTI kernel time:   within 5% for ops of 20 us or more
Immediate and Deferred modes are printed for comparison.

Needs a GPU and a CUDA build of PyTorch (brick's runtime must be "cuda"); exits 0 with a note
elsewhere. Run: python benchmarks/bench_cuda.py [--rounds N] [--tokens N]
"""

import argparse
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
    launched (rows grouped by input shape)."""
    inputs = {n: (torch.randn(n, n, device="brick"), torch.randn(n, n, device="brick"))
              for n in sizes}
    for a, b in inputs.values():
        torch.mm(a, b)
    torch.brick.synchronize()
    activities = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=activities, record_shapes=True) as prof:
        with bp.profile(sync_mode="event"):
            for n in sizes:
                a, b = inputs[n]
                for _ in range(repeats):
                    with torch.autograd.profiler.record_function(f"mm{n}"):
                        torch.mm(a, b)
            torch.brick.synchronize()
    brick_us = {s.path: s.avg_us() for s in bp.stats(by="path")}
    cupti_us = {}
    for row in prof.key_averages(group_by_input_shape=True):
        if row.key == "aten::mm" and row.input_shapes and row.input_shapes[0] in ([n, n] for n in sizes):
            cupti_us[row.input_shapes[0][0]] = row.device_time_total / row.count
    return [(n, brick_us[f"mm{n}/aten::mm"], cupti_us[n]) for n in sizes]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()
    if torch_brickdev.runtime_name() != "cuda":
        print(f"bench_cuda: skipped: {torch_brickdev.runtime_note()}")
        return 0

    config = demo.DecodeConfig(tokens=args.tokens)
    models = {device: demo.build_model(config, device) for device in ("brick:0", "cuda:0")}
    models["cuda:0"].load_state_dict(models["brick:0"].state_dict())
    configurations = {
        "cuda (plain)": ("cuda:0", None),
        "brick, no profiler": ("brick:0", None),
        "brick, event": ("brick:0", lambda: bp.profile(sync_mode="event")),
        "brick, immediate": ("brick:0", lambda: bp.profile(sync_mode="immediate")),
        "brick, deferred": ("brick:0", lambda: bp.profile(sync_mode="deferred")),
    }
    for device, factory in configurations.values():  # warm-up: kernels, allocator, pools
        decode_seconds(models[device], config, device, factory)
    times = {name: [] for name in configurations}
    for _ in range(args.rounds):  # interleaved rounds, medians
        for name, (device, factory) in configurations.items():
            times[name].append(decode_seconds(models[device], config, device, factory))
    median = {name: statistics.median(values) for name, values in times.items()}

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

    print("Event-mode device time vs CUPTI kernel time (matmul, fp32):")
    for n, brick_us, cupti_us in cupti_agreement():
        error = abs(brick_us - cupti_us) / cupti_us
        verdict = "ok" if error <= 0.05 else "MISSED"
        print(f"  {n}x{n}: brick {brick_us:9.1f} us, CUPTI {cupti_us:9.1f} us, "
              f"difference {100 * error:4.1f}% (target <= 5%): {verdict}")
        ok &= error <= 0.05
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
