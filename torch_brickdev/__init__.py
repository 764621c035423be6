"""torch_brickdev: the ``brick`` device for PyTorch.

Importing this package registers PyTorch's PrivateUse1 device under the name ``brick``: ops on
``device="brick"`` run on a real backing device (the host CPU, or a CUDA GPU where the runtime
supports one) on the same memory, and ``torch.brick`` mirrors ``torch.cuda``. Nothing loads it
unasked: ``import torch`` does only under ``BRICK_AUTOLOAD=1`` (torch_brickdev_autoload.py). From
then on PyTorch takes brick for the process's accelerator (``torch.accelerator``).
"""

from typing import Optional

import torch

try:
    from . import _C  # loads the backend and registers it with PyTorch
except ImportError as error:  # pragma: no cover - only on a broken install or configuration
    reason = str(error).splitlines()[0] if str(error) else ""
    if reason.startswith("brick:"):  # brick's own verdict, e.g. on BRICK_RUNTIME: say just that
        raise ImportError(reason) from None
    raise ImportError(
        "torch_brickdev: the native module torch_brickdev._C is missing or does not match the "
        f"installed torch ({torch.__version__}); rebuild with "
        "`pip install --no-build-isolation --no-deps -e .`"
    ) from error

__all__ = [
    "BACKEND_NAME",
    "backing_device_type",
    "backing_stream",
    "profiler",
    "runtime_name",
    "runtime_note",
]

BACKEND_NAME = "brick"


def _register() -> None:
    current = torch._C._get_privateuse1_backend_name()
    if current == BACKEND_NAME:
        return  # already registered (autoload followed by an explicit import)
    if current != "privateuseone":
        raise RuntimeError(
            f"torch_brickdev: PrivateUse1 is already registered as {current!r}; "
            f"only one PrivateUse1 backend can be loaded per process"
        )
    torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    from . import _compile, brick as _device_module

    torch._register_device_module(BACKEND_NAME, _device_module)
    _compile.install(_device_module)  # torch.compile's Inductor backend on brick, set up lazily
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )


def runtime_name() -> str:
    """Name of the runtime behind the brick devices: ``"host"`` or ``"cuda"``.

    Chosen once per process by ``BRICK_RUNTIME`` (``auto``, the default: CUDA when this PyTorch
    can run CUDA kernels and a GPU is usable; ``host``; ``cuda``, an error when it cannot be had).
    """
    return _C._runtime_name()


def runtime_note() -> str:
    """One sentence saying which runtime was chosen and why (e.g. why ``auto`` chose the host)."""
    return _C._runtime_note()


def backing_device_type() -> str:
    """Device type whose kernels execute brick ops: ``"cpu"`` (host runtime) or ``"cuda"``."""
    return _C._backing_device_type()


def backing_stream(stream: Optional["torch.Stream"] = None) -> "torch.cuda.Stream":
    """The ``torch.cuda.Stream`` behind a brick stream (default: the current one) on CUDA backing,
    e.g. to capture brick work into a CUDA graph or to order it with plain ``cuda`` work."""
    if stream is None:
        stream = torch.brick.current_stream()
    if not isinstance(stream, torch.Stream) or stream.device.type != BACKEND_NAME:
        raise TypeError(
            f"torch_brickdev.backing_stream(): stream must be a brick torch.Stream or None, got "
            f"{type(stream).__name__}"
        )
    stream_id, cuda_index = _C._backing_stream(stream.device_index, stream.stream_id)
    return torch.cuda.Stream(stream_id=stream_id, device_index=cuda_index, device_type=1)


_register()

# torch.distributed's `brick` backend (c10d), where this PyTorch has torch.distributed.
if hasattr(_C, "_distributed"):
    from . import distributed as _distributed_backend  # noqa: E402

    _distributed_backend.register()

# Backward on brick runs on PyTorch's autograd device threads: they finish before the
# interpreter shuts down (see _autograd_exit).
import atexit as _atexit  # noqa: E402

from ._autograd_exit import drain_autograd_device_threads as _drain  # noqa: E402

_atexit.register(_drain)

# The profiler is part of the package's API, as torch.profiler is of torch's: usable as
# `torch_brickdev.profiler` right after `import torch_brickdev`.
from . import profiler  # noqa: E402,F401

# The tools people train with, taught the brick device the moment they are imported (each
# integration changes nothing unless brick is asked for; the libraries stay optional).
from ._import_hooks import after_import as _after_import  # noqa: E402


def _integrate(module: str, function: str):
    def register() -> None:
        import importlib

        getattr(importlib.import_module(f"torch_brickdev.integrations.{module}"), function)()

    return register


_after_import("lightning.pytorch", _integrate("lightning", "register"))
_after_import("accelerate.state", _integrate("accelerate", "register"))
_after_import("transformers.pipelines.base", _integrate("transformers", "register_pipeline"))
_after_import("transformers.trainer", _integrate("transformers", "register_trainer"))
