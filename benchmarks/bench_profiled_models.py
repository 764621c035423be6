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
     [--configurations none,cpu] [--instances 4]

``--instances K`` builds K copies of each configuration's model and rotates through them all; a
configuration's figure is then the geometric mean of its copies' medians, which averages out
where each copy's memory lies (issue 48's brick-against-CPU figure uses ``--configurations
none,cpu --instances 4``).
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


def measure(name: str, rounds: int, configurations=CONFIGURATIONS, instances: int = 1) -> dict:
    """Median ns per configuration, each the geometric mean over its instances' medians.

    Every instance is its own copy of the model: where its memory lies moves a small-op
    workload's time by a few percent on its own (two CPU copies in one process differ by up to
    4 %), so a ratio of one copy to another measures their layouts as much as their devices.
    """
    # Each instance's configurations in turn, every other instance in reverse, both to build
    # the models and to run them: with a rotating order a slot still runs right after the same
    # neighbour, and this keeps that neighbour (and the first model built) from always being one
    # configuration's.
    slots = [(c, i) for i in range(instances)
             for c in (configurations if i % 2 == 0 else configurations[::-1])]
    runs = {c: [None] * instances for c in configurations}
    for c, i in slots:
        runs[c][i] = WORKLOADS[name]("cpu" if c == "cpu" else "brick")
    for c, i in slots:  # warm-up: caches, allocators, the profilers' first-use costs
        timed(runs[c][i], c)
    times = {slot: [] for slot in slots}
    for r in range(rounds):
        order = slots[r % len(slots):] + slots[:r % len(slots)]
        for c, i in order:
            times[(c, i)].append(timed(runs[c][i], c))
    medians = {}
    for c in configurations:
        per_instance = [statistics.median(times[(c, i)]) for i in range(instances)]
        medians[c] = statistics.geometric_mean(per_instance)
        if instances > 1:
            print(f"  {c}: instance medians " + ", ".join(f"{ns / 1e6:.2f}" for ns in per_instance)
                  + " ms")
    return medians


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--only", choices=sorted(WORKLOADS))
    parser.add_argument("--instances", type=int, default=1,
                        help="copies of each configuration's model, rotated with the "
                             "configurations; each figure is the geometric mean of the copies' "
                             "medians (4 for brick against the CPU: a copy's memory layout alone "
                             "moves a small-op workload by a few percent)")
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
    if args.instances < 1:
        parser.error("--instances must be at least 1")
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds in rotating order, medians"
          + (f", {args.instances} instances each (geometric mean)" if args.instances > 1 else ""))
    failed = 0
    for name in ([args.only] if args.only else list(WORKLOADS)):
        medians = measure(name, args.rounds, configurations, args.instances)
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
