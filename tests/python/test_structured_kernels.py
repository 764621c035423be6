"""Brick's structured kernels on the host runtime.

For the ops whose CPU kernel is structured (elementwise ops: a TensorIterator and a
DispatchStub; mm; cat), and for copies into a fresh tensor (clone, .to(dtype)), brick runs the CPU's structured kernel on the brick tensors themselves,
into a brick tensor allocated as the CPU allocates its result (csrc/backend/direct_kernels.cpp,
cpu_stubs.cpp): no aliases of the arguments, no result to adopt. Every result must be the CPU's,
bit for bit and stride for stride, including where the CPU's iterator casts (Python numbers, CPU
scalars) and where brick leaves this path (a brick tensor that needs a cast, a matrix gemm cannot
read in place, inputs of several dtypes).
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
    except (RuntimeError, TypeError, IndexError, ValueError) as error:
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
        "bitwise_not": lambda x, y: torch.bitwise_not(x) + torch.bitwise_not(y > 0),
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


def _matrices(dtype, seed):
    generator = torch.Generator().manual_seed(seed)
    a = torch.randn(7, 12, generator=generator).to(dtype)
    b = torch.randn(12, 5, generator=generator).to(dtype)
    return a, b


MM_LAYOUTS = {
    "contiguous": lambda a, b: (a, b),
    "transposed": lambda a, b: (a.t().contiguous().t(), b.t().contiguous().t()),
    "row of a wider matrix": lambda a, b: (torch.cat([a, a], 1)[:, :12], b),
    "a column and a row": lambda a, b: (a[:, :1], b[:1, :]),
    "1-row": lambda a, b: (a[:1], b),
    "every other column": lambda a, b: (a[:, ::2], b[::2]),  # cloned by the CPU: aliased
    "expanded": lambda a, b: (a[:1].expand(7, 12), b),  # a zero stride: aliased
    "empty inner dimension": lambda a, b: (a[:, :0], b[:0]),  # zero-filled: aliased
    "no rows": lambda a, b: (a[:0], b),
}


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=str)
def test_mm_is_the_cpus(dtype):
    a, b = _matrices(dtype, 7) if dtype.is_floating_point else \
        (torch.randint(-9, 9, (7, 12)), torch.randint(-9, 9, (12, 5)))
    a_brick, b_brick = a.to("brick"), b.to("brick")
    for layout, make in MM_LAYOUTS.items():
        _assert_the_cpus(torch.mm(*make(a_brick, b_brick)), torch.mm(*make(a, b)),
                         f"mm {layout}")
    _assert_the_cpus(a_brick @ b_brick, a @ b, "matmul")
    _assert_the_cpus(torch.nn.functional.linear(a_brick, b_brick.t()),
                     torch.nn.functional.linear(a, b.t()), "linear without bias")
    for bad in (lambda x, y: torch.mm(x, x), lambda x, y: torch.mm(x[0], y),
                lambda x, y: torch.mm(x, y.double())):
        _assert_same_outcome(lambda: bad(a_brick, b_brick), lambda: bad(a, b), "an mm error")


@pytest.mark.parametrize("dtype", FLOATS + [torch.int64], ids=str)
def test_addmm_is_the_cpus(dtype):
    a, b = _matrices(dtype, 11) if dtype.is_floating_point else \
        (torch.randint(-9, 9, (7, 12)), torch.randint(-9, 9, (12, 5)))
    generator = torch.Generator().manual_seed(12)
    row = torch.randn(5, generator=generator).to(dtype)
    full = torch.randn(7, 5, generator=generator).to(dtype)
    column = torch.randn(7, 1, generator=generator).to(dtype)
    biases = {"row": row, "full": full, "column": column, "0-dim": row[0],
              "transposed": full.t().contiguous().t()}
    if dtype.is_floating_point:
        biases["NaN"] = torch.full((5,), float("nan")).to(dtype)  # ignored with beta 0
    scalars = [{}, {"beta": 0}, {"beta": 0.5, "alpha": 2}] if dtype.is_floating_point else \
        [{}, {"beta": 0}, {"beta": 3, "alpha": 2}]
    for bias_name, bias in biases.items():
        for layout, make in MM_LAYOUTS.items():
            for kwargs in scalars:
                _assert_same_outcome(
                    lambda: torch.addmm(bias.to("brick"), *make(a.to("brick"), b.to("brick")),
                                        **kwargs),
                    lambda: torch.addmm(bias, *make(a, b), **kwargs),
                    f"addmm {bias_name} bias, {layout}, {kwargs}")
    x = a.to("brick")
    _assert_the_cpus(torch.nn.functional.linear(x, b.to("brick").t(), row.to("brick")),
                     torch.nn.functional.linear(a, b.t(), row), "linear")
    _assert_the_cpus(torch.nn.functional.linear(x.unsqueeze(0), b.to("brick").t(), row.to("brick")),
                     torch.nn.functional.linear(a.unsqueeze(0), b.t(), row), "linear, 3-D input")
    for bad in (lambda s, x, y: torch.addmm(s[:3], x, y), lambda s, x, y: torch.addmm(s, x, x),
                lambda s, x, y: torch.addmm(s[:3], x, y, beta=0)):
        _assert_same_outcome(lambda: bad(full.to("brick"), x, b.to("brick")),
                             lambda: bad(full, a, b), "an addmm error")


def test_mm_is_the_cpus_on_several_threads():
    # Sizes gemm splits across threads.
    a, b = _matrices(torch.float32, 8)
    a, b = a.repeat(40, 20), b.repeat(20, 40)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        _assert_the_cpus(torch.mm(a.to("brick"), b.to("brick")), torch.mm(a, b), "mm 280x240x200")
    finally:
        torch.set_num_threads(threads)


CAT_CASES = {
    "dim 0": lambda x, y: torch.cat([x, y, x], 0),
    "last dim": lambda x, y: torch.cat([x, y], -1),
    "middle dim": lambda x, y: torch.cat([x.unsqueeze(1), y.unsqueeze(1)], 1),
    "slices (rotate_half)": lambda x, y: torch.cat([-x[:, 3:], x[:, :3]], -1),
    "transposed": lambda x, y: torch.cat([x.t(), y.t()], 0),
    "one tensor": lambda x, y: torch.cat([x], 1),
    "legacy empty": lambda x, y: torch.cat([x.new_empty(0), x, y], 1),
    "empty": lambda x, y: torch.cat([x[:0], y[:0]], 0),
    "channels last": lambda x, y: torch.cat(
        [x.reshape(1, 2, 2, 3).contiguous(memory_format=torch.channels_last)] * 2, 1),
    "several dtypes": lambda x, y: torch.cat([x, y.double()], 1),  # cast: aliased
    "many": lambda x, y: torch.cat([x] * 12, 0),  # more tensors than the check holds
}


@pytest.mark.parametrize("dtype", FLOATS + [torch.int32, torch.bool], ids=str)
def test_cat_is_the_cpus(dtype):
    generator = torch.Generator().manual_seed(9)
    x = (torch.randn(4, 6, generator=generator) * 4).to(dtype)
    y = (torch.randn(4, 6, generator=generator) * 4).to(dtype)
    x_brick, y_brick = x.to("brick"), y.to("brick")
    for name, op in CAT_CASES.items():
        if dtype == torch.bool and "rotate" in name:
            continue  # no negation of bools
        _assert_same_outcome(lambda: op(x_brick, y_brick), lambda: op(x, y), f"cat {name}")
    for bad in (lambda x, y: torch.cat([x, y[:, :2]], 0), lambda x, y: torch.cat([x, y], 2),
                lambda x, y: torch.cat([x[0, 0], y], 0)):
        _assert_same_outcome(lambda: bad(x_brick, y_brick), lambda: bad(x, y), "a cat error")


def test_cat_is_the_cpus_on_several_threads():
    # Large enough for the CPU's parallel copies into slices of the result.
    generator = torch.Generator().manual_seed(10)
    x = torch.randn(64, 300, 8, generator=generator)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        for dim in (0, 1, 2):
            _assert_the_cpus(torch.cat([x.to("brick"), x.to("brick").mul(2)], dim),
                             torch.cat([x, x.mul(2)], dim), f"cat along {dim}")
    finally:
        torch.set_num_threads(threads)


def test_cat_of_conjugate_views_is_the_cpus():
    z = torch.randn(3, 4, dtype=torch.complex64)
    z_brick = z.to("brick")
    _assert_the_cpus(torch.cat([z_brick.conj(), z_brick], 0), torch.cat([z.conj(), z], 0),
                     "cat of a conjugate view")


def _layouts(x):
    """Views of `x` laid out as models lay them out, made the same way on either device."""
    return {
        "contiguous": x,
        "transposed": x.t(),
        "sliced": x[:, 1:5],
        "stepped": x[::2],
        "expanded": x[:1].expand(4, 6),
        "channels last": x.reshape(1, 2, 3, 4).contiguous(memory_format=torch.channels_last),
        "empty": x[:0],
        "scalar": x[0, 0],
    }


COPY_DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
               torch.int32, torch.uint8, torch.bool, torch.complex64]


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=str)
def test_clone_and_to_copy_are_the_cpus(dtype):
    # clone and .to(dtype) run the CPU's copy kernel into a fresh brick tensor laid out as the
    # CPU's: the source's strides (preserve, dense layouts) or contiguous; preserve on overlapping
    # or gapped views, channels last, half <-> float (fbgemm's kernel on the CPU), complex to real
    # and conjugate views alias. Either way: the CPU's bytes and strides.
    generator = torch.Generator().manual_seed(11)
    x = (torch.randn(4, 6, generator=generator) * 50).to(dtype)
    cpu_views, brick_views = _layouts(x), _layouts(x.to("brick"))
    targets = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
               torch.int8, torch.bool, torch.complex128]
    for layout in cpu_views:
        a, b = cpu_views[layout], brick_views[layout]
        for memory_format in (None, torch.preserve_format, torch.contiguous_format,
                              torch.channels_last):
            kwargs = {} if memory_format is None else {"memory_format": memory_format}
            _assert_same_outcome(lambda: b.clone(**kwargs), lambda: a.clone(**kwargs),
                                 f"clone {layout} {memory_format}")
            for target in targets:
                _assert_same_outcome(lambda: b.to(target, **kwargs),
                                     lambda: a.to(target, **kwargs),
                                     f"{layout} {dtype} -> {target} {memory_format}")
    if dtype.is_complex:
        z, z_brick = x, x.to("brick")
        _assert_the_cpus(z_brick.conj().clone(), z.conj().clone(), "clone of a conjugate view")
        _assert_the_cpus(z_brick.conj().to(torch.complex128), z.conj().to(torch.complex128),
                         "to_copy of a conjugate view")
        _assert_the_cpus(z_brick.conj().imag.neg().clone(), z.conj().imag.neg().clone(),
                         "clone of a negative view")


@pytest.mark.parametrize("dtype", COPY_DTYPES, ids=str)
def test_fill_is_the_cpus(dtype):
    # fill_ with a number runs the CPU's fill_ (its fill_stub kernel) on the brick tensor in place,
    # on every layout (an expanded view too: fill_ allows overlap), one element or many.
    values = [0, 1, -3, 2.5, True, 1e30, float("nan"), 300] + ([1 - 2j] if dtype.is_complex else [])
    for value in values:
        for layout in _layouts(torch.zeros(4, 6)):
            def fill(device):
                x = torch.zeros(4, 6, dtype=dtype, device=device)
                view = _layouts(x)[layout]
                view.fill_(value)
                return x  # the base: what the fill wrote, and where
            _assert_same_outcome(lambda: fill("brick"), lambda: fill("cpu"),
                                 f"fill_ {layout} with {value!r}")


def test_copies_keep_special_values_and_autograd():
    x = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0, 65504.0, 1e-8, 3.5e38])
    for target in (torch.float16, torch.bfloat16, torch.int32, torch.bool, torch.float64):
        if target == torch.int32:
            continue  # out-of-range float -> int casts are undefined behaviour in C++
        _assert_the_cpus(x.to("brick").to(target), x.to(target), f"specials -> {target}")
    a = torch.randn(3, 4, requires_grad=True)
    a_brick = a.detach().to("brick").requires_grad_()
    a_brick.clone().to(torch.float64).sum().backward()
    a.clone().to(torch.float64).sum().backward()
    _assert_the_cpus(a_brick.grad, a.grad, "gradient through clone and to")


def test_clone_on_several_threads_is_the_cpus():
    # Large enough for the CPU's copy to split over threads, and (a transposed matrix made
    # contiguous) for the CPU's copy_ to copy by blocks.
    x = torch.randn(64, 300, 8, generator=torch.Generator().manual_seed(12))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        x_brick = x.to("brick")
        _assert_the_cpus(x_brick.transpose(0, 2).clone(), x.transpose(0, 2).clone(), "clone")
        _assert_the_cpus(x_brick.transpose(0, 2).contiguous(), x.transpose(0, 2).contiguous(),
                         "contiguous")
        _assert_the_cpus(x_brick[:, :, 0].t().contiguous(), x[:, :, 0].t().contiguous(),
                         "a transposed matrix made contiguous")
        _assert_the_cpus(x_brick.to(torch.bfloat16), x.to(torch.bfloat16), "to bfloat16")
    finally:
        torch.set_num_threads(threads)


def test_results_are_brick_memory_from_birth():
    # A structured op's result is brick's own allocation; an op on the alias path (relu) adopts
    # the CPU's result.
    a = torch.randn(1000, device="brick")
    base = torch.brick.memory_stats()
    b = a * a
    after = torch.brick.memory_stats()
    assert after["allocated_bytes.all.current"] == base["allocated_bytes.all.current"] + 4000
    assert after["adopted_bytes.all.current"] == base["adopted_bytes.all.current"]
    product = torch.addmm(a[:10], a.view(10, 100), a.view(10, 100).t())  # 10 x 10
    joined = torch.cat([a, a])
    after = torch.brick.memory_stats()
    assert after["allocated_bytes.all.current"] == \
        base["allocated_bytes.all.current"] + 4000 + 400 + 8000
    assert after["adopted_bytes.all.current"] == base["adopted_bytes.all.current"]
    del product, joined
    copies = [a.clone(), a.to(torch.float64), a.view(10, 100).t().contiguous()]
    after = torch.brick.memory_stats()
    assert after["allocated_bytes.all.current"] == base["allocated_bytes.all.current"] + 4000 * 5
    assert after["adopted_bytes.all.current"] == base["adopted_bytes.all.current"]
    del copies
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
    m = torch.randn(8, 8, device="brick")
    with bp.profile():
        for _ in range(5):
            y = x * 0.5 + x
            torch.sigmoid(y)
            torch.mm(m, m.t())
            torch.addmm(m[0], m, m.t())
            torch.cat([x, y], 0)
            x.clone()
            x.to(torch.float64)
            y.fill_(1.5)
    names = by_name(bp.stats(by="name"))
    for name in ("aten::mul", "aten::add", "aten::sigmoid", "aten::mm", "aten::addmm",
                 "aten::cat", "aten::clone", "aten::fill_"):
        assert names[name].count == 5, name
    # The copies call no op (mul's meta converts the Python number 0.5 with a CPU _to_copy).
    paths = {b.path: b.count for b in bp.stats(by="path")}
    assert paths["aten::to/aten::_to_copy"] == 5
    assert not [p for p in paths if p.startswith(("aten::clone/", "aten::to/aten::_to_copy/"))]


def test_no_brick_kernel_runs_inside_another(clean_profiler):
    # Where the CPU's kernel would call another op on a brick tensor (pow's fill_ and copy_, a
    # meta's .to() of a tensor whose result type differs), brick aliases instead: with ops timed
    # at brick's kernels, every kernel is at the top level.
    generator = torch.Generator().manual_seed(6)
    f = torch.rand(6, generator=generator).to("brick")
    i = torch.randint(1, 9, (6,), generator=generator).to("brick")
    calls = [lambda: torch.pow(f, 0), lambda: torch.pow(f, 1), lambda: torch.pow(f, 2),
             lambda: torch.pow(i, 2.5), lambda: torch.clamp_min(i, 0.5), lambda: i * 0.5,
             lambda: torch.sigmoid(i), lambda: f > 1, lambda: i / i, lambda: f + i,
             lambda: torch.mm(f[:, None], f[None, :]), lambda: torch.mm(f[:0, None], f[None, :0]),
             lambda: torch.mm(f[None, :0], f[:0, None]), lambda: torch.mm(f[None, ::2], f[::2, None]),
             lambda: torch.addmm(f, f[:, None], f[None, :]),
             lambda: torch.addmm(f, f[:, None], f[None, :], beta=0),
             lambda: torch.addmm(f, f[:, None, ][:, :0], f[None, :][:0]),
             lambda: torch.cat([f, i]), lambda: torch.cat([f[::2], f[1::2]]),
             lambda: torch.bitwise_not(i), lambda: f.clone(), lambda: f[::2].clone(),
             lambda: f.to(torch.float16), lambda: i.to(torch.bool),
             lambda: f[None, :].expand(2, 6).clone(), lambda: f.clone().fill_(2),
             lambda: f[None, :].expand(2, 6).t().contiguous(),
             lambda: i.clone()[:1].fill_(True)]
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
            # The CPU's first float exp of a process can round otherwise than every later call
            # (MKL's vector math in an intra-op worker's first use, one process in three): one
            # call first, so both devices are compared in the CPU's steady state.
            op(a)
            assert torch.equal(op(a.to("brick")).cpu(), op(a)), (name, dtype)
    print(torch.backends.cpu.get_cpu_capability())
""")


@pytest.mark.parametrize("capability", ["default", "avx2"])
def test_the_stubs_follow_the_cpu_capability(capability):
    # ATEN_CPU_CAPABILITY picks the CPU's kernels (vectorised transcendental functions round
    # differently per ISA): brick's stub entries pick the same.
    done = run_python("-c", _CAPABILITY_SCRIPT, env=child_env(ATEN_CPU_CAPABILITY=capability))
    assert done.returncode == 0, done.stderr[-3000:]
