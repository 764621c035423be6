"""transformers with a model on brick: pipelines keep it there, the Trainer says when it does not.

transformers picks a device from a fixed list of device types. A ``pipeline(task, model=m)`` with
no ``device`` moved a model the user had put on brick to the CPU and ran it there, silently; now
a pipeline given no device (and no ``device_map``) runs where its model is when that is brick.
The ``Trainer`` trains on ``TrainingArguments.device``, which accelerate decides: a model on brick
with arguments that resolved to another device is moved there with a warning that names the fix
(``ACCELERATE_TORCH_DEVICE=brick``; see :mod:`torch_brickdev.integrations.accelerate`).

``import torch_brickdev`` installs this when ``transformers.pipelines.base`` or
``transformers.trainer`` is imported.
"""

import functools
import inspect
import warnings

import torch_brickdev  # noqa: F401  (registers the brick device)

__all__ = ["register_pipeline", "register_trainer"]


def _brick_device(model):
    """The brick device ``model``'s parameters are on, or None."""
    try:
        device = next(model.parameters()).device
    except (StopIteration, AttributeError, TypeError):
        return None
    return device if device.type == "brick" else None


def register_pipeline() -> None:
    """Pipelines with no ``device`` run where their brick model is (idempotent)."""
    from transformers.pipelines.base import Pipeline

    if getattr(Pipeline.__init__, "_brick", False):
        return
    init = Pipeline.__init__
    # Where `device` sits among the positional parameters (self, model, ...): a caller may pass it
    # positionally, and then it is theirs.
    parameters = list(inspect.signature(init).parameters)
    device_position = parameters.index("device") if "device" in parameters else len(parameters)

    @functools.wraps(init)
    def __init__(self, model, *args, **kwargs):
        passed_positionally = 2 + len(args) > device_position
        if (not passed_positionally and kwargs.get("device") is None
                and getattr(model, "hf_device_map", None) is None):
            device = _brick_device(model)
            if device is not None:
                kwargs["device"] = device
        init(self, model, *args, **kwargs)

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
            warnings.warn(
                f"transformers.Trainer is moving the model from {source} to {device}: "
                f"TrainingArguments.device is {device} because accelerate does not know the brick "
                f"device. To train on brick, set ACCELERATE_TORCH_DEVICE=brick before the "
                f"TrainingArguments are made (under torchrun too).", stacklevel=3)
        return move(self, model, device)

    _move_model_to_device._brick = True
    Trainer._move_model_to_device = _move_model_to_device
