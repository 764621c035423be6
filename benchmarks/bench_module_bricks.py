"""What module bricks cost: ``profile(modules=True)`` against ``profile()`` on the same forward,
side by side in one run, per module call.

The workload is transformers' Qwen2 (tiny config, 2 layers: 29 module calls per forward) on
brick, one thread, and an MLP of many small Linear layers (the worst case: little work per
module). Each configuration runs in interleaved rounds after ``gc.collect()``; figures are
medians. Per module call: (time with modules - time without) / module calls, the calls counted
by the report itself.

Run: python benchmarks/bench_module_bricks.py [--rounds N] [--iterations N]
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


def timed(model, x, iterations, modules):
    gc.collect()
    with torch.no_grad(), bp.profile(modules=modules) as p:
        start = time.perf_counter_ns()
        for _ in range(iterations):
            model(x)
        elapsed = time.perf_counter_ns() - start
    calls = sum(r["calls"] for r in p.report.module_times()) if modules else 0
    return elapsed, calls


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
        timed(model, x, 5, True)  # warm-up
        off, on, calls = [], [], 0
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for modules in order:
                ns, n = timed(model, x, args.iterations, modules)
                (on if modules else off).append(ns)
                calls = n or calls
        t_off, t_on = statistics.median(off), statistics.median(on)
        per_call = (t_on - t_off) / calls
        print(f"{label:<20} forward {t_off / args.iterations / 1e3:9.1f} us, with modules "
              f"{t_on / args.iterations / 1e3:9.1f} us ({t_on / t_off:.3f}x); "
              f"{calls // args.iterations} module calls per forward, {per_call / 1e3:.2f} us per "
              "module call")


if __name__ == "__main__":
    main()
