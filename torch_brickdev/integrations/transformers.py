"""transformers with brick: pipelines and device maps use brick, the Trainer says when it does not.

transformers picks a device from a fixed list of device types, which has no brick. Where that
list finds no accelerator and brick was asked for, brick is chosen instead of the CPU:

* a ``pipeline(task, model=m)`` with no ``device`` (and no ``device_map``) runs where its model
  is when that is brick, instead of moving the model to the CPU;
* a ``pipeline(..., device=N)`` (an ordinal, ``N >= 0``) runs on ``brick:N``;
* ``from_pretrained(..., device_map="auto")`` and ``pipeline(..., device_map="auto")`` place the
  model on brick's devices: accelerate's memory lookup lists them
  (:mod:`torch_brickdev.integrations.accelerate`), and such a pipeline runs on brick.

The ``Trainer`` trains on ``TrainingArguments.device``, which accelerate decides: a model on brick
with arguments that resolved to another device is moved there with a warning that names the fix
(``ACCELERATE_TORCH_DEVICE=brick``).

``import torch_brickdev`` installs this when ``transformers.pipelines.base`` or
``transformers.trainer`` is imported.
"""

import functools
import inspect

import torch

import torch_brickdev  # noqa: F401  (registers the brick device)
from torch_brickdev.integrations._warnings import ACCELERATE_RECIPE, warn_not_on_brick

__all__ = ["register_pipeline", "register_trainer"]


def _brick_device(model):
    """The brick device ``model``'s parameters are on, or None."""
    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return None
    return device if device.type == "brick" else None


def _brick_for_ordinal(device):
    """``brick:N`` for a device ordinal ``N`` where transformers knows no accelerator (and would
    take the CPU for it), else None."""
    from transformers.utils import get_available_devices

    if (isinstance(device, int) and not isinstance(device, bool) and device >= 0
            and get_available_devices() == {"cpu"}):
        return torch.device("brick", device)
    return None


def register_pipeline() -> None:
    """Pipelines run on brick where transformers would fall back to the CPU (idempotent): with no
    ``device``, where their brick model is; with an ordinal or a device map's ordinal, there."""
    from transformers.pipelines.base import Pipeline

    if getattr(Pipeline.__init__, "_brick", False):
        return
    init = Pipeline.__init__
    # Where `device` sits among the positional parameters (self, model, ...): a caller may pass it
    # positionally.
    parameters = list(inspect.signature(init).parameters)
    device_position = parameters.index("device") - 2 if "device" in parameters else None

    @functools.wraps(init)
    def __init__(self, model, *args, **kwargs):
        args = list(args)
        positional = device_position is not None and len(args) > device_position
        device = args[device_position] if positional else kwargs.get("device")
        device_map = getattr(model, "hf_device_map", None)
        if device is None and device_map is None:
            device = _brick_device(model)
        else:
            device = _brick_for_ordinal(device)
        if device is not None:
            if positional:
                args[device_position] = device
            else:
                kwargs["device"] = device
        init(self, model, *args, **kwargs)
        if device_map is not None:  # the pipeline's device is the map's first
            brick = _brick_for_ordinal(next(iter(device_map.values()), None))
            if brick is not None:
                self.device = brick

    __init__._brick = True
    Pipeline.__init__ = __init__


def register_trainer() -> None:
    """The Trainer warns when it moves a brick model to another device (idempotent)."""
    from transformers import Trainer

    if getattr(Trainer._move_model_to_device, "_brick", False):
        return
    move = Trainer._move_model_to_device

    @functools.wraps(move)
    def _move_model_to_device(self, model, device):
        source = _brick_device(model)
        if source is not None and str(device).split(":")[0] != "brick":
            warn_not_on_brick(f"transformers.Trainer is moving the model from {source} to "
                              f"{device}: TrainingArguments.device is {device}", "accelerate",
                              ACCELERATE_RECIPE, stacklevel=3)
        return move(self, model, device)

    _move_model_to_device._brick = True
    Trainer._move_model_to_device = _move_model_to_device
