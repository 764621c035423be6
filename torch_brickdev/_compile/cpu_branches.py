"""Where Inductor's lowerings and decompositions branch on ``device.type == "cpu"``, brick takes
the CPU's branch (:func:`take_the_cpus_branches`).

Those tests choose numerics and code shapes for the C++ backend: the two-pass variance of
LayerNorm, ``var`` and ``std`` (Welford elsewhere), division by a constant (a multiplication by
its reciprocal elsewhere), which small matmuls become reductions or pointwise products, argmax's
logical index on non-contiguous inputs, and the int8 ``cat`` and pad-as-``cat`` choices. Brick's
compiled code is the C++ backend's, so on brick each must go the CPU's way, or compiled brick
would differ from compiled CPU in the last bit (a compiled ``layer_norm`` over 768 did, by 4.8e-7).

How: in the functions listed below only, the constant ``"cpu"`` of those comparisons is replaced
by :data:`CPU_OR_BRICK`, a ``str`` equal to ``"cpu"`` and ``"brick"``. Nothing else in Inductor
changes: a graph on the CPU or CUDA compares equal or unequal exactly as before. Graphs reach
these lowerings for brick only on the host runtime (on CUDA backing brick's pass declines them).

Not covered, because they test ``torch.device`` objects rather than type names (brick cannot
equal the CPU's device): ``grid_sampler_2d``'s grid expansion (a speed choice, same values) and the
freezing-only passes of ``pre_grad`` and ``mkldnn_fusion`` (they need mkldnn's CPU tensors).
"""

import types

from .. import BACKEND_NAME


class _CpuOrBrick(str):
    """``"cpu"`` that brick's type name also equals (hashes as ``"cpu"``)."""

    __slots__ = ()

    def __eq__(self, other):
        return str.__eq__(self, other) is True or other == BACKEND_NAME

    def __ne__(self, other):
        return not self.__eq__(other)

    __hash__ = str.__hash__


CPU_OR_BRICK = _CpuOrBrick("cpu")

# (module, function): each function's "cpu" constants are device-type tests only (checked by
# tests/python/test_compile_cpu_branches.py on every torch the tests run on). A name this torch
# lacks is skipped: the compiled-brick-equals-compiled-CPU tests are what must hold.
CPU_BRANCHES = (
    ("torch._inductor.lowering", "use_two_step_variance"),  # LayerNorm, var, std: two-pass
    ("torch._inductor.lowering", "div_prim"),  # a / constant stays a division
    ("torch._inductor.lowering", "_make_reduction_inner"),  # argmax/argmin logical index
    ("torch._inductor.lowering", "cat"),  # int8/uint8 cat falls back, as the C++ backend needs
    ("torch._inductor.lowering", "_pad_as_cat"),  # the C++ backend's cat has no pointwise form
    ("torch._inductor.lowering", "quantized_decomposed_quantize_per_tensor_tensor"),
    ("torch._inductor.decomposition", "mm"),  # small matmuls: the CPU's decompositions
    ("torch._inductor.decomposition", "addmm"),
    ("torch._inductor.decomposition", "bmm"),
)


def _with_brick(value):
    if type(value) is str and value == "cpu":
        return CPU_OR_BRICK
    if type(value) is tuple:
        return tuple(_with_brick(item) for item in value)
    if type(value) is frozenset and "cpu" in value:  # `x in {"cpu", ...}`: found by hash
        return value | {BACKEND_NAME}
    if isinstance(value, types.CodeType):  # nested functions (a lowering's inner_fn)
        return value.replace(co_consts=tuple(_with_brick(c) for c in value.co_consts))
    return value


def _innermost(function):
    # The lowering and decomposition decorators wrap with functools.wraps.
    while hasattr(function, "__wrapped__"):
        function = function.__wrapped__
    return function


def take_the_cpus_branches() -> list:
    """Rewrites the functions of :data:`CPU_BRANCHES` this torch has (idempotent); returns
    their qualified names."""
    import importlib

    rewritten = []
    for module_name, name in CPU_BRANCHES:
        function = _innermost(getattr(importlib.import_module(module_name), name, None))
        if not isinstance(function, types.FunctionType):
            continue
        function.__code__ = _with_brick(function.__code__)
        rewritten.append(f"{module_name}.{name}")
    return rewritten
