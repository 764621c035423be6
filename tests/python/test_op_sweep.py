"""Op sweep: every OpInfo in PyTorch's ``op_db``, run on brick and on the CPU, compared.

For each op the sample inputs its OpInfo generates on the CPU are copied to brick and to fresh CPU
tensors alike (same values, strides, storage offset and storage size, so views, gaps and expanded
inputs reach the op identically), the op runs on both, and brick must match the CPU:

* ``test_op``: the function variant, on every OpInfo, in float32 (or, for ops without float32,
  the first of a few other dtypes they support). Outputs are compared with
  ``torch.testing.assert_close``; every tensor brick returns must be on brick, have the CPU's
  strides and storage offset, and alias the same input as on the CPU (views stay views). Inputs
  must come out unchanged exactly as on the CPU. Where the op is differentiable, the gradients of
  the inputs under a fixed random output gradient are compared too.
* ``test_op_dtype``: the same on a set of common ops in every other dtype they support.
* ``test_op_inplace``: the in-place variant (``add_``...), which must mutate and return its input.
* ``test_op_out``: the ``out=`` variant, with out tensors that must be resized (empty) or already
  have the right size; the out tensors must be returned and hold the result.
* ``test_op_second_device``: the dtype sweep's ops on brick:1 while brick:0 is current.

The first samples also run as noncontiguous copies (NaN in the gaps between elements).

Random ops are compared too: brick's generators run the CPU's streams, so the same seed must give
the same numbers. Ops whose result is uninitialised memory (``empty*``) and sparse, quantized and
nested layouts (test_sparse.py) are skipped, as is every op whose CPU run itself fails. Known brick failures and
harness adjustments live in ``op_sweep_skips.py``, each with its reason.

``BRICK_OP_SWEEP_SAMPLES`` limits the samples per op (default: all of them).
"""

import itertools
import os
import warnings
import zlib

import pytest
import torch

pytest.importorskip("expecttest", reason="PyTorch's OpInfo database needs expecttest")
from torch.testing._internal.common_methods_invocations import op_db  # noqa: E402
from torch.testing._internal.common_utils import set_rng_seed  # noqa: E402
from torch.testing._internal.opinfo.core import SampleInput  # noqa: E402

from op_sweep_skips import CPU_ARGS, NO_BACKWARD, SKIPS, TOLERANCES, XFAILS

BRICK = "brick"
MAX_SAMPLES = int(os.environ.get("BRICK_OP_SWEEP_SAMPLES", "0")) or None
# The in-place and out= variants run on the first few samples only.
MAX_VARIANT_SAMPLES = 4

# Ops whose outputs are uninitialised memory: nothing to compare.
UNDEFINED_OUTPUT = {
    "empty",
    "empty_like",
    "empty_strided",
    "empty_permuted",
    "new_empty",
    "new_empty_strided",
}
# Other layouts: sparse and nested tensors have their own tests (test_sparse.py), quantized
# ones are refused.
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

# Common ops (and ops sensitive to element size: views across dtypes, resizing outputs) that the
# dtype sweep runs in every dtype of DTYPE_SWEEP_DTYPES they support on the CPU.
DTYPE_SWEEP_OPS = (
    "add", "sub", "mul", "div.no_rounding_mode", "div.floor_rounding", "neg", "abs", "exp",
    "log", "sqrt", "sin", "tanh", "sigmoid", "pow", "maximum", "where", "clamp", "sum", "mean",
    "prod", "amax", "argmax", "cumsum", "sort", "topk", "matmul", "mm", "cat", "stack",
    "index_select", "gather", "scatter", "index_put", "index_add", "masked_fill",
    "masked_select", "eq", "lt", "logical_and", "nn.functional.relu", "softmax",
    "nn.functional.linear", "transpose", "reshape", "flip", "roll", "tril", "nonzero", "unique",
    "view_as_real", "real", "imag", "conj", "view", "unfold", "as_strided", "expand", "narrow",
    "diagonal", "chunk", "split", "unbind", "to", "view_as", "view_as_complex", "contiguous", "clone", "fill",
    "zeros_like", "full_like", "repeat", "bincount",
)
DTYPE_SWEEP_DTYPES = (torch.float64, torch.int64, torch.int32, torch.int8, torch.uint8,
                      torch.bool, torch.complex64, torch.complex128, torch.float16,
                      torch.bfloat16)


def _op_id(op):
    return op.name + (f".{op.variant_test_name}" if op.variant_test_name else "")


def _is_random(op):
    return any(marker in _op_id(op) for marker in RANDOM_MARKERS)


def _main_dtype(op):
    supported = op.supported_dtypes("cpu")
    for dtype in (torch.float32, *FALLBACK_DTYPES):
        if dtype in supported:
            return dtype
    return None


def _dtype_name(dtype):
    return str(dtype).replace("torch.", "")


OPS = {}
for _op in op_db:
    OPS.setdefault(_op_id(_op), _op)


# --- copying samples to a device ------------------------------------------------------------


def _copy_tensor(t, device, memo):
    """A leaf on ``device`` with ``t``'s values, strides, storage offset and storage size.

    ``memo`` keeps aliasing across one sample: the same tensor copies to the same tensor, and
    tensors sharing a storage copy to views of one storage.
    """
    if id(t) in memo:
        return memo[id(t)]
    with torch.no_grad():
        src = t.detach()
        if src.layout != torch.strided:
            pytest.skip(f"{src.layout} inputs: only strided tensors are in scope")
        if src.is_conj():
            src = src.resolve_conj()
        if src.is_neg():
            src = src.resolve_neg()
        # Copy the whole storage and view it the same way, so offsets, gaps and overlaps (expanded
        # inputs) reach the op as they do on the CPU.
        storage = src.untyped_storage()
        key = (storage.data_ptr(), storage.nbytes(), src.dtype)
        if key not in memo or not storage.nbytes():
            numel = storage.nbytes() // src.element_size()
            memo[key] = src.as_strided((numel,), (1,), 0).to(device, copy=True)
        out = memo[key].as_strided(src.size(), src.stride(), src.storage_offset())
    if t.requires_grad:
        out.requires_grad_(True)
    memo[id(t)] = out
    return out


def _copy(value, device, requires_grad=True, memo=None):
    """``value`` (a sample's input, args or kwargs) with every tensor copied to ``device``."""
    memo = {} if memo is None else memo
    if isinstance(value, torch.Tensor):
        out = _copy_tensor(value, device, memo)
        return out if requires_grad else out.detach()
    if device != "cpu":
        if isinstance(value, torch.device):
            return torch.device(device) if value.type == "cpu" else value
        if isinstance(value, str) and value == "cpu":
            return device
    if isinstance(value, list):
        return [_copy(v, device, requires_grad, memo) for v in value]
    if isinstance(value, tuple) and not hasattr(value, "_fields"):
        return tuple(_copy(v, device, requires_grad, memo) for v in value)
    if isinstance(value, dict):
        return {k: _copy(v, device, requires_grad, memo) for k, v in value.items()}
    return value


def _copy_sample(op, sample, device, requires_grad=True):
    memo = {}
    tensor_input = _copy(sample.input, device, requires_grad, memo)
    args = list(_copy(sample.args, device, requires_grad, memo))
    kwargs = _copy(sample.kwargs, device, requires_grad, memo)
    if device != "cpu":
        for index in CPU_ARGS.get(_op_id(op), ()):  # arguments the op takes on the CPU only
            args[index] = _copy(sample.args[index], "cpu", requires_grad)
        if op.is_factory_function and "device" not in kwargs:
            kwargs["device"] = device
    return SampleInput(tensor_input, args=tuple(args), kwargs=kwargs,
                       output_process_fn_grad=sample.output_process_fn_grad)


def _flatten(value):
    """Leaves of a nested value, in a fixed order."""
    if isinstance(value, (list, tuple)):
        return [leaf for v in value for leaf in _flatten(v)]
    if isinstance(value, dict):
        return [leaf for k in sorted(value) for leaf in _flatten(value[k])]
    return [value]


def _tensors(value):
    return [leaf for leaf in _flatten(value) if isinstance(leaf, torch.Tensor)]


def _sample_tensors(sample):
    return _tensors([sample.input, list(sample.args), sample.kwargs])


def _to_cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, (list, tuple)):
        return [_to_cpu(v) for v in value]
    return value


# --- checks ---------------------------------------------------------------------------------


def _bit_equal(actual, expected):
    """Both the same tensors bit for bit (dtype, shape, values; NaN-free), or lists of such."""
    if isinstance(actual, torch.Tensor) and isinstance(expected, torch.Tensor):
        if not (actual.dtype == expected.dtype and actual.shape == expected.shape
                and actual.layout == expected.layout == torch.strided):
            return False
        try:
            return torch.equal(actual, expected)
        except (NotImplementedError, RuntimeError):  # no CPU equal for the dtype (complex32)
            return False
    if isinstance(actual, list) and isinstance(expected, list) and len(actual) == len(expected):
        return all(_bit_equal(a, e) for a, e in zip(actual, expected))
    return False


def _compare(actual, expected, what, tolerance):
    actual, expected = _to_cpu(actual), _to_cpu(expected)
    if _bit_equal(actual, expected):  # brick runs the CPU's kernels: the usual case, and cheap
        return
    torch.testing.assert_close(actual, expected, equal_nan=True, **tolerance,
                               msg=lambda m: f"{what}: {m}")


def _check_on_brick(value, what, target):
    target = torch.device(target)
    for i, t in enumerate(_tensors(value)):
        assert t.device.type == BRICK and target.index in (None, t.device.index), \
            f"{what}[{i}] is on {t.device}, not {target}"


def _aliased_input(t, inputs):
    """Index of the first input whose storage ``t`` shares, or None."""
    if t.untyped_storage().nbytes() == 0:
        return None
    ptr = t.untyped_storage().data_ptr()
    for i, inp in enumerate(inputs):
        if inp.untyped_storage().nbytes() and inp.untyped_storage().data_ptr() == ptr:
            return i
    return None


def _check_geometry(actual, expected, brick_inputs, cpu_inputs, what):
    """brick outputs have the CPU's strides and offset, and alias the same inputs."""
    actual, expected = _tensors(actual), _tensors(expected)
    assert len(actual) == len(expected), f"{what}: {len(actual)} tensors, CPU {len(expected)}"
    for i, (a, e) in enumerate(zip(actual, expected)):
        if a.numel() > 1 and a.shape == e.shape:
            assert a.stride() == e.stride(), \
                f"{what}[{i}]: strides {a.stride()}, CPU {e.stride()}"
        if a.numel() > 0:
            assert a.storage_offset() == e.storage_offset(), \
                f"{what}[{i}]: storage offset {a.storage_offset()}, CPU {e.storage_offset()}"
        aliased, cpu_aliased = _aliased_input(a, brick_inputs), _aliased_input(e, cpu_inputs)
        assert aliased == cpu_aliased, (
            f"{what}[{i}]: shares storage with input {aliased}, on the CPU with {cpu_aliased}")


def _check_versions(actual, expected):
    """Autograd saw the same writes: version counters moved as on the CPU."""
    versions = [t._version for t in actual]
    cpu_versions = [t._version for t in expected]
    assert versions == cpu_versions, f"versions {versions}, CPU {cpu_versions}"


# --- running samples ------------------------------------------------------------------------


def _call(fn, sample, seed, **extra):
    if seed is not None:
        torch.manual_seed(seed)
    return fn(sample.input, *sample.args, **sample.kwargs, **extra)


def _cpu_failure(error):
    return f"CPU run raised {type(error).__name__}: {str(error).splitlines()[0][:160]}"


def _differentiable_outputs(out):
    return [t for t in _tensors(out)
            if t.requires_grad and (t.is_floating_point() or t.is_complex())]


def _run_sample(op, sample, backward, tolerance, target=BRICK):
    """Compares one sample of the function variant; returns why the CPU rejected it, or None."""
    cpu_sample = _copy_sample(op, sample, "cpu")
    brick_sample = _copy_sample(op, sample, target)
    seed = 1234 if _is_random(op) else None

    try:
        expected = _call(op, cpu_sample, seed)
    except Exception as error:  # the CPU itself rejects the sample: nothing to compare
        return _cpu_failure(error)
    actual = _call(op, brick_sample, seed)

    _check_on_brick(actual, "output", target)
    _compare(actual, expected, "forward output", tolerance)
    cpu_inputs, brick_inputs = _sample_tensors(cpu_sample), _sample_tensors(brick_sample)
    _check_geometry(actual, expected, brick_inputs, cpu_inputs, "output")
    _compare(brick_inputs, cpu_inputs, "inputs after the op", {})
    _check_versions(brick_inputs, cpu_inputs)

    if not backward:
        return None
    expected_outs = _differentiable_outputs(cpu_sample.output_process_fn_grad(expected))
    cpu_leaves = [t for t in cpu_inputs if t.requires_grad]
    if not expected_outs or not cpu_leaves:
        return None
    actual_outs = _differentiable_outputs(brick_sample.output_process_fn_grad(actual))
    brick_leaves = [t for t in brick_inputs if t.requires_grad]
    assert len(actual_outs) == len(expected_outs), "brick has other differentiable outputs"

    # A fixed random output gradient (not ones), so every element of the backward pass matters.
    generator = torch.Generator().manual_seed(0)
    grad_outs = [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in expected_outs]
    if seed is not None:
        torch.manual_seed(seed + 1)
    expected_grads = torch.autograd.grad(expected_outs, cpu_leaves, grad_outs, allow_unused=True)
    if seed is not None:
        torch.manual_seed(seed + 1)
    actual_grads = torch.autograd.grad(actual_outs, brick_leaves,
                                       [g.to(target) for g in grad_outs], allow_unused=True)
    _check_on_brick(actual_grads, "grad", target)
    _compare(list(actual_grads), list(expected_grads), "input grads", tolerance)
    return None


def _run_inplace_sample(op, sample, tolerance):
    fn = op.inplace_variant
    cpu_sample = _copy_sample(op, sample, "cpu", requires_grad=False)
    brick_sample = _copy_sample(op, sample, BRICK, requires_grad=False)
    seed = 1234 if _is_random(op) else None
    try:
        expected = _call(fn, cpu_sample, seed)
    except Exception as error:  # e.g. the result dtype cannot be cast to the input's
        return _cpu_failure(error)
    actual = _call(fn, brick_sample, seed)
    assert actual is brick_sample.input, "the in-place variant did not return its input"
    _check_on_brick(actual, "output", BRICK)
    _compare(actual, expected, "in-place result", tolerance)
    _check_geometry(actual, expected, [brick_sample.input], [cpu_sample.input], "output")
    _compare(_sample_tensors(brick_sample), _sample_tensors(cpu_sample), "inputs after the op",
             tolerance)
    _check_versions(_sample_tensors(brick_sample), _sample_tensors(cpu_sample))
    return None


def _out_tensors(expected, device, resize):
    """out= tensors shaped like ``expected``: empty (to be resized) or filled, of its size."""
    if isinstance(expected, torch.Tensor):
        if resize:
            return torch.empty((0,), dtype=expected.dtype, device=device)
        return torch.ones(expected.shape, dtype=expected.dtype, device=device)
    return type(expected)(_out_tensors(t, device, resize) for t in expected)


def _run_out_sample(op, sample, index, tolerance):
    cpu_sample = _copy_sample(op, sample, "cpu", requires_grad=False)
    brick_sample = _copy_sample(op, sample, BRICK, requires_grad=False)
    seed = 1234 if _is_random(op) else None
    try:
        expected = _call(op, cpu_sample, seed)
    except Exception as error:
        return _cpu_failure(error)
    if not all(isinstance(t, torch.Tensor) for t in _flatten(expected)):
        return "output is not made of tensors"
    if isinstance(expected, tuple) and type(expected) is not tuple:
        expected = tuple(expected)  # torch.return_types
    resize = index % 2 == 0  # alternate between out tensors to resize and right-sized ones
    cpu_out = _out_tensors(expected, "cpu", resize)
    brick_out = _out_tensors(expected, BRICK, resize)
    try:
        expected_out = _call(op, cpu_sample, seed, out=cpu_out)
    except Exception as error:
        return _cpu_failure(error)
    actual = _call(op, brick_sample, seed, out=brick_out)
    for a, o in zip(_tensors(actual), _tensors(brick_out)):
        assert a is o, "the out= variant did not return its out tensor"
    _check_on_brick(brick_out, "out", BRICK)
    _compare(brick_out, cpu_out, "out tensors", tolerance)
    _compare(actual, expected_out, "out= result", tolerance)
    # (No version check: resize_output resizes CPU tensors behind autograd's back, so out
    # tensors' versions legitimately differ between devices.)
    _check_geometry(brick_out, cpu_out, [], [], "out")
    return None


def _skip_reason(op):
    op_id = _op_id(op)
    if op.name in UNDEFINED_OUTPUT:
        return "output is uninitialised memory"
    if any(marker in op_id for marker in OUT_OF_SCOPE_MARKERS):
        return "sparse and nested layouts are tested in test_sparse.py; quantized ones are refused"
    return None


def _samples(op, dtype, requires_grad, limit):
    # The OpInfo's sample function, seeded once per op, is what ``op.sample_inputs`` returns
    # without its test-tracking wrapper. That wrapper costs most of the sweep's time under
    # pytest: it looks for the running unittest method with inspect.stack() (twice a call,
    # reading the source of every frame), and reseeds before each sample, where
    # torch.manual_seed formats a Python stack for each accelerator not initialised.
    set_rng_seed(zlib.crc32(f"{_op_id(op)}:{dtype}".encode()))
    try:
        return list(itertools.islice(
            op.sample_inputs_func(op, "cpu", dtype, requires_grad), limit))
    except Exception as error:
        pytest.skip(f"{_op_id(op)}: CPU sample generation raised {type(error).__name__}: {error}")


def _run_all(op, samples, run_one):
    if not samples:
        pytest.skip(f"{_op_id(op)}: OpInfo has no samples for this dtype")
    cpu_errors = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecations and resize notices, the same on both
        for index, sample in enumerate(samples):
            error = run_one(sample, index)
            if error is not None:
                cpu_errors.append(error)
    if len(cpu_errors) == len(samples):
        pytest.skip(f"{_op_id(op)}: {cpu_errors[0]}")


def _run_op(op, dtype, target=BRICK):
    reason = _skip_reason(op)
    if reason:
        pytest.skip(f"{_op_id(op)}: {reason}")
    op_id = _op_id(op)
    backward = (op.supports_autograd and (dtype.is_floating_point or dtype.is_complex)
                and dtype in op.supported_backward_dtypes("cpu") and op_id not in NO_BACKWARD)
    tolerance = TOLERANCES.get(op_id, {})
    samples = _samples(op, dtype, backward, MAX_SAMPLES)
    # Noncontiguous copies of the first samples too: NaN-filled gaps between the elements must
    # never reach the result.
    samples += [sample.noncontiguous() for sample in samples[:MAX_VARIANT_SAMPLES]]
    _run_all(op, samples, lambda sample, _: _run_sample(op, sample, backward, tolerance, target))


def _run_inplace(op, dtype):
    reason = _skip_reason(op)
    if reason:
        pytest.skip(f"{_op_id(op)}: {reason}")
    tolerance = TOLERANCES.get(_op_id(op), {})
    samples = _samples(op, dtype, False, MAX_VARIANT_SAMPLES)
    samples += [sample.noncontiguous() for sample in samples]  # in place on strided views
    _run_all(op, samples, lambda sample, _: _run_inplace_sample(op, sample, tolerance))


def _run_out(op, dtype):
    reason = _skip_reason(op)
    if reason:
        pytest.skip(f"{_op_id(op)}: {reason}")
    tolerance = TOLERANCES.get(_op_id(op), {})
    samples = _samples(op, dtype, False, MAX_VARIANT_SAMPLES)
    samples += [sample.noncontiguous() for sample in samples]
    _run_all(op, samples, lambda sample, index: _run_out_sample(op, sample, index, tolerance))


# --- tests ----------------------------------------------------------------------------------


def _marks(key, *fallback_keys):
    for k in (key, *fallback_keys):
        if k in SKIPS:
            return [pytest.mark.skip(reason=SKIPS[k])]
        if k in XFAILS:
            return [pytest.mark.xfail(reason=XFAILS[k], strict=False)]
    return []


def _params(variant, has_variant=lambda op: True):
    params = []
    for op_id, op in OPS.items():
        if not has_variant(op):
            continue
        dtype = _main_dtype(op)
        if dtype is None:
            marks = [pytest.mark.skip(reason=f"{op_id}: no CPU dtype to test")]
        elif variant:
            marks = _marks(f"{op_id}:{variant}")
        else:
            marks = _marks(op_id)
        params.append(pytest.param(op, dtype, id=op_id, marks=marks))
    return params


def _dtype_params():
    params = []
    for op_id in DTYPE_SWEEP_OPS:
        op = OPS[op_id]
        supported = op.supported_dtypes("cpu")
        for dtype in DTYPE_SWEEP_DTYPES:
            if dtype in supported:
                key = f"{op_id}:{_dtype_name(dtype)}"
                params.append(pytest.param(op, dtype, id=f"{op_id}-{_dtype_name(dtype)}",
                                           marks=_marks(key, op_id)))
    return params


@pytest.mark.parametrize("op,dtype", _params(None))
def test_op(op, dtype):
    _run_op(op, dtype)


@pytest.mark.parametrize("op,dtype", _dtype_params())
def test_op_dtype(op, dtype):
    _run_op(op, dtype)


@pytest.mark.skipif(torch.brick.device_count() < 2, reason="needs two brick devices")
@pytest.mark.parametrize("op", [OPS[op_id] for op_id in DTYPE_SWEEP_OPS], ids=DTYPE_SWEEP_OPS)
def test_op_second_device(op):
    """brick:1 while brick:0 is current: results, grads and generators stay on brick:1."""
    assert torch.brick.current_device() == 0
    _run_op(op, _main_dtype(op), target="brick:1")


@pytest.mark.parametrize("op,dtype", _params("inplace", lambda op: op.inplace_variant))
def test_op_inplace(op, dtype):
    _run_inplace(op, dtype)


@pytest.mark.parametrize("op,dtype", _params("out", lambda op: op.supports_out))
def test_op_out(op, dtype):
    _run_out(op, dtype)


def test_sweep_is_broad():
    """The sweep keeps covering hundreds of ops, not a handful."""
    runnable = [op_id for op_id, op in OPS.items()
                if _main_dtype(op) is not None and _skip_reason(op) is None
                and op_id not in SKIPS and op_id not in XFAILS]
    assert len(runnable) >= 300, len(runnable)
