"""torch.compile on brick: eager vs compiled on brick vs compiled on the CPU, in one run.

Target (issue 13): compiled on brick within 1.1x of compiled on the CPU, for
  - a transformers-style decoder block (RMSNorm, grouped-query attention through SDPA, SwiGLU
    MLP, residuals), forward, batch 4 x 64 tokens, hidden 256;
  - an MLP training step (forward, backward, SGD with momentum), batch 64, 4 x 512 layers.
Target (issue 29): the decode demo compiled at least as fast as eager on brick (compiled brick /
eager brick <= 1.0; one decode of the demo's default config, 32 tokens, each block a brick).
Each configuration is compiled and warmed up first; then all run in interleaved rounds and the
medians are printed with their ratios. Host runtime only (Inductor on CUDA-backed brick is not
supported yet).

Run: python benchmarks/bench_compile.py [--rounds N] [--iterations N]
"""

import argparse
import copy
import statistics
import sys
import time

import torch
import torch.nn.functional as F
from torch import nn

import torch_brickdev


class RMSNorm(nn.Module):
    def __init__(self, dim, eps=1e-6):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x):
        variance = x.pow(2).mean(-1, keepdim=True)
        return self.weight * (x * torch.rsqrt(variance + self.eps))


class DecoderBlock(nn.Module):
    def __init__(self, hidden=256, heads=8, kv_heads=2, intermediate=704):
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = heads, kv_heads, hidden // heads
        self.input_norm, self.post_norm = RMSNorm(hidden), RMSNorm(hidden)
        self.q = nn.Linear(hidden, hidden)
        self.k = nn.Linear(hidden, kv_heads * self.head_dim)
        self.v = nn.Linear(hidden, kv_heads * self.head_dim)
        self.o = nn.Linear(hidden, hidden, bias=False)
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        b, t, _ = x.shape
        h = self.input_norm(x)
        q = self.q(h).view(b, t, self.heads, self.head_dim).transpose(1, 2)
        k = self.k(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v(h).view(b, t, self.kv_heads, self.head_dim).transpose(1, 2)
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        x = x + self.o(attn.transpose(1, 2).reshape(b, t, -1))
        h = self.post_norm(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


def mlp():
    layers = []
    for _ in range(4):
        layers += [nn.Linear(512, 512), nn.GELU()]
    return nn.Sequential(*layers, nn.Linear(512, 1))


def block_case(device, compiled):
    torch.manual_seed(0)
    block = DecoderBlock().to(device).eval()
    x = torch.randn(4, 64, 256, device=device)
    fn = torch.compile(block) if compiled else block

    def run():
        with torch.no_grad():
            return fn(x)

    return run


def training_case(device, compiled):
    torch.manual_seed(0)
    model = mlp().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    x, y = torch.randn(64, 512, device=device), torch.randn(64, 1, device=device)
    forward = torch.compile(model) if compiled else model

    def run():
        optimizer.zero_grad()
        loss = F.mse_loss(forward(x), y)
        loss.backward()
        optimizer.step()
        return loss

    return run


def decode_case(device, compiled):
    from torch_brickdev.tools.demo import DecodeConfig, build_model, decode

    config = DecodeConfig()
    model = build_model(config, device, compile=compiled)

    def run():
        return decode(model, config, device)

    return run


def sync(device):
    if device.startswith("brick"):
        torch.brick.synchronize()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=20)
    args = parser.parse_args()
    if torch_brickdev.backing_device_type() != "cpu":
        print("bench_compile: brick is backed by CUDA here; Inductor on CUDA-backed brick is not "
              "supported yet (compiled frames run eagerly): nothing to measure")
        return 0
    cases = {}
    for name, make in (("decoder block forward", block_case), ("MLP training step", training_case),
                       ("demo decode (32 tokens)", decode_case)):
        cases[name] = {
            "eager brick": (make("brick", False), "brick"),
            "compiled brick": (make("brick", True), "brick"),
            "eager cpu": (make("cpu", False), "cpu"),
            "compiled cpu": (make("cpu", True), "cpu"),
        }
    for configs in cases.values():  # compile and warm up
        for run, device in configs.values():
            for _ in range(3):
                run()
            sync(device)
    samples = {(case, config): [] for case, configs in cases.items() for config in configs}
    # A decode is ~0.2 s: a tenth of the iterations keeps its rounds as long as the others'.
    iterations = {case: max(1, args.iterations // 10) if case.startswith("demo") else
                  args.iterations for case in cases}
    for _ in range(args.rounds):
        for case, configs in cases.items():
            for config, (run, device) in configs.items():
                start = time.perf_counter_ns()
                for _ in range(iterations[case]):
                    run()
                sync(device)
                samples[(case, config)].append((time.perf_counter_ns() - start)
                                               / iterations[case])
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; median of "
          f"{args.rounds} interleaved rounds of {args.iterations} calls\n")
    print(f"{'case':<24}{'configuration':<18}{'us/call':>10}{'vs compiled cpu':>18}")
    verdicts = []
    for case, configs in cases.items():
        base = statistics.median(samples[(case, "compiled cpu")])
        for config in configs:
            us = statistics.median(samples[(case, config)])
            print(f"{case:<24}{config:<18}{us / 1e3:>10.1f}{us / base:>17.3f}x")
        ratio = statistics.median(samples[(case, "compiled brick")]) / base
        if case.startswith("demo"):
            ratio = statistics.median(samples[(case, "compiled brick")]) \
                / statistics.median(samples[(case, "eager brick")])
            verdicts.append(f"{case}: compiled brick / eager brick = {ratio:.3f}x "
                            f"(target <= 1.0x): {'ok' if ratio <= 1.0 else 'OVER TARGET'}")
            continue
        verdicts.append(f"{case}: compiled brick / compiled cpu = {ratio:.3f}x (target <= 1.1x): "
                        f"{'ok' if ratio <= 1.1 else 'OVER TARGET'}")
    print()
    print("\n".join(verdicts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
