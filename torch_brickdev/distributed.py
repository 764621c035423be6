"""torch.distributed on brick: a c10d backend named ``brick``, registered on import.

Collectives on brick tensors run on PyTorch's own engines over the backing-device aliases of
brick memory, without copies: gloo on the host runtime, NCCL on CUDA backing (where CPU tensors
get a gloo engine of their own). So ``dist.init_process_group()`` (no backend: brick is the
accelerator), ``init_process_group("brick")`` (brick and CPU tensors) and
``init_process_group("cpu:gloo,brick:brick")`` work, and DDP and FSDP2 run on brick.

Each rank's collectives run on one brick device: the current one when the group is created
(``torch.brick.set_device(local_rank)`` first, as with NCCL, or ``device_id=``). A brick tensor on
another device is refused with the rank and the collective named.
"""

from __future__ import annotations

import datetime
from typing import Dict, Optional

import torch
import torch.distributed as dist

from . import _C

BACKEND = "brick"

__all__ = ["BACKEND", "collective_counters", "is_registered", "register"]


def _engine(kind: str, store, rank: int, world_size: int, timeout: datetime.timedelta):
    prefixed = dist.PrefixStore(f"{kind}/", store)
    if kind == "nccl":
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(prefixed, rank, world_size, options)
    return dist.ProcessGroupGloo(prefixed, rank, world_size, timeout)


def _create_backend(store, rank: int, world_size: int, timeout: datetime.timedelta):
    """c10d's creator for ``brick``: one engine per kind of tensor, wrapped."""
    import torch_brickdev

    device = torch.brick.current_device()
    cpu_engine = _engine("gloo", store, rank, world_size, timeout)
    if torch_brickdev.backing_device_type() == "cuda":
        brick_engine = _engine("nccl", store, rank, world_size, timeout)
    else:
        brick_engine = cpu_engine  # brick memory is host memory: one gloo engine for both
    return _C._distributed.BrickProcessGroup(brick_engine, cpu_engine, device)


def is_registered() -> bool:
    return BACKEND.upper() in dist.Backend._plugins


def register() -> None:
    """Registers the ``brick`` c10d backend for brick and CPU tensors (done on import)."""
    if not dist.is_available() or is_registered():
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=[BACKEND, "cpu"])


def collective_counters() -> Dict[str, Dict[str, int]]:
    """Per collective, what this process's brick process groups ran since it started: calls,
    input bytes this rank contributed, and the group size of the last call. Collectives never run
    are left out."""
    return {name: {"calls": calls, "bytes": nbytes, "group_size": group}
            for name, calls, nbytes, group in _C._distributed.collective_counters() if calls}


def group_info(group: Optional[object] = None) -> Optional[dict]:
    """Rank, world size and backend of the default group (None when none is initialized)."""
    if not (dist.is_available() and dist.is_initialized()):
        return None
    return {"rank": dist.get_rank(group), "world_size": dist.get_world_size(group),
            "backend": str(dist.get_backend(group))}
