"""accelerate on brick, asked for with accelerate's own knob: ``ACCELERATE_TORCH_DEVICE=brick``.

accelerate picks its device and its distributed setup from a fixed list of device types. Its
``ACCELERATE_TORCH_DEVICE`` variable names any other device, and with ``brick`` a single process
already trains on brick (transformers' ``Trainer`` included). Under ``torchrun``, though, a device
accelerate does not know gets no distributed setup: every rank trained alone on the full data and
exited 0. With this integration, ``ACCELERATE_TORCH_DEVICE=brick`` under a launcher (``LOCAL_RANK``
set) makes accelerate's ``PartialState`` initialise the process group on brick's backend, place
rank *r* on ``brick:r`` (modulo the device count) and take the distributed type accelerate uses
for DDP without ``device_ids`` (``MULTI_CPU``: brick modules are wrapped as CPU modules are, and
data loaders are sharded per rank). Nothing changes unless the variable names brick, or when the
program asks for the CPU (``cpu=True``, ``TrainingArguments(use_cpu=True)``) or another backend.

Without the variable, a ``PartialState`` (and so an ``Accelerator`` or ``TrainingArguments``)
that falls back to the CPU warns, naming the variable: transformers' ``TrainingArguments`` reads
the variable itself, so it stays the one knob that puts both on the same device.

Where accelerate finds no accelerator, its memory lookup for device maps (``get_max_memory``,
behind ``device_map="auto"`` in accelerate and in transformers' ``from_pretrained``) lists brick's
devices, so that such a map places the model on brick. On the host runtime brick's memory is the
host's, so the map gets no separate CPU budget (as accelerate does for MPS).

``import torch_brickdev`` installs this when ``accelerate.state`` is imported.
"""

import functools
import os
import sys

import torch
from accelerate import utils as accelerate_utils
from accelerate.state import PartialState
from accelerate.utils import DistributedType
from accelerate.utils import modeling as accelerate_modeling

import torch_brickdev
from torch_brickdev._import_hooks import after_import
from torch_brickdev.integrations._warnings import ACCELERATE_RECIPE, warn_not_on_brick

__all__ = ["brick_requested", "register"]


def brick_requested() -> bool:
    """Whether ``ACCELERATE_TORCH_DEVICE`` names a brick device (``brick`` or ``brick:N``)."""
    return torch.device(os.environ["ACCELERATE_TORCH_DEVICE"]).type == "brick" \
        if os.environ.get("ACCELERATE_TORCH_DEVICE") else False


def _knows_an_accelerator(memory: dict) -> bool:
    """Whether accelerate's own memory lookup found an accelerator (ordinal keys, MPS)."""
    return "mps" in memory or any(isinstance(key, int) for key in memory)


def _with_brick_devices(get_max_memory):
    """accelerate's ``get_max_memory``, listing brick's devices where accelerate found none: an
    ordinal means the current accelerator to PyTorch, brick in this process."""

    @functools.wraps(get_max_memory)
    def with_brick(max_memory=None):
        if max_memory is None:
            found = get_max_memory()
            if _knows_an_accelerator(found):
                return found
            bricks = {index: torch.brick.mem_get_info(index)[0]
                      for index in range(torch.brick.device_count())}
            if torch_brickdev.backing_device_type() == "cpu":
                found.pop("cpu", None)  # brick's memory is the host's: no second budget for it
            return {**bricks, **found}  # accelerators first: device maps fill them in this order
        ordinals = sorted(key for key in max_memory if isinstance(key, int))
        if not ordinals or _knows_an_accelerator(get_max_memory()):
            return get_max_memory(max_memory)
        # A budget with brick's ordinals: accelerate would call them unavailable (it counts only
        # the devices it knows), so it checks the other entries only. Sizes are made numbers in
        # place, as accelerate does (transformers reads them back from the caller's dict).
        for key, size in max_memory.items():
            if isinstance(size, str):
                max_memory[key] = accelerate_utils.convert_file_size_to_int(size)
        others = get_max_memory({k: v for k, v in max_memory.items() if not isinstance(k, int)})
        return {**{index: max_memory[index] for index in ordinals}, **others}

    with_brick._brick = True
    return with_brick


def _install_brick_devices_in_device_maps() -> None:
    if getattr(accelerate_modeling.get_max_memory, "_brick", False):
        return
    with_brick = _with_brick_devices(accelerate_modeling.get_max_memory)
    # The module's own callers (infer_auto_device_map, get_balanced_memory) and the name that
    # others import (transformers' device maps), also where transformers imported it already.
    accelerate_modeling.get_max_memory = with_brick
    accelerate_utils.get_max_memory = with_brick
    transformers_maps = sys.modules.get("transformers.integrations.accelerate")
    if transformers_maps is not None and hasattr(transformers_maps, "accelerate_max_memory"):
        transformers_maps.accelerate_max_memory = with_brick


def _install_cpu_fallback_warning() -> None:
    default_device = PartialState.default_device

    @property
    @functools.wraps(default_device.fget)
    def warning_default_device(self) -> torch.device:
        device = default_device.fget(self)
        if device.type == "cpu":
            warn_not_on_brick("accelerate chose cpu as the device of this process (its "
                              "PartialState, Accelerator or TrainingArguments)", "accelerate",
                              ACCELERATE_RECIPE, stacklevel=4)
        return device

    PartialState.default_device = warning_default_device


def register() -> None:
    """Teaches accelerate's ``PartialState`` and device maps the brick device (idempotent)."""
    if getattr(PartialState, "_brick_installed", False):
        return
    # accelerate.state is imported from inside accelerate.utils.modeling, before the memory lookup
    # exists; the package imports big_modeling once its utils are complete.
    after_import("accelerate.big_modeling", _install_brick_devices_in_device_maps)
    _install_cpu_fallback_warning()
    prepare_backend = PartialState._prepare_backend

    def _prepare_backend(self, cpu=False, sagemaker_dp=False, backend=None):
        launched = int(os.environ.get("LOCAL_RANK", -1)) != -1
        if not (brick_requested() and launched and not cpu and not sagemaker_dp
                and backend in (None, "brick")):
            return prepare_backend(self, cpu, sagemaker_dp, backend)
        local_rank = int(os.environ["LOCAL_RANK"])
        if self.device is not None and self.device.index is None:  # "brick": this rank's device
            self.device = torch.device("brick", local_rank % torch.brick.device_count())
        torch.brick.set_device(self.device)
        return "brick", DistributedType.MULTI_CPU

    PartialState._prepare_backend = _prepare_backend
    PartialState._brick_installed = True
