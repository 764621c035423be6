"""torch_brickdev: the ``brick`` device for PyTorch.

Importing this package registers PyTorch's PrivateUse1 device under the name ``brick``: ops on
``device="brick"`` run on a real backing device (the host CPU, or a CUDA GPU where the runtime
supports one) on the same memory, and ``torch.brick`` mirrors ``torch.cuda``. Nothing loads it
unasked: ``import torch`` does only under ``BRICK_AUTOLOAD=1`` (torch_brickdev_autoload.py). From
then on PyTorch takes brick for the process's accelerator (``torch.accelerator``).

``python -m torch_brickdev`` is the one exception: the package is then only the command line's
parent, and torch and brick load when a command needs them (:func:`_start`), so that the commands
that read JSON (``check``, ``diff``, ``merge``, ``top``, every ``--help``) start at once.
"""

import sys
from typing import Optional

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
    import torch

    current = torch._C._get_privateuse1_backend_name()
    if current == BACKEND_NAME:
        return  # already registered (autoload followed by an explicit import)
    if current != "privateuseone":
        raise RuntimeError(
            f"torch_brickdev: PrivateUse1 is already registered as {current!r}; "
            f"only one PrivateUse1 backend can be loaded per process"
        )
    torch.utils.rename_privateuse1_backend(BACKEND_NAME)
    from . import _compile, _device_branches, brick as _device_module

    torch._register_device_module(BACKEND_NAME, _device_module)
    _compile.install(_device_module)  # torch.compile's Inductor backend on brick, set up lazily
    _device_branches.install()  # PyTorch's device-type defaults answered as the backing device's
    torch.utils.generate_methods_for_privateuse1_backend(
        for_tensor=True, for_module=True, for_packed_sequence=True, for_storage=True
    )


def runtime_name() -> str:
    """Name of the runtime behind the brick devices: ``"host"`` or ``"cuda"``.

    Chosen once per process by ``BRICK_RUNTIME`` (``auto``, the default: CUDA when this PyTorch
    can run CUDA kernels and a GPU is usable; ``host``; ``cuda``, an error when it cannot be had).
    """
    return _native()._runtime_name()


def runtime_note() -> str:
    """One sentence saying which runtime was chosen and why (e.g. why ``auto`` chose the host)."""
    return _native()._runtime_note()


def backing_device_type() -> str:
    """Device type whose kernels execute brick ops: ``"cpu"`` (host runtime) or ``"cuda"``."""
    return _native()._backing_device_type()


def backing_stream(stream: Optional["torch.Stream"] = None) -> "torch.cuda.Stream":
    """The ``torch.cuda.Stream`` behind a brick stream (default: the current one) on CUDA backing,
    e.g. to capture brick work into a CUDA graph or to order it with plain ``cuda`` work."""
    import torch

    if stream is None:
        stream = torch.brick.current_stream()
    if not isinstance(stream, torch.Stream) or stream.device.type != BACKEND_NAME:
        raise TypeError(
            f"torch_brickdev.backing_stream(): stream must be a brick torch.Stream or None, got "
            f"{type(stream).__name__}"
        )
    stream_id, cuda_index = _native()._backing_stream(stream.device_index, stream.stream_id)
    return torch.cuda.Stream(stream_id=stream_id, device_index=cuda_index, device_type=1)


_started = False


def _native():
    """The native module, brick started first (under ``python -m torch_brickdev`` a command may
    call the functions above before anything loaded it)."""
    _start()
    from . import _C

    return _C


def _start() -> None:
    """Loads torch and the native backend and registers brick: the device, its c10d backend, the
    autograd exit, the profiler and the libraries' integrations. Importing the package runs it;
    under ``python -m torch_brickdev`` the commands that use torch do. Runs once."""
    global _started
    if _started:
        return
    _started = True  # first: the `from . import _C` below must not come back through __getattr__
    import torch

    try:
        from . import _C  # noqa: F401  (loads the backend and registers it with PyTorch)
    except ImportError as error:  # pragma: no cover - only on a broken install or configuration
        reason = str(error).splitlines()[0] if str(error) else ""
        if reason.startswith("brick:"):  # brick's own verdict, e.g. on BRICK_RUNTIME: say just that
            raise ImportError(reason) from None
        raise ImportError(
            "torch_brickdev: the native module torch_brickdev._C is missing or does not match the "
            f"installed torch ({torch.__version__}); rebuild with "
            "`pip install --no-build-isolation --no-deps -e .`"
        ) from error

    _register()

    # torch.distributed's `brick` backend (c10d), where this PyTorch has torch.distributed.
    if hasattr(_C, "_distributed"):
        from . import distributed

        distributed.register()

    # Backward on brick runs on PyTorch's autograd device threads: they finish before the
    # interpreter shuts down (see _autograd_exit).
    import atexit

    from ._autograd_exit import drain_autograd_device_threads

    atexit.register(drain_autograd_device_threads)

    # The profiler is part of the package's API, as torch.profiler is of torch's: usable as
    # `torch_brickdev.profiler` right after `import torch_brickdev`. torch.profiler on a PyTorch
    # without Kineto's PrivateUse1 registry: a warning, not silence.
    from . import profiler  # noqa: F401
    from .profiler._kineto import warn_where_unavailable

    warn_where_unavailable()

    # The tools people train with, taught the brick device the moment they are imported (each
    # integration changes nothing unless brick is asked for; the libraries stay optional).
    from ._import_hooks import after_import

    after_import("lightning.pytorch", _integrate("lightning", "register"))
    after_import("accelerate.state", _integrate("accelerate", "register"))
    after_import("transformers.pipelines.base", _integrate("transformers", "register_pipeline"))
    after_import("transformers.trainer", _integrate("transformers", "register_trainer"))


def _integrate(module: str, function: str):
    def register() -> None:
        import importlib

        getattr(importlib.import_module(f"torch_brickdev.integrations.{module}"), function)()

    return register


def _command_line_is_starting() -> bool:
    """True while ``python -m torch_brickdev`` imports this package as the parent of its
    ``__main__``: CPython sets ``sys.argv[0]`` to ``"-m"`` while it locates the module, and
    ``sys.orig_argv`` holds the command as typed, the module's name (``torch_brickdev``, or
    ``-mtorch_brickdev``) right before the arguments that ``sys.argv`` holds after ``"-m"``.
    A submodule run with ``-m`` (``torch_brickdev.tools.ddp_train``) loads brick on import."""
    if sys.argv[:1] != ["-m"] or len(sys.orig_argv) < len(sys.argv):
        return False
    named = sys.orig_argv[-len(sys.argv)]
    return named == __name__ or (named.startswith("-") and named.endswith("m" + __name__))


def __getattr__(name: str):
    # Deferred by the command line: the first use of the native module (`from .. import _C` in a
    # submodule) starts the package, so that _C always runs with brick registered.
    if name == "_C" and not _started:
        _start()
        return sys.modules[f"{__name__}._C"]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


if not _command_line_is_starting():
    _start()
