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

``import torch_brickdev`` installs this when ``accelerate.state`` is imported.
"""

import os

import torch
from accelerate.state import PartialState
from accelerate.utils import DistributedType

import torch_brickdev  # noqa: F401  (registers the brick device)

__all__ = ["brick_requested", "register"]


def brick_requested() -> bool:
    """Whether ``ACCELERATE_TORCH_DEVICE`` names a brick device (``brick`` or ``brick:N``)."""
    return torch.device(os.environ["ACCELERATE_TORCH_DEVICE"]).type == "brick" \
        if os.environ.get("ACCELERATE_TORCH_DEVICE") else False


def register() -> None:
    """Teaches accelerate's ``PartialState`` the brick device (idempotent)."""
    if getattr(PartialState, "_brick_installed", False):
        return
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
