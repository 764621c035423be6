"""``torch.brick``: the brick device module, mirroring ``torch.cuda`` where it makes sense."""

import os

from .device import (
    BrickDeviceProperties,
    current_device,
    device,
    device_count,
    device_of,
    get_amp_supported_dtype,
    get_device_capability,
    get_device_name,
    get_device_properties,
    init,
    is_available,
    is_bf16_supported,
    is_initialized,
    set_device,
    synchronize,
)
from .memory import (
    empty_cache,
    max_memory_allocated,
    max_memory_reserved,
    mem_get_info,
    memory_allocated,
    memory_reserved,
    memory_snapshot,
    memory_stats,
    memory_summary,
    reset_accumulated_memory_stats,
    reset_peak_memory_stats,
)
from .random import (
    default_generators,
    get_rng_state,
    get_rng_state_all,
    initial_seed,
    manual_seed,
    manual_seed_all,
    seed,
    seed_all,
    set_rng_state,
    set_rng_state_all,
)
from .streams import Event, Stream, current_stream, default_stream, set_stream, stream

__all__ = [
    "BrickDeviceProperties",
    "Event",
    "Stream",
    "current_device",
    "current_stream",
    "default_generators",
    "default_stream",
    "device",
    "device_count",
    "device_of",
    "get_amp_supported_dtype",
    "empty_cache",
    "get_device_capability",
    "get_device_name",
    "get_device_properties",
    "get_rng_state",
    "get_rng_state_all",
    "init",
    "initial_seed",
    "is_available",
    "is_bf16_supported",
    "is_initialized",
    "manual_seed",
    "manual_seed_all",
    "max_memory_allocated",
    "max_memory_reserved",
    "mem_get_info",
    "memory_allocated",
    "memory_reserved",
    "memory_snapshot",
    "memory_stats",
    "memory_summary",
    "reset_accumulated_memory_stats",
    "reset_peak_memory_stats",
    "seed",
    "seed_all",
    "set_device",
    "set_rng_state",
    "set_rng_state_all",
    "set_stream",
    "stream",
    "synchronize",
]


def _is_in_bad_fork() -> bool:
    """True in a forked child of a process whose brick devices were already CUDA devices: CUDA
    cannot be used after fork() (as for torch.cuda). The runtime is created on first use, so a
    process that forks before using brick is fine; the host runtime survives fork anyway."""
    from .. import _C

    created_in = _C._runtime_created_in_pid()
    return created_in not in (-1, os.getpid()) and _C._runtime_name() == "cuda"


def _lazy_init() -> None:
    """Creates brick's runtime now if it does not exist yet (as torch.cuda._lazy_init)."""
    from .. import _C

    _C._device_count()


def __getattr__(name: str):
    # torch.cuda._initialized, as PyTorch reads it of a device module: torch.utils.checkpoint
    # stashes and restores a device's random state only where `_initialized` is true, so that
    # recomputing a checkpointed block drops out exactly as its forward did.
    if name == "_initialized":
        return is_initialized()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
