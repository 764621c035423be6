"""What profiling costs on real models, side by side in one run, printed as ratios with targets.

Workloads, on brick, one intra-op thread: transformers' Qwen2 (tiny config) greedy ``generate()``
of 16 tokens, and the demo's decode (32 steps of its Qwen-style decoder). Each runs under:

  none            no profiler
  registry        brick's registry, ``bp.profile()`` (event mode; ops timed at the dispatcher)
  registry-kernels  ``bp.profile(ops="kernels")``: ops timed at brick's kernels
  kineto-cpu      ``torch.profiler.profile(activities=[CPU])``
  kineto-brick    ``torch.profiler.profile(activities=[CPU, PrivateUse1])`` (brick's activity)
  legacy-cpu      ``torch.autograd.profiler.profile()``
  legacy-brick    ``torch.autograd.profiler.profile(use_device="brick")`` (brick's stubs)
  floor           an empty RecordFunction callback (benchmarks/empty_callback.py): what any
                  RecordFunction-based profiler pays before doing anything
  cpu             the same workload on the CPU, no profiler (brick's own cost without one)

Rounds rotate the order of the configurations; ``gc.collect()`` runs before each timed run, so
one profiler's garbage is not collected inside the next; figures are medians of the rounds.
The targets are issue 29's (profilers) and issue 48's (brick against the CPU); each ratio is
printed with its verdict.

Run: python benchmarks/bench_profiled_models.py [--rounds N] [--only qwen2|demo]
     [--configurations none,cpu]
"""

import argparse
import contextlib
import gc
import os
import statistics
import sys
import time
import warnings

import torch

import torch_brickdev  # noqa: F401  (registers brick)
from torch_brickdev import profiler as bp
from torch_brickdev.tools.quiet_kineto import QuietProfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # empty_callback, beside this file

CONFIGURATIONS = ("none", "floor", "registry", "registry-kernels", "kineto-cpu", "kineto-brick",
                  "legacy-cpu", "legacy-brick", "cpu")

# (numerator, denominator, target): the ratios issue 29 sets, per workload, and issue 48's brick
# against the CPU without a profiler
TARGETS = {
    "qwen2": [("registry", "none", 1.03), ("registry-kernels", "none", 1.03),
              ("registry", "floor", None), ("kineto-brick", "kineto-cpu", 1.02),
              ("legacy-brick", "legacy-cpu", 1.02), ("none", "cpu", 1.03)],
    "demo": [("registry", "none", 1.02), ("registry-kernels", "none", 1.02),
             ("registry", "floor", None), ("kineto-brick", "kineto-cpu", 1.02),
             ("legacy-brick", "legacy-cpu", 1.02), ("none", "cpu", 1.03)],
}


@contextlib.contextmanager
def empty_callback():
    import empty_callback as floor

    module = floor.load()
    module.set_enabled(True)
    try:
        yield
    finally:
        module.set_enabled(False)


def region(configuration: str):
    activities = torch.profiler.ProfilerActivity
    if configuration == "floor":
        return empty_callback()
    if configuration == "registry":
        return bp.profile()
    if configuration == "registry-kernels":
        return bp.profile(ops="kernels")
    # Kineto's start/stop notices (stderr) are dropped alike for every configuration it runs
    # (the legacy profiler runs on Kineto too).
    if configuration == "kineto-cpu":
        return QuietProfile(torch.profiler.profile(activities=[activities.CPU]))
    if configuration == "kineto-brick":
        return QuietProfile(torch.profiler.profile(activities=[activities.CPU,
                                                               activities.PrivateUse1]))
    if configuration == "legacy-cpu":
        return QuietProfile(torch.autograd.profiler.profile())
    if configuration == "legacy-brick":
        return QuietProfile(torch.autograd.profiler.profile(use_device="brick"))
    return contextlib.nullcontext()


def qwen2_workload(device: str):
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(device).eval()
    ids = torch.randint(3, 256, (1, 8), device=device)

    def run():
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=16, min_new_tokens=16, do_sample=False,
                                 pad_token_id=0)
        return out

    return run


def demo_workload(device: str):
    from torch_brickdev.tools.demo.config import DecodeConfig
    from torch_brickdev.tools.demo.decoding import _decode
    from torch_brickdev.tools.demo.model import build_model

    config = DecodeConfig(tokens=32)
    model = build_model(config, device)
    target = torch.device(device)

    def run():
        return _decode(model, config, target)

    return run


WORKLOADS = {"qwen2": qwen2_workload, "demo": demo_workload}


def timed(run, configuration: str) -> int:
    gc.collect()
    start = time.perf_counter_ns()
    with region(configuration):
        run()
    if configuration != "cpu":
        torch.brick.synchronize()
    return time.perf_counter_ns() - start


def measure(name: str, rounds: int, configurations=CONFIGURATIONS) -> dict:
    runs = {c: WORKLOADS[name]("cpu" if c == "cpu" else "brick") for c in configurations}
    for c in configurations:  # warm-up: caches, allocators, the profilers' first-use costs
        timed(runs[c], c)
    times = {c: [] for c in configurations}
    for r in range(rounds):
        order = configurations[r % len(configurations):] + configurations[:r % len(configurations)]
        for c in order:
            times[c].append(timed(runs[c], c))
    return {c: statistics.median(t) for c, t in times.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", choices=sorted(WORKLOADS))
    parser.add_argument("--configurations", default=",".join(CONFIGURATIONS),
                        help="comma-separated subset to run (e.g. none,cpu: brick against the "
                             "CPU alone)")
    args = parser.parse_args()
    configurations = tuple(args.configurations.split(","))
    unknown = sorted(set(configurations) - set(CONFIGURATIONS))
    if unknown or not configurations:
        parser.error(f"unknown configurations {unknown}; expected some of {', '.join(CONFIGURATIONS)}")
    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # the profilers' notices are not this benchmark's output
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds in rotating order, medians")
    failed = 0
    for name in ([args.only] if args.only else list(WORKLOADS)):
        medians = measure(name, args.rounds, configurations)
        print(f"\n{name}: " + ", ".join(f"{c} {ns / 1e6:.2f} ms" for c, ns in medians.items()))
        for numerator, denominator, target in TARGETS[name]:
            if numerator not in medians or denominator not in medians:
                continue
            ratio = medians[numerator] / medians[denominator]
            if target is None:  # for reading, not a target
                print(f"  {numerator:>16} / {denominator:<11} {ratio:6.3f}x")
                continue
            ok = ratio <= target
            failed += not ok
            print(f"  {numerator:>16} / {denominator:<11} {ratio:6.3f}x  target {target:.2f}x  "
                  f"{'ok' if ok else 'OVER TARGET'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
