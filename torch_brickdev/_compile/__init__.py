"""``torch.compile`` on brick: brick as an Inductor device and a dynamo device interface.

On the host runtime brick memory is host memory, so Inductor's CPU code generation runs on it
as it is: the C++ kernels of Inductor's ``CppScheduling`` read and write brick tensors through
their data pointers, buffers are allocated on brick (``empty_strided(..., device='brick:N')``),
and what Inductor generates no kernel for (``extern_kernels.mm``, fallback ops) runs as brick
ops. Nothing is copied to or from the CPU.

Its parts, one job each:

* this module: the lazy registration (:func:`install`, :func:`register`) and the runtime behind
  brick that compiled code is for (CUDA backing declines graphs, below);
* :mod:`.device_interface`: dynamo's device interface for brick;
* :mod:`.convolution`: FakeTensor's convolution layouts predicted as the backing device's;
* :mod:`.ranges`: ``record_function`` ranges kept as bricks through Inductor's passes;
* :mod:`.scheduling`: Inductor's C++ kernels generated for brick (the CPU's code);
* :mod:`.cpu_branches`: the CPU's branches of Inductor's lowerings taken for brick;
* :mod:`.wrapper`: the generated Python wrapper, which marks compiled code and its ranges for
  brick's profilers;
* :mod:`.backend`: the backend's registration with Inductor (its custom pass among it).

**Lazy registration.** ``import torch_brickdev`` imports nothing of torch._dynamo or
torch._inductor (about a second). The first time Inductor sets up its backends
(``init_backend_registration()``, at the first compile), it asks the PrivateUse1 device module
for ``Scheduling``; ``install()`` gives ``torch.brick`` a module ``__getattr__`` that answers by
registering everything here itself — the backend with its custom pass, the device-op overrides
and the dynamo device interface — and then reports the attribute missing, which Inductor's hook
takes as "nothing to register" (it would otherwise register the backend again without the
pass). When Inductor is already imported at install time, everything is registered at once.
Dynamo's device interface for brick is registered on its own as soon as
``torch._dynamo.device_interface`` is imported (a one-shot post-import hook; at once when it
already is), so ``get_interface_for_device("brick")`` answers before any compile.

**Convolution layouts.** FakeTensor predicts a convolution's output layout from the backend
PyTorch would pick; for brick inputs that is ``Overrideable``, taken as contiguous, while brick
returns its backing device's layout (channels_last when the input or the weight is). Brick's
inputs are predicted as the backing device's tensors of the same sizes and strides
(:func:`.convolution.predict_as_the_backing_device`), so graphs whose weights Inductor made
channels_last pass their stride checks.

**Where Inductor tells the CPU apart by device type**, brick's code is the CPU's: kernels are
generated with the CPU as Inductor's current device (so its ``get_current_backend()`` is "cpp",
not the "triton" it assumes for other devices), and Inductor's two ``is_cpu()`` tests — which
mean "code from the C++ backend": the scheduler skips loop transformations that assume Triton's
loop groups, and buffers are realized by the CPU's heuristics — are extended to brick (the only
changes to Inductor's code generation). Where lowerings and decompositions test
``device.type == "cpu"`` to pick the C++ backend's numerics (two-pass variance, division by a
constant, small matmuls' decompositions, argmax's logical index), brick takes the CPU's branch
(:mod:`.cpu_branches`), so compiled brick code computes what compiled CPU code does, to the bit.

**Ranges in compiled code.** With ``torch._dynamo.config.capture_profiler_record_function``
on, dynamo keeps a region's ``record_function`` ranges as graph nodes; Inductor would fuse across
them and then remove them. For graphs with brick tensors brick keeps them as bricks: it reads
them at the start of the joint-graph and post-grad passes (:func:`.ranges.mark_range_segments`),
where a range boundary starts a mutation region (no pattern joins, no node moves across two
ranges) and a value read by another range is realized in its own; its scheduling fuses no two
ranges' nodes; its wrapper opens and closes each range between the kernels
(:class:`.wrapper.BrickWrapperCodegen`).

**CUDA backing.** There brick memory is GPU memory, which the host kernels must never touch,
and Inductor's GPU code on brick has not been verified on a GPU yet. The first graph with brick
tensors warns once, and every such graph is declined with dynamo's ``SkipFrame`` (Inductor's own
way to decline a graph, as for bfloat16 on GPUs without it), by the backend's custom pass before
lowering (for graphs with brick inputs or outputs) or else when the C++ backend would be created
for brick: the frame runs eagerly on brick (with ``fullgraph=True`` dynamo then reports that it
compiled no frame, with this reason). Compiled code is kept apart by the runtime behind brick:
the custom pass puts it in the cache key, and the generated module refuses to run on CUDA
backing.
"""

import sys
import warnings
from typing import Optional

import torch

from .. import _C
from .._import_hooks import after_import
from .convolution import predict_as_the_backing_device

# What Inductor's init_backend_registration() looks up on the PrivateUse1 device module.
_CODEGEN_NAMES = ("Scheduling", "PythonWrapperCodegen", "CppWrapperCodegen", "WrapperFxCodegen")

_registered = False
_unavailable: Optional[str] = None  # why this torch cannot compile for brick, once known
_warned_cuda = False
_ranges_hooked = False  # Inductor's post-grad passes read brick ranges first


def install(device_module) -> None:
    """Hooks brick into Inductor's backend set-up (cheap: imports nothing). Called once, by
    ``torch_brickdev`` after it registers ``torch.brick``."""

    previous = getattr(device_module, "__getattr__", None)

    def __getattr__(name: str):  # PEP 562: reached only for names the module lacks
        if name in _CODEGEN_NAMES:
            register()
        elif previous is not None:
            return previous(name)
        raise AttributeError(f"module {device_module.__name__!r} has no attribute {name!r}")

    device_module.__getattr__ = __getattr__
    predict_as_the_backing_device()
    if "torch._inductor.codegen.common" in sys.modules:
        # Inductor may have set up its backends before brick was loaded (it does so once).
        register()
    elif "torch._dynamo.device_interface" in sys.modules:
        register_device_interface()
    else:  # dynamo's device interfaces answer for brick as soon as they exist
        after_import("torch._dynamo.device_interface", register_device_interface)


def register_device_interface() -> None:
    """Registers brick's dynamo device interface (idempotent): ``get_interface_for_device("brick")``
    answers from the moment ``torch._dynamo.device_interface`` is imported (see
    :func:`install`)."""
    from . import device_interface

    device_interface.register()


def register() -> bool:
    """Registers brick with Inductor and dynamo (idempotent). False, with one warning, where
    this torch lacks what it needs."""
    global _registered, _unavailable, _ranges_hooked
    if not _registered and _unavailable is None:
        try:
            from . import backend

            _ranges_hooked = backend.register()
            _registered = True
        except Exception as error:  # noqa: BLE001 - never break compiles that do not use brick
            _unavailable = f"{type(error).__name__}: {error}"
            warnings.warn(
                f"torch_brickdev: torch.compile's default (Inductor) backend cannot be set up "
                f"for brick on torch {torch.__version__} ({_unavailable}); compile brick code "
                f"with torch.compile(backend='aot_eager')", RuntimeWarning, stacklevel=3)
    return _registered


def keeps_ranges() -> bool:
    """Whether code Inductor compiles for brick keeps the record_function ranges dynamo
    captured (``torch._dynamo.config.capture_profiler_record_function``) as bricks: this torch
    can capture them and brick's backend is registered with its range pass."""
    import torch._dynamo  # noqa: F401 - its config is what is asked about

    return hasattr(torch._dynamo.config, "capture_profiler_record_function") and register() \
        and _ranges_hooked


# --- the runtime behind brick that compiled code is for ----------------------------------------

def backing_for_cache_key() -> str:
    """The runtime behind brick devices for cache keys, without creating the runtime: a torch
    without CUDA can only have the host runtime."""
    if _C._runtime_created_in_pid() != -1:
        return _C._backing_device_type()
    return "cpu" if not torch.cuda._is_compiled() else "undetermined"


def decline_on_cuda_backing() -> None:
    """On CUDA backing, declines the graph being compiled (dynamo's ``SkipFrame``: the frame
    runs eagerly), warning the first time; on the host runtime, nothing."""
    global _warned_cuda
    if _C._backing_device_type() == "cpu":
        return
    from torch._dynamo.exc import SkipFrame

    if not _warned_cuda:
        _warned_cuda = True
        warnings.warn(
            "torch_brickdev: torch.compile's default (Inductor) backend does not support brick "
            "devices backed by CUDA yet (its code for them has not been verified on a GPU); "
            "frames that compute on brick run eagerly instead. "
            "torch.compile(backend='aot_eager') compiles them.", RuntimeWarning, stacklevel=2)
    raise SkipFrame("torch_brickdev: Inductor does not support CUDA-backed brick devices yet")


def check_host_backing() -> None:
    """Run by every module Inductor generates for brick: its kernels are host code."""
    if _C._backing_device_type() != "cpu":
        raise RuntimeError(
            "torch_brickdev: this code was compiled by Inductor for brick's host runtime and "
            "cannot run on CUDA-backed brick devices; it was found in Inductor's cache (clear "
            "it, or set TORCHINDUCTOR_CACHE_DIR to a new directory)")
