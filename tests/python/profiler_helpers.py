"""Shared pieces of test_profiler.py and test_trace.py."""

from __future__ import annotations

import importlib.util
import pathlib
import time

import pytest
import torch

import torch_brickdev  # noqa: F401  (registers brick)
from torch_brickdev import profiler as bp

BENCHMARKS = pathlib.Path(__file__).resolve().parents[2] / "benchmarks"


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module, so tests run the very code the benchmarks measure."""
    spec = importlib.util.spec_from_file_location(f"brick_{name}", BENCHMARKS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# ---- a custom op of known duration ---------------------------------------------------------

_LIB = None
# Ground truth: how long each call of the Python impl took, entry to return, in ns.
SPIN_TRUTH_NS: list = []


def spin_op():
    """``brick_test::spin(x, us)``: busy-waits ``us`` microseconds, then returns ``x.clone()``.
    Each call appends its own duration (perf_counter_ns, entry to return) to SPIN_TRUTH_NS."""
    global _LIB
    if _LIB is None:
        lib = torch.library.Library("brick_test", "DEF")
        lib.define("spin(Tensor x, int us) -> Tensor")

        def spin(x, us):
            start = time.perf_counter_ns()
            end = start + us * 1000
            while time.perf_counter_ns() < end:
                pass
            out = x.clone()
            SPIN_TRUTH_NS.append(time.perf_counter_ns() - start)
            return out

        lib.impl("spin", spin, "PrivateUse1")
        _LIB = lib
    return torch.ops.brick_test.spin


_CPU_LIB = None


def spin_cpu_op():
    """``brick_test_cpu::spin(x, us)``: the same busy-wait as a *CPU* kernel. On brick it runs
    through brick's launch path (the fallback), as any op without a brick kernel does, so
    torch.profiler's brick device activity sees it."""
    global _CPU_LIB
    if _CPU_LIB is None:
        lib = torch.library.Library("brick_test_cpu", "DEF")
        lib.define("spin(Tensor x, int us) -> Tensor")

        def spin(x, us):
            end = time.perf_counter_ns() + us * 1000
            while time.perf_counter_ns() < end:
                pass
            return x.clone()

        lib.impl("spin", spin, "CPU")
        _CPU_LIB = lib
    return torch.ops.brick_test_cpu.spin


# ---- a small model ----------------------------------------------------------------------------


class TwoLayer(torch.nn.Module):
    """Two Linear + relu blocks, each under its own record_function range."""

    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(32, 64)
        self.fc2 = torch.nn.Linear(64, 8)

    def forward(self, x):
        with torch.profiler.record_function("Block1"):
            x = torch.relu(self.fc1(x))
        with torch.profiler.record_function("Block2"):
            x = torch.relu(self.fc2(x))
        return x


def legacy_profile(**kwargs):
    return torch.autograd.profiler.profile(use_device="brick", **kwargs)


def by_name(bricks):
    out = {}
    for b in bricks:
        assert b.name not in out, f"duplicate brick name {b.name!r}"
        out[b.name] = b
    return out


def by_path(bricks):
    out = {}
    for b in bricks:
        assert b.path not in out, f"duplicate brick path {b.path!r}"
        out[b.path] = b
    return out


@pytest.fixture
def clean_profiler():
    """Every test starts and ends with the registry disabled and the default (event) mode."""
    if bp.is_enabled():  # a previous test leaked: fail it loudly here, then recover
        bp.disable()
        pytest.fail("the brick profiler was left enabled by an earlier test")
    bp.set_sync_mode("event")
    yield
    leaked = bp.is_enabled()
    if leaked:
        bp.disable()
    bp.set_sync_mode("event")
    assert not leaked, "the test left the brick profiler enabled"
