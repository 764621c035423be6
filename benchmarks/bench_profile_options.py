"""What the profile's options cost: ``profile(modules=True)`` and ``profile(record_shapes=True)``
against ``profile()`` on the same forward, side by side in one run: per module call, per op call.

The workload is transformers' Qwen2 (tiny config, 2 layers: 29 module calls per forward) on
brick, one thread, and an MLP of many small Linear layers (the worst case: little work per
module, per op). Each configuration runs in interleaved rounds after ``gc.collect()``; figures
are medians. Per call: (time with the option - time without) / calls, the calls (module calls;
op calls) counted by the report itself.

Run: python benchmarks/bench_profile_options.py [--rounds N] [--iterations N]
"""

import argparse
import gc
import statistics
import time

import torch
from torch import nn

import torch_brickdev  # noqa: F401
from torch_brickdev import profiler as bp


def qwen2():
    import transformers

    config = transformers.Qwen2Config(
        vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to("brick").eval()
    return model, torch.randint(3, 256, (1, 16), device="brick")


def mlp():
    torch.manual_seed(0)
    layers = []
    for _ in range(32):
        layers += [nn.Linear(32, 32), nn.ReLU()]
    return nn.Sequential(*layers).to("brick"), torch.randn(4, 32, device="brick")


# option -> (profile() arguments, what its cost is per, the report's count of those calls)
OPTIONS = {
    "modules": ({"modules": True}, "module call",
                lambda report: sum(r["calls"] for r in report.module_times())),
    "record_shapes": ({"record_shapes": True}, "op call",
                      lambda report: sum(b.count for b in report.bricks if b.kind == "op")),
}


def timed(model, x, iterations, option):
    gc.collect()
    kwargs, _, count = OPTIONS[option] if option else ({}, None, None)
    with torch.no_grad(), bp.profile(**kwargs) as p:
        start = time.perf_counter_ns()
        for _ in range(iterations):
            model(x)
        elapsed = time.perf_counter_ns() - start
    return elapsed, (count(p.report) if option else 0)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, 1 thread, {args.rounds} rounds x {args.iterations} "
          "forwards")
    for label, build in (("qwen2 tiny forward", qwen2), ("mlp 64 modules", mlp)):
        model, x = build()
        for option in OPTIONS:
            timed(model, x, 5, option)  # warm-up
        times = {None: [], **{option: [] for option in OPTIONS}}
        calls = dict.fromkeys(OPTIONS, 0)
        configurations = list(times)
        for r in range(args.rounds):
            for option in configurations[r % len(configurations):] + \
                    configurations[:r % len(configurations)]:  # rotating order
                ns, n = timed(model, x, args.iterations, option)
                times[option].append(ns)
                if option:
                    calls[option] = n
        t_off = statistics.median(times[None])
        print(f"{label:<20} forward {t_off / args.iterations / 1e3:9.1f} us under profile()")
        for option, (_, per, _) in OPTIONS.items():
            t_on = statistics.median(times[option])
            per_call = (t_on - t_off) / calls[option]
            print(f"  {option:<15} {t_on / args.iterations / 1e3:9.1f} us ({t_on / t_off:.3f}x); "
                  f"{calls[option] // args.iterations} {per}s per forward, "
                  f"{per_call / 1e3:.2f} us per {per}")


if __name__ == "__main__":
    main()
