"""Brick's structured kernels on the host runtime.

For the elementwise ops whose CPU kernel is structured (a TensorIterator and a DispatchStub),
brick runs the CPU's structured kernel on the brick tensors themselves, into a brick tensor
allocated as the CPU allocates its result (csrc/backend/direct_kernels.cpp, cpu_stubs.cpp): no
aliases of the arguments, no result to adopt. Every result must be the CPU's, bit for bit and
stride for stride, including where the CPU's iterator casts (Python numbers, CPU scalars) and
where brick leaves this path (a brick tensor that needs a cast).
"""

import textwrap

import pytest
import torch
import torch.nn.functional as F

import torch_brickdev
from helpers import child_env, run_python
from profiler_helpers import by_name, clean_profiler  # noqa: F401  (a fixture)
from torch_brickdev import profiler as bp

pytestmark = pytest.mark.skipif(torch_brickdev.backing_device_type() != "cpu",
                                reason="structured kernels on brick tensors are the host runtime's")

BINARY = {
    "add": lambda a, b: torch.add(a, b, alpha=2),
    "sub": lambda a, b: torch.sub(a, b, alpha=0.5),
    "mul": torch.mul,
    "div": torch.div,
    "maximum": torch.maximum,
    "minimum": torch.minimum,
    "eq": torch.eq, "ne": torch.ne, "gt": torch.gt, "ge": torch.ge, "lt": torch.lt, "le": torch.le,
}
UNARY = {
    "neg": torch.neg, "rsqrt": torch.rsqrt, "silu": F.silu, "sigmoid": torch.sigmoid,
    "tanh": torch.tanh, "exp": torch.exp, "sqrt": torch.sqrt, "log": torch.log, "sin": torch.sin,
    "cos": torch.cos, "clamp_min": lambda a: torch.clamp_min(a, 0.25),
    "pow 2": lambda a: torch.pow(a, 2), "pow 0.5": lambda a: torch.pow(a, 0.5),
    "pow 0": lambda a: torch.pow(a, 0), "pow 1": lambda a: torch.pow(a, 1),  # aliased
}
FLOATS = [torch.float32, torch.float64, torch.bfloat16, torch.float16]


def _assert_the_cpus(actual, expected, what):
    assert actual.device.type == "brick", f"{what}: on {actual.device}"
    assert actual.dtype == expected.dtype, f"{what}: {actual.dtype}, CPU {expected.dtype}"
    assert actual.stride() == expected.stride(), \
        f"{what}: strides {actual.stride()}, CPU {expected.stride()}"
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def _assert_same_outcome(on_brick, on_cpu, what):
    """The CPU's result, or the CPU's error."""
    try:
        expected = on_cpu()
    except (RuntimeError, TypeError) as error:
        with pytest.raises(type(error)) as raised:
            on_brick()
        assert str(error).splitlines()[0] in str(raised.value), what
        return
    _assert_the_cpus(on_brick(), expected, what)


def _operands(dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    a = (torch.rand(3, 1, 5, generator=generator) + 0.1).to(dtype)
    b = (torch.rand(1, 4, 5, generator=generator) + 0.1).to(dtype)
    return a, b


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_ops_are_the_cpus(name, dtype):
    op = BINARY[name]
    a, b = _operands(dtype, 0)
    # Each layout made by the same view ops on each device (a copy to brick need not keep strides).
    layouts = {
        "broadcast": lambda x, y: (x, y),
        "transposed": lambda x, y: (x.expand(3, 4, 5).transpose(0, 2),
                                    y.expand(3, 4, 5).transpose(0, 2)),
        "0-dim": lambda x, y: (x[0, 0, 0], y),
        "channels last": lambda x, y: (
            x.expand(3, 4, 5).unsqueeze(0).contiguous(memory_format=torch.channels_last),
            y.expand(3, 4, 5).unsqueeze(0)),
    }
    a_brick, b_brick = a.to("brick"), b.to("brick")
    for layout, make in layouts.items():
        _assert_the_cpus(op(*make(a_brick, b_brick)), op(*make(a, b)), f"{name} {layout}")
    # Python numbers and CPU scalars of another dtype, cast by the CPU's iterator.
    for other in (0.375, 3, True, torch.tensor(0.5, dtype=torch.float64)):
        _assert_same_outcome(lambda: op(a_brick, other), lambda: op(a, other),
                             f"{name} with {other!r}")


@pytest.mark.parametrize("dtype", FLOATS, ids=str)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary_ops_are_the_cpus(name, dtype):
    op = UNARY[name]
    a, _ = _operands(dtype, 1)
    a = a - 0.3  # both signs
    a_brick = a.to("brick")
    for layout, make in {"contiguous": lambda x: x,
                         "transposed": lambda x: x.expand(3, 4, 5).transpose(0, 1),
                         "0-dim": lambda x: x[0, 0, 0]}.items():
        _assert_the_cpus(op(make(a_brick)), op(make(a)), f"{name} {layout}")


def test_integer_and_bool_ops_are_the_cpus():
    generator = torch.Generator().manual_seed(2)
    i = torch.randint(-50, 50, (6, 7), generator=generator)
    j = torch.randint(-50, 50, (6, 7), generator=generator)
    cases = {
        "bitwise_or": lambda x, y: torch.bitwise_or(x, y),
        "bitwise_and": lambda x, y: torch.bitwise_and(x, y),
        "add int": lambda x, y: x + y * 3,
        "mul int": torch.mul,
        "true division of ints": torch.div,  # an integer input cast to float: brick's aliases
        "int with a float": lambda x, y: x * 0.5 + y,
        "exp of ints": lambda x, y: torch.exp(x.float() / 50) + torch.sigmoid(y),
        "bool or": lambda x, y: (x > 0) | (y > 0),
        "pow of ints": lambda x, y: torch.pow(x, 3) + torch.pow(y, 2.5),  # the latter aliased
        "clamp_min of ints": lambda x, y: torch.clamp_min(x, 3) + torch.clamp_min(y, 0.5),
    }
    for name, op in cases.items():
        _assert_the_cpus(op(i.to("brick"), j.to("brick")), op(i, j), name)


def test_mixed_brick_dtypes_are_the_cpus():
    # The CPU's iterator casts one of the two: brick runs these with aliases.
    a, b = _operands(torch.float16, 3)
    c, _ = _operands(torch.float32, 4)
    for name, op in BINARY.items():
        _assert_the_cpus(op(a.to("brick"), c.to("brick")), op(a, c), f"{name} half with float")
        _assert_the_cpus(op(c.to("brick"), b.to("brick")), op(c, b), f"{name} float with half")


def test_results_are_brick_memory_from_birth():
    # A structured op's result is brick's own allocation; an op on the alias path (relu) adopts
    # the CPU's result.
    a = torch.randn(1000, device="brick")
    base = torch.brick.memory_stats()
    b = a * a
    after = torch.brick.memory_stats()
    assert after["allocated_bytes.all.current"] == base["allocated_bytes.all.current"] + 4000
    assert after["adopted_bytes.all.current"] == base["adopted_bytes.all.current"]
    c = torch.relu(a)
    assert torch.brick.memory_stats()["adopted_bytes.all.current"] == \
        base["adopted_bytes.all.current"] + 4000
    del b, c
    final = torch.brick.memory_stats()
    for key in ("allocated_bytes.all.current", "adopted_bytes.all.current"):
        assert final[key] == base[key], key


def test_errors_are_the_cpus():
    for x, y in ((torch.randn(3), torch.randn(4)), (torch.ones(2, dtype=torch.bool),
                                                    torch.ones(2, dtype=torch.bool))):
        with pytest.raises(RuntimeError) as on_cpu:
            torch.sub(x, y)
        with pytest.raises(RuntimeError) as on_brick:
            torch.sub(x.to("brick"), y.to("brick"))
        assert str(on_cpu.value).splitlines()[0] in str(on_brick.value)


def test_a_structured_op_is_one_brick_kernel(clean_profiler):
    x = torch.randn(64, device="brick")
    with bp.profile():
        for _ in range(5):
            y = x * 0.5 + x
            torch.sigmoid(y)
    names = by_name(bp.stats(by="name"))
    assert names["aten::mul"].count == 5
    assert names["aten::add"].count == 5
    assert names["aten::sigmoid"].count == 5


def test_no_brick_kernel_runs_inside_another(clean_profiler):
    # Where the CPU's kernel would call another op on a brick tensor (pow's fill_ and copy_, a
    # meta's .to() of a tensor whose result type differs), brick aliases instead: with ops timed
    # at brick's kernels, every kernel is at the top level.
    generator = torch.Generator().manual_seed(6)
    f = torch.rand(6, generator=generator).to("brick")
    i = torch.randint(1, 9, (6,), generator=generator).to("brick")
    calls = [lambda: torch.pow(f, 0), lambda: torch.pow(f, 1), lambda: torch.pow(f, 2),
             lambda: torch.pow(i, 2.5), lambda: torch.clamp_min(i, 0.5), lambda: i * 0.5,
             lambda: torch.sigmoid(i), lambda: f > 1, lambda: i / i, lambda: f + i]
    with bp.profile(ops="kernels"):
        for call in calls:
            call()
    nested = [b.path for b in bp.stats(by="path") if b.kind == "op" and b.depth > 0]
    assert nested == []


_CAPABILITY_SCRIPT = textwrap.dedent("""
    import torch, torch_brickdev
    g = torch.Generator().manual_seed(5)
    x = torch.randn(4099, generator=g)
    for name, op in (("exp", torch.exp), ("tanh", torch.tanh), ("sigmoid", torch.sigmoid),
                     ("silu", torch.nn.functional.silu), ("div", lambda t: t / (t + 3))):
        for dtype in (torch.float32, torch.bfloat16):
            a = x.to(dtype)
            assert torch.equal(op(a.to("brick")).cpu(), op(a)), (name, dtype)
    print(torch.backends.cpu.get_cpu_capability())
""")


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_the_stubs_follow_the_cpu_capability(capability):
    # ATEN_CPU_CAPABILITY picks the CPU's kernels (vectorised transcendental functions round
    # differently per ISA): brick's stub entries pick the same.
    done = run_python("-c", _CAPABILITY_SCRIPT, env=child_env(ATEN_CPU_CAPABILITY=capability))
    assert done.returncode == 0, done.stderr[-3000:]
