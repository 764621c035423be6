"""Op sweep: every OpInfo in PyTorch's ``op_db``, run on brick and on the CPU, compared.

Each test takes the first few sample inputs an OpInfo generates on the CPU, copies them to brick
(keeping each tensor's exact strides, storage offset and aliasing), runs the op on both devices and
compares the outputs with ``torch.testing.assert_close``; every tensor brick returns must live on
brick. Where the op is differentiable in the dtype under test, the gradients of the inputs under a
fixed random output gradient are compared as well.

Random ops are compared too: brick's generators run the CPU's Philox/MT streams, so the same seed
must give the same numbers. Ops whose result is undefined memory (``empty*``) are skipped, and so
is every op whose CPU run itself fails.

``test_op`` sweeps the whole database in float32 (or, for ops without float32, the first of a few
other dtypes they support); ``test_op_dtype`` runs a smaller set of common ops in other dtypes.
Known brick failures are listed, each with its category, in ``op_sweep_skips.py``.
"""

import itertools
import os

import pytest
import torch
from torch.testing._internal.common_methods_invocations import op_db
from torch.testing._internal.opinfo.core import SampleInput

from op_sweep_skips import CPU_ARGS, NO_BACKWARD, SKIPS, TOLERANCES, XFAILS

BRICK = "brick"
# Samples per op and dtype: enough to cover the usual shapes, few enough for a quick sweep.
MAX_SAMPLES = int(os.environ.get("BRICK_OP_SWEEP_SAMPLES", "3"))

# Ops whose outputs are uninitialised memory: nothing to compare.
UNDEFINED_OUTPUT = {
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
    "torch.empty",
}
# Layouts brick does not take: sparse, quantized and nested tensors.
OUT_OF_SCOPE_MARKERS = ("sparse", "quantize", "nested", "njt")
# Random ops: compared under the same seed on both devices.
RANDOM_MARKERS = (
    "rand",
    "normal",
    "bernoulli",
    "dropout",
    "multinomial",
    "uniform",
    "cauchy",
    "exponential",
    "geometric",
    "log_normal",
    "rrelu",
    "fractional_max_pool",
    "gumbel",
    "lowrank",
)

FALLBACK_DTYPES = (torch.int64, torch.bool, torch.complex64, torch.float64, torch.int32,
                   torch.uint8)

# Common ops that the dtype sweep runs in every dtype they support on the CPU.
DTYPE_SWEEP_OPS = (
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "neg", "abs", "exp", "log", "sqrt", "sin", "tanh", "sigmoid",
    "pow", "maximum", "where", "clamp", "sum", "mean", "prod", "amax", "argmax", "cumsum",
    "sort", "topk", "matmul", "mm", "cat", "stack", "index_select", "gather", "scatter",
    "masked_fill", "eq", "lt", "logical_and", "nn.functional.relu", "softmax",
    "nn.functional.linear", "transpose", "reshape", "flip", "roll", "tril", "nonzero",
)
DTYPE_SWEEP_DTYPES = (torch.float64, torch.int64, torch.bool, torch.complex64, torch.float16,
                      torch.bfloat16)


def _op_id(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _is_random(op):
    name = _op_id(op)
    return any(marker in name for marker in RANDOM_MARKERS)


def _main_dtype(op):
    supported = op.supported_dtypes("cpu")
    for dtype in (torch.float32, *FALLBACK_DTYPES):
        if dtype in supported:
            return dtype
    return None


OPS = {}
for _op in op_db:
    OPS.setdefault(_op_id(_op), _op)


def _marks(op_id, dtype=None):
    keys = [op_id] if dtype is None else [f"{op_id}:{dtype}".replace("torch.", ""), op_id]
    for key in keys:
        if key in SKIPS:
            return [pytest.mark.skip(reason=SKIPS[key])]
        if key in XFAILS:
            return [pytest.mark.xfail(reason=XFAILS[key], strict=False)]
    return []


# --- moving samples to a device ---------------------------------------------------------------


def _copy_tensor(t, device):
    """A fresh leaf on ``device`` with ``t``'s values, strides, storage offset and storage size."""
    with torch.no_grad():
        src = t.detach()
        if src.is_conj():
            src = src.resolve_conj()
        if src.is_neg():
            src = src.resolve_neg()
        if src.layout != torch.strided:
            pytest.skip(f"{src.layout} inputs: only strided tensors are in scope")
        # Copy the whole storage and view it the same way, so offsets, gaps and overlaps (expanded
        # inputs) reach the op as they do on the CPU.
        itemsize = src.element_size()
        numel = src.untyped_storage().nbytes() // itemsize
        flat = src.as_strided((numel,), (1,), 0).to(device, copy=True)
        out = flat.as_strided(src.size(), src.stride(), src.storage_offset())
    if t.requires_grad:
        out.requires_grad_(True)
    return out


def _copy(value, device, key=None):
    """``value`` (a sample's input, args or kwargs) with every tensor copied to ``device``."""
    if isinstance(value, torch.Tensor):
        return _copy_tensor(value, device)
    if device == BRICK:
        if isinstance(value, torch.device):
            return torch.device(BRICK) if value.type == "cpu" else value
        if isinstance(value, str) and value == "cpu":
            return BRICK
    if isinstance(value, list):
        return [_copy(v, device) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_copy(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v, device, k) for k, v in value.items()}
    return value


def _copy_sample(op, sample, device):
    args = list(_copy(sample.args, device))
    kwargs = _copy(sample.kwargs, device)
    if device == BRICK:
        for index in CPU_ARGS.get(_op_id(op), ()):  # arguments that must stay on the CPU
            args[index] = _copy(sample.args[index], "cpu")
        if op.is_factory_function and "device" not in kwargs:
            kwargs["device"] = BRICK
    return SampleInput(_copy(sample.input, device), args=tuple(args), kwargs=kwargs,
                       output_process_fn_grad=sample.output_process_fn_grad)


def _flatten(value):
    """Leaves of a nested output, in a fixed order."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _flatten(v)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value) for leaf in _flatten(value[k])]
    return [value]


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return [_to_cpu(v) for v in value]
    return value


def _check_on_brick(value, what):
    for i, leaf in enumerate(_flatten(value)):
        if isinstance(leaf, torch.Tensor):
            assert leaf.device.type == BRICK, f"{what}[{i}] is on {leaf.device}, not brick"


# --- running one sample -----------------------------------------------------------------------


def _call(op, sample, seed):
    if seed is not None:
        torch.manual_seed(seed)
    return op(sample.input, *sample.args, **sample.kwargs)


def _grad_inputs(sample):
    return [t for t in _flatten([sample.input, list(sample.args), sample.kwargs])
            if isinstance(t, torch.Tensor) and t.requires_grad]


def _differentiable_outputs(out):
    return [t for t in _flatten(out)
            if isinstance(t, torch.Tensor) and t.requires_grad
            and (t.is_floating_point() or t.is_complex())]


def _compare(actual, expected, what, tolerance):
    actual, expected = _to_cpu(actual), _to_cpu(expected)
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance,
                               msg=lambda m: f"{what}: {m}")


def _run_sample(op, sample, backward, tolerance):
    """Compares one sample; returns why it could not run on the CPU, or None."""
    cpu_sample = _copy_sample(op, sample, "cpu")
    brick_sample = _copy_sample(op, sample, BRICK)
    seed = 1234 if _is_random(op) else None

    try:
        expected = _call(op, cpu_sample, seed)
    except Exception as error:  # the CPU itself rejects the sample: nothing to compare
        return f"CPU run raised {type(error).__name__}: {str(error).splitlines()[0][:120]}"

    actual = _call(op, brick_sample, seed)
    _check_on_brick(actual, "output")
    _compare(actual, expected, "forward output", tolerance)

    if not backward:
        return None
    expected_outs = _differentiable_outputs(cpu_sample.output_process_fn_grad(expected))
    cpu_inputs = _grad_inputs(cpu_sample)
    if not expected_outs or not cpu_inputs:
        return None
    actual_outs = _differentiable_outputs(brick_sample.output_process_fn_grad(actual))
    brick_inputs = _grad_inputs(brick_sample)
    assert len(actual_outs) == len(expected_outs), "brick has other differentiable outputs"
    assert len(brick_inputs) == len(cpu_inputs)

    # A fixed random output gradient (not ones), so every element of the backward pass matters.
    generator = torch.Generator().manual_seed(0)
    grad_outs = [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in expected_outs]
    if seed is not None:
        torch.manual_seed(seed + 1)
    expected_grads = torch.autograd.grad(expected_outs, cpu_inputs, grad_outs, allow_unused=True)
    if seed is not None:
        torch.manual_seed(seed + 1)
    actual_grads = torch.autograd.grad(actual_outs, brick_inputs,
                                       [g.to(BRICK) for g in grad_outs], allow_unused=True)
    _check_on_brick(actual_grads, "grad")
    _compare(list(actual_grads), list(expected_grads), "input grads", tolerance)
    return None


def _skip_reason(op):
    op_id = _op_id(op)
    if op.name in UNDEFINED_OUTPUT:
        return "output is uninitialised memory"
    if any(marker in op_id for marker in OUT_OF_SCOPE_MARKERS):
        return "sparse/quantized/nested layouts are out of brick's scope"
    return None


def _run_op(op, dtype):
    reason = _skip_reason(op)
    if reason:
        pytest.skip(reason)
    op_id = _op_id(op)
    backward = (op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
                and dtype in op.supported_backward_dtypes("cpu") and op_id not in NO_BACKWARD)
    tolerance = TOLERANCES.get(op_id, {})
    try:
        samples = list(itertools.islice(
            op.sample_inputs("cpu", dtype, requires_grad=backward), MAX_SAMPLES))
    except Exception as error:
        pytest.skip(f"CPU sample generation raised {type(error).__name__}: {error}")
    if not samples:
        pytest.skip("OpInfo has no samples for this dtype")
    ran = 0
    cpu_errors = []
    for sample in samples:
        cpu_error = _run_sample(op, sample, backward, tolerance)
        if cpu_error is None:
            ran += 1
        else:
            cpu_errors.append(cpu_error)
    if ran == 0:
        pytest.skip(cpu_errors[0])


# --- tests ------------------------------------------------------------------------------------


def _main_params():
    params = []
    for op_id, op in OPS.items():
        dtype = _main_dtype(op)
        if dtype is None:
            params.append(pytest.param(op, None, id=op_id,
                                       marks=pytest.mark.skip(reason="no CPU dtype to test")))
        else:
            params.append(pytest.param(op, dtype, id=op_id, marks=_marks(op_id)))
    return params


def _dtype_params():
    params = []
    for op_id in DTYPE_SWEEP_OPS:
        op = OPS[op_id]
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPE_SWEEP_DTYPES:
            if dtype in supported:
                name = str(dtype).replace("torch.", "")
                params.append(pytest.param(op, dtype, id=f"{op_id}-{name}",
                                           marks=_marks(op_id, dtype)))
    return params


@pytest.mark.parametrize("op,dtype", _main_params())
def test_op(op, dtype):
    _run_op(op, dtype)


@pytest.mark.parametrize("op,dtype", _dtype_params())
def test_op_dtype(op, dtype):
    _run_op(op, dtype)


def test_sweep_is_broad():
    """The sweep must keep covering hundreds of ops, not shrink to a handful."""
    runnable = [op_id for op_id, op in OPS.items()
                if _main_dtype(op) is not None and op_id not in SKIPS]
    assert len(runnable) >= 300, len(runnable)
