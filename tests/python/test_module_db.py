"""Module sweep: every ModuleInfo in PyTorch's ``module_db``, run on brick and on the CPU, compared.

The tests are written as PyTorch writes its own module tests: a generic ``TestCase`` whose tests
carry ``@modules(module_db)``, instantiated for brick by ``instantiate_device_type_tests`` with
``only_for=["brick"]`` (PyTorch's ``PrivateUse1TestBase``, which takes the renamed backend's name:
test names end in ``_brick_float32``, ``device`` is ``"brick:0"``). ``@modules`` makes one test
per module, dtype and, where the module behaves differently in training and evaluation mode, mode.

For every sample the ModuleInfo generates (on the CPU, once), the module is built twice under the
same seed, on the CPU and on brick, with the CPU's parameters and buffers copied onto brick; the
sample's tensors are copied to fresh leaves on each device (aliasing kept: ``query is key`` stays
true on both). Then, with the same seed before each run (dropout and fractional pooling draw the
same numbers on both devices):

* forward: the outputs must be on brick and match the CPU's (values, shapes, dtypes, strides),
  the inputs must come out as on the CPU, and so must the buffers (running statistics);
* backward: the gradients of every input and parameter under a fixed random output gradient;
* in evaluation mode, a forward under ``torch.no_grad()`` too (the inference fast paths of
  ``MultiheadAttention`` and the transformer layers).

"Match" means bit-equal: on the host runtime brick runs the CPU's kernels at the same thread
count, so any difference is a path brick took that the CPU does not (PyTorch's formulas and
composite ops that test the device type; the recurrent layers, whose composite takes CPU-only
paths, run as the CPU runs them: backing_graph.cpp). Every sample runs, and a test fails listing
every sample that failed, with its error (for a mismatch, assert_close's account of it). A sample the CPU itself
rejects is not compared, and counted with its reason; a test whose samples the CPU all rejects
is skipped with that reason. At the end the module prints ``module db: ...`` with the counts of
samples compared and not compared, by reason (``pytest ... -q -s``).

Tests (``@modules`` parametrises each over module_db):

* ``test_module``: float32, every sample of every module (2000+; ``BRICK_MODULE_DB_SAMPLES=N``
  keeps N per module, spread evenly over the ModuleInfo's list);
* ``test_module_channels_last``: the same samples with every 4-d and 5-d input, parameter and
  buffer in channels-last format (``channels_last`` / ``channels_last_3d``), where the CPU's
  kernels and formulas take other paths (group norm's backward did);
* ``test_module_float64``: float64, 4 samples per module, spread the same way
  (``BRICK_MODULE_DB_FLOAT64_SAMPLES``; ``0`` for all);
* ``test_module_other_dtype``: float16, bfloat16 and complex64 for the few modules whose ModuleInfo
  lists them (cross entropy losses, GroupNorm, the transposed convolutions), 4 samples each;
* ``test_module_errors``: the ModuleInfo's error inputs raise on brick what they raise on the CPU
  (construction-time ones involve no device and are only counted).

"The CPU" is brick's backing device: on CUDA backing (``BRICK_RUNTIME=cuda``) the reference is
``cuda:N`` for ``brick:N``, with PyTorch's own CPU/GPU parity tolerances, since brick reaches some
kernels PyTorch picks by device type by other paths there (not yet run on a GPU).

About 20 s on 2 cores (45 s with a build running beside it), run on torch 2.13. Written for the
torch versions of the lanes (2.11, 2.13, 2.14): the internal APIs that moved are guarded, and where
the ModuleInfo machinery cannot be imported the module skips, naming the version.
"""

import collections
import os
import re
import warnings

import pytest
import torch

pytest.importorskip("expecttest", reason="PyTorch's testing internals need expecttest")

try:
    from torch.testing._internal.common_device_type import instantiate_device_type_tests
    from torch.testing._internal.common_modules import module_db, modules
    from torch.testing._internal.common_utils import TestCase
except ImportError as error:  # pragma: no cover - a torch whose internal testing API moved
    pytest.skip(f"torch {torch.__version__}: PyTorch's ModuleInfo machinery is not importable "
                f"({error})", allow_module_level=True)

try:  # TrainEvalMode appeared with train/eval parametrisation (torch 1.13)
    from torch.testing._internal.common_modules import TrainEvalMode
    _BOTH_MODES = {"train_eval_mode": TrainEvalMode.train_and_eval}
    _TRAIN_ONLY = {"train_eval_mode": TrainEvalMode.train_only}
except ImportError:  # pragma: no cover
    _BOTH_MODES = _TRAIN_ONLY = {}

try:  # error inputs (torch 2.1)
    from torch.testing._internal.common_modules import ModuleErrorEnum
except ImportError:  # pragma: no cover
    ModuleErrorEnum = None

from torch.nn.utils.rnn import PackedSequence  # noqa: E402

import torch_brickdev  # noqa: E402  (registers brick before the test bases are read)

BRICK = torch._C._get_privateuse1_backend_name()
MAX_SAMPLES = int(os.environ.get("BRICK_MODULE_DB_SAMPLES", "0")) or None
FLOAT64_SAMPLES = int(os.environ.get("BRICK_MODULE_DB_FLOAT64_SAMPLES", "4")) or None
# Reduced precision and complex, for the few modules whose ModuleInfo lists them.
OTHER_DTYPES = (torch.float16, torch.bfloat16, torch.complex64)
OTHER_DTYPE_SAMPLES = 4
SEED = 20240601

# --- known failures and harness adjustments -------------------------------------------------
# Keys are ModuleInfo names ("nn.Linear"); a key "name:train" or "name:eval" applies to that mode
# only. Every entry carries its reason.

# Not run at all.
SKIPS = {}

# Samples not run, by ModuleInfo name and the sample's ``desc``.
SAMPLE_SKIPS = {}

# assert_close tolerances, where brick legitimately runs another kernel than the CPU; by
# ModuleInfo name, or by (name, dtype). Everything else must be bit-equal to the CPU.
# PyTorch's recurrent layers (ATen/native/RNN.cpp) branch on the device type (a float32 LSTM on
# oneDNN, the whole sequence's input projection, unfused cells on the CPU only): brick answers
# them at its autograd key as the CPU runs them (backing_graph.cpp), so they are bit-equal too.
TOLERANCES = {
    # PyTorch 2.14+: F.linear_cross_entropy's chunked path picks its accumulation by device
    # *type* (linear_cross_entropy_options._auto_acc_policy): "accurate" (fp32 weight-grad GEMM)
    # for "cpu" in fp16/bf16, "compact" (the GEMM in the input dtype, as accelerators do) for any
    # other device, brick included. Gradients then differ by low-precision rounding.
    ("nn.LinearCrossEntropyLoss", torch.bfloat16): dict(atol=2e-2, rtol=2e-2),
    ("nn.LinearCrossEntropyLoss", torch.float16): dict(atol=1e-3, rtol=2e-2),
}

# --- the reference: brick's backing device --------------------------------------------------

BACKING = torch_brickdev.backing_device_type()  # "cpu", or "cuda" on CUDA backing
REF = "CPU" if BACKING == "cpu" else BACKING.upper()
# On CUDA backing: the tolerances of PyTorch's test_cpu_gpu_parity (float32 and float64), and
# about a rounding step for the half types. On the host runtime brick runs the CPU's kernels on
# the CPU's memory at the same thread count: every result bit-equal.
EXACT = dict(atol=0, rtol=0)
BACKING_TOLERANCES = {} if BACKING == "cpu" else {
    torch.float32: dict(atol=5e-2, rtol=0),
    torch.float64: dict(atol=4e-4, rtol=0),
    torch.float16: dict(atol=1e-2, rtol=1e-2),
    torch.bfloat16: dict(atol=5e-2, rtol=5e-2),
    torch.complex64: dict(atol=5e-2, rtol=0),
}


def _reference(device):
    """The device brick must match: its backing device (``cuda:N`` backs ``brick:N``)."""
    if BACKING == "cpu":
        return "cpu"
    return f"{BACKING}:{torch.device(device).index or 0}"


# --- counts, printed at the end -------------------------------------------------------------

COUNTS = collections.Counter()
SAMPLE_NOT_RUN = collections.Counter()  # reason -> samples


@pytest.fixture(scope="module", autouse=True)
def _print_counts():
    yield
    print(f"\nmodule db: {COUNTS['tests']} tests run, {COUNTS['samples']} samples compared "
          f"({COUNTS['backward']} with backward, {COUNTS['no_grad']} no_grad forwards), "
          f"{sum(SAMPLE_NOT_RUN.values())} samples not compared; {COUNTS['error_inputs']} error "
          f"inputs raised as on the {REF} ({COUNTS['construction_errors']} construction-time ones "
          f"not run: no device involved)")
    for reason, count in SAMPLE_NOT_RUN.most_common():
        print(f"  {count:4d}  {reason}")


# --- copying samples ------------------------------------------------------------------------


def _channels_last_format(tensor):
    """The channels-last format for ``tensor``'s rank (4-d or 5-d), else None."""
    return {4: torch.channels_last, 5: torch.channels_last_3d}.get(tensor.dim())


def _leaf_copy(value, device, memo, channels_last=False):
    """``value`` with every tensor copied to a fresh leaf on ``device``.

    The same tensor object copies to the same copy (``memo``), so identity between arguments
    (self-attention's ``query is key is value``) holds on both devices. With ``channels_last``,
    4-d and 5-d tensors come out in the channels-last format of their rank.
    """
    if isinstance(value, torch.Tensor):
        if id(value) not in memo:
            with torch.no_grad():
                copied = value.detach().to(device, copy=True)
                if channels_last and _channels_last_format(copied) is not None:
                    copied = copied.contiguous(memory_format=_channels_last_format(copied))
            if value.requires_grad:
                copied.requires_grad_(True)
            memo[id(value)] = copied
        return memo[id(value)]
    if isinstance(value, PackedSequence):  # batch_sizes stays on the CPU on every device
        return PackedSequence(_leaf_copy(value.data, device, memo), value.batch_sizes,
                              _leaf_copy(value.sorted_indices, device, memo),
                              _leaf_copy(value.unsorted_indices, device, memo))
    if isinstance(value, tuple) and hasattr(value, "_fields"):
        return type(value)(*(_leaf_copy(v, device, memo, channels_last) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_leaf_copy(v, device, memo, channels_last) for v in value)
    if isinstance(value, dict):
        return {k: _leaf_copy(v, device, memo, channels_last) for k, v in value.items()}
    return value


def _copy_forward_input(forward_input, device, channels_last=False):
    memo = {}
    args = _leaf_copy(tuple(forward_input.args), device, memo, channels_last)
    kwargs = _leaf_copy(dict(forward_input.kwargs), device, memo, channels_last)
    return args, kwargs


def _has_channels_last_input(forward_input):
    """Whether the sample has a 4-d or 5-d tensor for the channels-last sweep to convert."""
    return any(_channels_last_format(t) is not None
               for t in _tensor_leaves((forward_input.args, forward_input.kwargs)))


def _tensor_leaves(value, seen=None):
    """Every tensor in ``value`` once, in a fixed order."""
    seen = set() if seen is None else seen
    out = []
    if isinstance(value, torch.Tensor):
        if id(value) not in seen:
            seen.add(id(value))
            out.append(value)
    elif isinstance(value, (list, tuple)):
        for v in value:
            out += _tensor_leaves(v, seen)
    elif isinstance(value, dict):
        for k in value:
            out += _tensor_leaves(value[k], seen)
    return out


# --- comparing ------------------------------------------------------------------------------


def _compare(actual, expected, what, tolerance, on_brick=True):
    """``actual`` (from brick) matches ``expected`` (from the reference), structure included."""
    if isinstance(expected, PackedSequence):
        assert isinstance(actual, PackedSequence), \
            f"{what}: {type(actual).__name__}, not PackedSequence"
        _compare(actual.data, expected.data, f"{what}.data", tolerance)
        _compare(actual.batch_sizes, expected.batch_sizes, f"{what}.batch_sizes", EXACT,
                 on_brick=False)
        for field in ("sorted_indices", "unsorted_indices"):
            _compare(getattr(actual, field), getattr(expected, field), f"{what}.{field}", EXACT)
        return
    if isinstance(expected, torch.Tensor):
        assert isinstance(actual, torch.Tensor), f"{what}: {type(actual).__name__}, not a tensor"
        device = BRICK if on_brick else "cpu"
        assert actual.device.type == device, f"{what}: on {actual.device}, not {device}"
        assert actual.dtype == expected.dtype, \
            f"{what}: dtype {actual.dtype}, {REF} {expected.dtype}"
        assert actual.shape == expected.shape, \
            f"{what}: shape {tuple(actual.shape)}, {REF} {tuple(expected.shape)}"
        if actual.numel() > 1:
            assert actual.stride() == expected.stride(), \
                f"{what}: strides {actual.stride()}, {REF} {expected.stride()}"
        torch.testing.assert_close(actual.detach().cpu(), expected.detach().cpu(),
                                   equal_nan=True, msg=lambda m: f"{what}: {m}", **tolerance)
        return
    if isinstance(expected, (list, tuple)):
        assert isinstance(actual, (list, tuple)) and len(actual) == len(expected), (
            f"{what}: {type(actual).__name__} {actual!r:.80}, "
            f"{REF} {type(expected).__name__} of {len(expected)}")
        for i, (a, e) in enumerate(zip(actual, expected)):
            _compare(a, e, f"{what}[{i}]", tolerance, on_brick)
        return
    if isinstance(expected, dict):
        assert isinstance(actual, dict) and actual.keys() == expected.keys(), f"{what}: keys differ"
        for k in expected:
            _compare(actual[k], expected[k], f"{what}[{k!r}]", tolerance, on_brick)
        return
    assert actual == expected, f"{what}: {actual!r}, {REF} {expected!r}"


def _first_line(error, lines=1):
    text = [line for line in str(error).strip().splitlines() if line.strip()][:lines]
    return f"{type(error).__name__}: " + " | ".join(line.strip()[:300] for line in text)


# --- one sample -----------------------------------------------------------------------------


class _NotCompared(Exception):
    """The reference itself rejects this sample: nothing to compare it with."""


def _build(module_info, module_input, dtype, training, device, channels_last=False):
    args, kwargs = module_input.constructor_input.args, module_input.constructor_input.kwargs
    torch.manual_seed(SEED)
    module = module_info.module_cls(*args, **kwargs)
    if dtype is not None:
        module.to(dtype)
    module.to(device)
    if channels_last:  # 4-d and 5-d parameters and buffers, as Module.to(memory_format=) would
        module._apply(lambda t: t if _channels_last_format(t) is None
                      else t.contiguous(memory_format=_channels_last_format(t)))
    module.train(training)
    return module


def _run(module, args, kwargs):
    torch.manual_seed(SEED + 1)
    return module(*args, **kwargs)


def _state(module):
    return {"params": dict(module.named_parameters()), "buffers": dict(module.named_buffers())}


def _compare_sample(module_info, module_input, dtype, training, device, tolerance,
                    channels_last=False):
    """Runs one sample on the reference and on brick and compares; returns what was compared."""
    done = []
    reference = _reference(device)
    try:
        ref_module = _build(module_info, module_input, dtype, training, reference, channels_last)
    except Exception as error:
        raise _NotCompared(f"{REF} construction raised {_first_line(error)}") from None
    brick_module = _build(module_info, module_input, dtype, training, device, channels_last)
    ref_args, ref_kwargs = _copy_forward_input(module_input.forward_input, reference,
                                               channels_last)
    brick_args, brick_kwargs = _copy_forward_input(module_input.forward_input, device,
                                                   channels_last)

    if issubclass(module_info.module_cls, torch.nn.modules.lazy.LazyModuleMixin):
        # Lazy modules take their shapes from a first input.
        with torch.no_grad():
            try:
                _run(ref_module, ref_args, ref_kwargs)
            except Exception as error:
                raise _NotCompared(f"{REF} forward raised {_first_line(error)}") from None
            _run(brick_module, brick_args, brick_kwargs)

    # The same parameters and buffers on both devices (brick initialises them with the same
    # generators, but the comparison must not depend on that).
    ref_state, brick_state = _state(ref_module), _state(brick_module)
    _compare({k: list(v) for k, v in brick_state.items()},
             {k: list(v) for k, v in ref_state.items()}, "parameter/buffer names", EXACT)
    with torch.no_grad():
        for kind in ref_state:
            for name, t in ref_state[kind].items():
                brick_state[kind][name].copy_(t)

    # === forward ===
    try:
        expected = _run(ref_module, ref_args, ref_kwargs)
    except Exception as error:
        raise _NotCompared(f"{REF} forward raised {_first_line(error)}") from None
    actual = _run(brick_module, brick_args, brick_kwargs)
    _compare(actual, expected, "output", tolerance)
    _compare((brick_args, brick_kwargs), (ref_args, ref_kwargs), "inputs after forward", EXACT)
    _compare(_state(brick_module)["buffers"], _state(ref_module)["buffers"],
             "buffers after forward", tolerance)
    done.append("forward")

    # === backward ===
    expected_outs = [t for t in _tensor_leaves(expected) if t.requires_grad]
    ref_leaves = [t for t in _tensor_leaves((ref_args, ref_kwargs)) if t.requires_grad]
    ref_leaves += [p for p in ref_module.parameters() if p.requires_grad]
    if expected_outs and ref_leaves:
        actual_outs = [t for t in _tensor_leaves(actual) if t.requires_grad]
        brick_leaves = [t for t in _tensor_leaves((brick_args, brick_kwargs)) if t.requires_grad]
        brick_leaves += [p for p in brick_module.parameters() if p.requires_grad]
        assert len(actual_outs) == len(expected_outs), \
            f"{len(actual_outs)} differentiable outputs, {REF} {len(expected_outs)}"
        assert len(brick_leaves) == len(ref_leaves), "differentiable inputs differ"
        # A fixed random output gradient (not ones), so every element of the backward matters.
        generator = torch.Generator().manual_seed(SEED + 2)
        grads = [torch.randn(o.shape, dtype=o.dtype, generator=generator) for o in expected_outs]
        try:
            expected_grads = torch.autograd.grad(expected_outs, ref_leaves,
                                                 [g.to(reference) for g in grads],
                                                 allow_unused=True)
        except Exception as error:
            SAMPLE_NOT_RUN[f"{module_info.name}: backward not compared, {REF} backward raised "
                           f"{_first_line(error)[:120]}"] += 1
        else:
            actual_grads = torch.autograd.grad(actual_outs, brick_leaves,
                                               [g.to(device) for g in grads], allow_unused=True)
            _compare(list(actual_grads), list(expected_grads), "grads", tolerance)
            done.append("backward")

    # === inference (evaluation mode): the no_grad fast paths ===
    if not training:
        with torch.no_grad():
            try:
                expected = _run(ref_module, ref_args, ref_kwargs)
            except Exception as error:
                raise _NotCompared(f"{REF} no_grad forward raised {_first_line(error)}") from None
            actual = _run(brick_module, brick_args, brick_kwargs)
        _compare(actual, expected, "no_grad output", tolerance)
        done.append("no_grad")
    return done


def _spread(items, limit):
    """At most ``limit`` of ``items``, spread evenly over the list (first and last included)."""
    if limit is None or len(items) <= limit:
        return list(enumerate(items))
    if limit == 1:
        return [(0, items[0])]
    step = (len(items) - 1) / (limit - 1)
    picked = sorted({round(i * step) for i in range(limit)})
    return [(i, items[i]) for i in picked]


def _skip_key(module_info, training):
    mode = "train" if training else "eval"
    for key in (f"{module_info.name}:{mode}", module_info.name):
        if key in SKIPS:
            return SKIPS[key]
    return None


def _sweep(test, device, dtype, module_info, training, limit, channels_last=False):
    reason = _skip_key(module_info, training)
    if reason:
        test.skipTest(f"{module_info.name}: {reason}")
    tolerance = TOLERANCES.get((module_info.name, dtype), TOLERANCES.get(
        module_info.name, BACKING_TOLERANCES.get(dtype, EXACT)))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # deprecations, the same on both devices
        torch.manual_seed(SEED)
        module_inputs = module_info.module_inputs_func(
            module_info, device="cpu", dtype=dtype, requires_grad=True, training=training)
    samples = _spread(module_inputs, limit)
    COUNTS["tests"] += 1
    failures, not_compared, compared = [], [], 0
    for index, module_input in samples:
        name = f"{module_info.name}[{index}{':' + module_input.desc if module_input.desc else ''}]"
        if module_input.forward_input is None:
            reason = "sample has no forward input (construction only)"
        elif channels_last and not _has_channels_last_input(module_input.forward_input):
            reason = "channels-last sweep: no 4-d or 5-d input"
        else:
            reason = SAMPLE_SKIPS.get((module_info.name, module_input.desc))
        if reason:
            not_compared.append(reason)
            SAMPLE_NOT_RUN[f"{module_info.name}: {reason}"] += 1
            continue
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                done = _compare_sample(module_info, module_input, dtype, training, device,
                                       tolerance, channels_last)
        except _NotCompared as why:
            not_compared.append(str(why))
            SAMPLE_NOT_RUN[f"{module_info.name}: {why}"] += 1
            continue
        except Exception as error:  # a brick failure: go on, report every sample at the end
            # assert_close's message: what differs, and by how much
            lines = 6 if isinstance(error, AssertionError) else 1
            failures.append(f"{name}: {_first_line(error, lines)}")
            continue
        compared += 1
        COUNTS["samples"] += 1
        COUNTS["backward"] += "backward" in done
        COUNTS["no_grad"] += "no_grad" in done
    if failures:
        raise AssertionError(f"{len(failures)} of {len(samples)} samples failed on brick:\n"
                             + "\n".join(failures))
    if not compared:
        test.skipTest(f"{module_info.name}: no sample compared: {not_compared[0]}")


def _errors(test, device, dtype, module_info, training):
    """The ModuleInfo's error inputs raise on brick what they raise on the reference."""
    if ModuleErrorEnum is None:
        test.skipTest(f"torch {torch.__version__}: common_modules has no ModuleErrorEnum")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.manual_seed(SEED)
        error_inputs = module_info.module_error_inputs_func(
            module_info, device="cpu", dtype=dtype, requires_grad=False, training=training)
    COUNTS["tests"] += 1
    for index, error_input in enumerate(error_inputs):
        module_input = error_input.module_error_input
        name = f"{module_info.name} error input {index} ({error_input.error_regex!r})"
        if error_input.error_on != ModuleErrorEnum.FORWARD_ERROR:
            COUNTS["construction_errors"] += 1  # raised before any device is involved
            continue
        outcomes = {}
        reference = _reference(device)
        for target in (reference, device):
            # No dtype conversion: some error inputs are a buffer of another dtype.
            module = _build(module_info, module_input, None, training, target)
            args, kwargs = _copy_forward_input(module_input.forward_input, target)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    _run(module, args, kwargs)
                    outcomes[target] = None
                except Exception as error:
                    outcomes[target] = error
        ref_error, brick_error = outcomes[reference], outcomes[device]
        if not isinstance(ref_error, error_input.error_type):
            # This torch's kernels no longer raise it: brick must behave as the reference does.
            SAMPLE_NOT_RUN[f"{module_info.name}: error input {index} not raised by the {REF} "
                           f"either ({_first_line(ref_error) if ref_error else 'no error'})"] += 1
            assert type(brick_error) is type(ref_error), \
                f"{name}: brick raised {brick_error!r:.200}, {REF} {ref_error!r:.200}"
            continue
        assert brick_error is not None, f"{name}: brick raised nothing"
        assert isinstance(brick_error, error_input.error_type) and \
            re.search(error_input.error_regex, str(brick_error)), \
            f"{name}: brick raised {_first_line(brick_error)}; {REF} {_first_line(ref_error)}"
        COUNTS["error_inputs"] += 1


class TestBrickModuleDB(TestCase):
    """Generic tests; ``instantiate_device_type_tests`` makes the brick class from it."""

    @modules(module_db, allowed_dtypes=(torch.float32,), **_BOTH_MODES)
    def test_module(self, device, dtype, module_info, training):
        _sweep(self, device, dtype, module_info, training, MAX_SAMPLES)

    # Every 4-d and 5-d input and parameter in its channels-last format (PyTorch's CPU kernels
    # and autograd formulas take other paths for it).
    @modules(module_db, allowed_dtypes=(torch.float32,), **_BOTH_MODES)
    def test_module_channels_last(self, device, dtype, module_info, training):
        _sweep(self, device, dtype, module_info, training, MAX_SAMPLES, channels_last=True)

    @modules(module_db, allowed_dtypes=(torch.float64,), **_BOTH_MODES)
    def test_module_float64(self, device, dtype, module_info, training):
        _sweep(self, device, dtype, module_info, training, FLOAT64_SAMPLES)

    # Only the modules whose ModuleInfo lists these dtypes get a test.
    @modules(module_db, allowed_dtypes=OTHER_DTYPES, **_BOTH_MODES)
    def test_module_other_dtype(self, device, dtype, module_info, training):
        _sweep(self, device, dtype, module_info, training, OTHER_DTYPE_SAMPLES)

    @modules([m for m in module_db if getattr(m, "module_error_inputs_func", None)],
             allowed_dtypes=(torch.float32,), **_TRAIN_ONLY)
    def test_module_errors(self, device, dtype, module_info, training):
        _errors(self, device, dtype, module_info, training)


instantiate_device_type_tests(TestBrickModuleDB, globals(), only_for=[BRICK])

_INSTANTIATED = [name for name, value in list(globals().items())
                 if isinstance(value, type) and name.startswith("TestBrickModuleDB")]


def test_instantiated_for_brick():
    """PyTorch's machinery made exactly one class, for brick, with a test for every module."""
    from torch.testing._internal import common_device_type

    if not hasattr(common_device_type, "PrivateUse1TestBase"):
        pytest.skip(f"torch {torch.__version__}: common_device_type has no PrivateUse1TestBase")
    for variable in ("PYTORCH_TESTING_DEVICE_ONLY_FOR", "PYTORCH_TESTING_DEVICE_EXCEPT_FOR"):
        if os.environ.get(variable) and not _INSTANTIATED:
            pytest.skip(f"{variable}={os.environ[variable]} leaves out the brick tests")
    assert len(_INSTANTIATED) == 1, (
        f"torch {torch.__version__}: instantiate_device_type_tests(only_for=[{BRICK!r}]) made "
        f"{_INSTANTIATED or 'no class'}")
    cls = globals()[_INSTANTIATED[0]]
    names = [n for n in dir(cls) if n.startswith("test_module_")]
    # (Older torch names the first test of a PrivateUse1 class "_privateuse1_", the rest by name.)
    assert all(f"_{BRICK}_" in n or "_privateuse1_" in n for n in names), names[:5]
    for module_info in module_db:
        prefix = f"test_module_{module_info.formatted_name}_"
        assert any(n.startswith(prefix) and n.endswith("_float32") for n in names), \
            f"no float32 test for {module_info.name}"
