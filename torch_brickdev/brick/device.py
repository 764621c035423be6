import functools

import torch

from .. import _C
from ._utils import check_bool, describe, device_index

# torch.cuda's "no device" index: what tensor.get_device() returns for a CPU tensor.
# torch.cuda.set_device and torch.cuda.device treat it as a no-op, and so does brick.
_NO_DEVICE = -1


def is_available() -> bool:
    """True when at least one brick device can be used."""
    return _C._device_count() > 0


def is_initialized() -> bool:
    """Whether brick's runtime exists: it is created on first use (a brick tensor, a device
    query), not at import, so that importing brick initializes no GPU."""
    return _C._runtime_created_in_pid() != -1


def device_count() -> int:
    """Number of brick devices."""
    return _C._device_count()


def current_device() -> int:
    """Index of the calling thread's current brick device."""
    return _C._current_device()


def set_device(device) -> None:
    """Sets the calling thread's current brick device (an int, ``"brick:N"`` or a device).

    ``-1`` is a no-op, as for ``torch.cuda.set_device``; other negative indices are errors.
    """
    if _is_no_device(device):
        return
    _C._set_device(device_index(device, optional=False, where="torch.brick.set_device()"))


def synchronize(device=None) -> None:
    """Waits for all work on all streams of a brick device (default: the current one)."""
    _C._synchronize(device_index(device, where="torch.brick.synchronize()"))


def _is_no_device(device) -> bool:
    return isinstance(device, int) and not isinstance(device, bool) and device == _NO_DEVICE


class device:
    """Context manager that makes ``device`` the current brick device, like ``torch.cuda.device``.

    ``None`` or ``-1`` leaves the current device unchanged (other negative indices are errors).
    """

    def __init__(self, device):
        if device is None or _is_no_device(device):
            self.idx = _NO_DEVICE
        else:
            self.idx = device_index(device, optional=False, where="torch.brick.device()")
        self.prev_idx = -1

    def __enter__(self):
        self.prev_idx = _C._current_device()
        if self.idx >= 0 and self.idx != self.prev_idx:
            _C._set_device(self.idx)
        return self

    def __exit__(self, *exc):
        if self.prev_idx != _C._current_device():
            _C._set_device(self.prev_idx)
        return False


class device_of(device):
    """Context manager that makes the device of ``tensor`` current (no-op for non-brick tensors)."""

    def __init__(self, tensor: torch.Tensor):
        if not isinstance(tensor, torch.Tensor):
            raise TypeError(
                f"torch.brick.device_of(): tensor must be a torch.Tensor, got {describe(tensor)}"
            )
        super().__init__(tensor.get_device() if tensor.device.type == "brick" else _NO_DEVICE)


def init() -> None:
    """Initializes brick's runtime now, as ``torch.cuda.init`` does (it is otherwise created on
    first use). Calling it again does nothing."""
    _C._device_count()


class BrickDeviceProperties:
    """What ``torch.brick.get_device_properties`` returns: the backing device's properties,
    with the field names of ``torch.cuda``'s, marked as a brick device.

    ``backing_device`` is ``"cpu"`` on the host runtime and ``"cuda:N"`` on CUDA backing;
    ``major``/``minor`` are the GPU's compute capability there and ``0``/``0`` on the host,
    which has none.
    """

    is_brick = True

    def __init__(self, *, index: int, name: str, backing_device: str, total_memory: int,
                 multi_processor_count: int, major: int, minor: int):
        self.index = index
        self.name = name
        self.backing_device = backing_device
        self.total_memory = total_memory
        self.multi_processor_count = multi_processor_count
        self.major = major
        self.minor = minor

    def __repr__(self) -> str:
        return (
            f"BrickDeviceProperties(index={self.index}, name={self.name!r}, "
            f"backing_device={self.backing_device!r}, major={self.major}, minor={self.minor}, "
            f"total_memory={self.total_memory // (1024 * 1024)}MB, "
            f"multi_processor_count={self.multi_processor_count})"
        )


@functools.lru_cache(maxsize=None)
def _host_cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    import platform

    return platform.processor() or platform.machine() or "unknown CPU"


def get_device_properties(device=None) -> BrickDeviceProperties:
    """Properties of a brick device (default: the current one), describing its backing device."""
    index = device_index(device, where="torch.brick.get_device_properties()")
    cuda_index = _C._backing_device_index(index)
    if cuda_index >= 0:
        cuda = torch.cuda.get_device_properties(cuda_index)
        return BrickDeviceProperties(
            index=index, name=f"brick:{index} ({cuda.name})", backing_device=f"cuda:{cuda_index}",
            total_memory=cuda.total_memory, multi_processor_count=cuda.multi_processor_count,
            major=cuda.major, minor=cuda.minor)
    import os

    _, total = _C._mem_get_info(index)
    return BrickDeviceProperties(
        index=index, name=f"brick:{index} (host CPU: {_host_cpu_name()})", backing_device="cpu",
        total_memory=total, multi_processor_count=os.cpu_count() or 1, major=0, minor=0)


def get_device_name(device=None) -> str:
    """Name of a brick device: ``brick:N (<backing device's name>)``."""
    return get_device_properties(device).name


def get_device_capability(device=None) -> "tuple[int, int]":
    """``(major, minor)``: the backing GPU's compute capability on CUDA backing; ``(0, 0)`` on
    the host runtime, whose CPU has no such number."""
    properties = get_device_properties(device)
    return properties.major, properties.minor


def is_bf16_supported(including_emulation: bool = True) -> bool:
    """Whether the current brick device computes in bfloat16, as ``torch.cuda``'s function.

    On CUDA backing: the GPU's answer. On the host: the CPU kernels take bfloat16 everywhere
    (converting through float32 where the CPU lacks bf16 instructions), so with emulation
    always; natively where the CPU has AVX-512 BF16 or AMX.
    """
    check_bool(including_emulation, "including_emulation", "torch.brick.is_bf16_supported()")
    cuda_index = _C._backing_device_index(_C._current_device())
    if cuda_index >= 0:
        with torch.cuda.device(cuda_index):
            return torch.cuda.is_bf16_supported(including_emulation)
    if including_emulation:
        return True
    return torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported()


def get_amp_supported_dtype() -> "list[torch.dtype]":
    """The dtypes ``torch.amp.autocast("brick", dtype=...)`` accepts, as PyTorch asks every
    accelerator's device module (activation checkpointing opens autocast, disabled, on the
    current accelerator). Autocast itself is not supported on brick yet: an op under an enabled
    ``torch.autocast("brick")`` raises NotImplementedError saying so."""
    return [torch.float16, torch.bfloat16]
