"""The training demo's model and loop, shared by ``python -m torch_brickdev train`` (one process,
brick beside the CPU) and its ``--nproc`` form (DistributedDataParallel under torchrun)."""

import contextlib
import time
from typing import Optional

import torch


class ResidualBlock(torch.nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.norm = torch.nn.LayerNorm(width)
        self.up = torch.nn.Linear(width, 4 * width)
        self.down = torch.nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(torch.nn.functional.gelu(self.up(self.norm(x))))


def residual_mlp(width: int, depth: int, classes: int) -> torch.nn.Module:
    return torch.nn.Sequential(
        *[ResidualBlock(width) for _ in range(depth)], torch.nn.LayerNorm(width),
        torch.nn.Linear(width, classes)
    )


def train_steps(model, data, targets, steps: int, step_range: Optional[str] = None):
    """``steps`` AdamW steps on one batch; the losses and each step's seconds. ``step_range``
    names a ``record_function`` range around each step (for the profiler's report)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    losses, times = [], []
    for _ in range(steps):
        start = time.perf_counter()
        with torch.profiler.record_function(step_range) if step_range else contextlib.nullcontext():
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), targets)
            loss.backward()
            optimizer.step()
        losses.append(loss.item())  # .item() waits for the device
        times.append(time.perf_counter() - start)
    return losses, times


def steady_ratio(times_a, times_b) -> float:
    """Total time of a over b, after the first step (warm-up) where there are more."""
    steady = slice(1, None) if len(times_a) > 1 else slice(None)
    return sum(times_a[steady]) / sum(times_b[steady])
