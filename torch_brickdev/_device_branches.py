"""Where PyTorch's Python code branches on the device type, brick takes its backing device's path.

PyTorch picks some implementations by device type name: an optimizer built with default
arguments runs its ``foreach`` implementation on every device in
``_get_foreach_kernels_supported_devices()`` (CUDA, XPU, MTIA and the PrivateUse1 backend) and its
per-parameter loop on the CPU. The two round differently (NAdam, RAdam and ASGD drift apart in the
last bits within a few steps), so a brick model on the host runtime would train differently from
the same model on the CPU. Brick answers these questions as its backing device does: on the host
runtime brick is left out of the devices whose default is ``foreach``; on CUDA backing it stays in.

Only the names the defaults read are replaced (``torch.optim.optimizer`` and
``torch.optim.swa_utils``); ``foreach=True`` and ``fused=True`` asked for explicitly run as asked.
"""

import functools

import torch


def _without_brick_on_the_host(devices_of):
    # Asked on every optimizer step with default arguments: the answer is worked out once (the
    # backing device is fixed for the process) and a copy handed out, as PyTorch returns a new
    # list each time.
    answer = []

    @functools.wraps(devices_of)
    def devices() -> list:
        if not answer:
            from . import backing_device_type  # the package is initialised when this is called

            names = devices_of()
            if backing_device_type() == "cpu":
                brick = torch._C._get_privateuse1_backend_name()
                names = [name for name in names if name != brick]
            answer.append(names)
        return list(answer[0])

    devices.__brick_wrapped__ = devices_of
    return devices


def install() -> None:
    """Idempotent: the wrapped functions are wrapped once."""
    import torch.optim.optimizer as optimizer
    import torch.optim.swa_utils as swa_utils

    for module in (optimizer, swa_utils):
        current = module._get_foreach_kernels_supported_devices
        if not hasattr(current, "__brick_wrapped__"):
            module._get_foreach_kernels_supported_devices = _without_brick_on_the_host(current)
