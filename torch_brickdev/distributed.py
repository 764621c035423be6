"""torch.distributed on brick: a c10d backend named ``brick``, registered on import.

Collectives on brick tensors run on PyTorch's own engines over the backing-device aliases of
brick memory, without copies: gloo on the host runtime, NCCL on CUDA backing (where CPU tensors
get a gloo engine of their own). So ``dist.init_process_group()`` (no backend: brick is the
accelerator), ``init_process_group("brick")`` (brick and CPU tensors) and
``init_process_group("cpu:gloo,brick:brick")`` work, and DDP and FSDP2 run on brick.

Each rank's collectives run on one brick device, fixed by its first collective on brick tensors
(as NCCL binds a communicator to the device of its first use): a brick tensor on another device
later is refused with the rank and the collective named.
"""

from __future__ import annotations

import datetime
import functools
from typing import Dict, Optional

import torch
import torch.distributed as dist

from . import _C

BACKEND = "brick"

__all__ = ["BACKEND", "collective_counters", "group_info", "is_registered", "register",
           "wait_for_collectives"]

# (rank, world size) of each brick backend this process made; until one is, no collective of
# brick's ran (a profile then neither waits for nor counts them)
_groups_made = []


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

    _groups_made.append((rank, world_size))
    cpu_engine = _engine("gloo", store, rank, world_size, timeout)
    if torch_brickdev.backing_device_type() == "cuda":
        brick_engine = _engine("nccl", store, rank, world_size, timeout)
    else:
        brick_engine = cpu_engine  # brick memory is host memory: one gloo engine for both
    return _C._distributed.BrickProcessGroup(brick_engine, cpu_engine)


def is_registered() -> bool:
    return BACKEND.upper() in dist.Backend._plugins


def register() -> None:
    """Registers the ``brick`` c10d backend for brick and CPU tensors (done on import), and makes
    ``init_process_group()`` without a backend give what ``init_process_group("brick")`` gives."""
    if not dist.is_available() or is_registered():
        return
    dist.Backend.register_backend(BACKEND, _create_backend, devices=[BACKEND, "cpu"])
    _bare_init_takes_brick()


def _bare_init_takes_brick() -> None:
    """``init_process_group()`` with no backend: PyTorch picks the accelerator's backend (brick's,
    brick being the accelerator once asked for) but then makes gloo the group's default backend
    type, which this group does not have: DDP fails at construction ("Could not find backend type
    1 for Process Group with name gloo") and FSDP2 warns "No backend of type 1 found". The bare
    form is given brick's backend by name instead, as ``init_process_group("brick")`` does: brick
    and CPU tensors, one group. Any backend named explicitly is passed through untouched."""
    from torch.distributed import distributed_c10d

    pytorch_init = distributed_c10d.init_process_group
    if getattr(pytorch_init, "_brick_bare_form", False):
        return

    @functools.wraps(pytorch_init)
    def init_process_group(backend=None, *args, **kwargs):
        if backend is None or backend == dist.Backend.UNDEFINED:
            backend = BACKEND
        return pytorch_init(backend, *args, **kwargs)

    init_process_group._brick_bare_form = True
    distributed_c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group


def collective_counters() -> Dict[str, Dict[str, int]]:
    """Per collective, what this process's brick process groups ran since it started: calls,
    input bytes this rank contributed, the group size of the last call, and ``time_ns``: the time
    in the collective summed over ``timed_calls`` calls, each from its enqueue until its engine
    completed it (what the rank waited for, its peers included; a collective still running is not
    in it yet). Collectives never run are left out; {} where this PyTorch has no
    torch.distributed."""
    if not _groups_made:  # only brick's process groups run its collectives
        return {}
    return {name: {"calls": calls, "bytes": nbytes, "group_size": group, "time_ns": time_ns,
                   "timed_calls": timed}
            for name, calls, nbytes, group, time_ns, timed in _C._distributed.collective_counters()
            if calls}


def wait_for_collectives() -> int:
    """Waits for every collective brick's process groups have started (finished by their engine,
    its own bookkeeping included); how many it waited for. The profiler calls it before it stops,
    as it synchronizes the devices: DDP waits on a collective's future, which gloo completes before
    it ends its own profiling range."""
    if not _groups_made:  # only brick's process groups run its collectives
        return 0
    return _C._distributed.wait_for_collectives()


def group_info() -> Optional[dict]:
    """Rank, world size and backend of this process: from the default group while one is
    initialized, else from the launcher's environment (torchrun's ``RANK`` and ``WORLD_SIZE``,
    e.g. once the script has destroyed its group; backend then ``"brick"`` where this process made
    a brick group of that rank and size, else ``"unknown"``). None for a process that is no
    rank."""
    import os

    if dist.is_available() and dist.is_initialized():
        return {"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                "backend": str(dist.get_backend())}
    rank, world = os.environ.get("RANK"), os.environ.get("WORLD_SIZE")
    if rank is None or world is None:  # no launcher (and no exception raised on the way)
        return None
    try:
        rank, world = int(rank), int(world)
    except ValueError:
        return None
    if world < 1 or not 0 <= rank < world:
        return None
    backend = "brick" if (rank, world) in _groups_made else "unknown"
    return {"rank": rank, "world_size": world, "backend": backend}
