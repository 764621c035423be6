"""Dynamo's and Inductor's device interface for brick (:class:`BrickInterface`). Imported when
``torch._dynamo.device_interface`` is (see :func:`torch_brickdev._compile.install`)."""

import torch
from torch._dynamo.device_interface import (
    DeviceInterface,
    device_interfaces,
    register_interface_for_device,
)

from .. import BACKEND_NAME

brick = torch.brick


class BrickInterface(DeviceInterface):
    """Dynamo's and Inductor's view of the brick devices, backed by ``torch.brick``."""

    device = brick.device
    Event = brick.Event
    Stream = brick.Stream

    class Worker:
        # Brick's queries work in any process (compile workers included).
        @staticmethod
        def set_device(device):
            brick.set_device(device)

        @staticmethod
        def current_device():
            return brick.current_device()

        @staticmethod
        def get_device_properties(device=None):
            return brick.get_device_properties(device)

    current_device = staticmethod(brick.current_device)
    set_device = staticmethod(brick.set_device)
    device_count = staticmethod(brick.device_count)
    is_available = staticmethod(brick.is_available)
    stream = staticmethod(brick.stream)
    current_stream = staticmethod(brick.current_stream)
    set_stream = staticmethod(brick.set_stream)
    synchronize = staticmethod(brick.synchronize)
    memory_allocated = staticmethod(brick.memory_allocated)
    get_compute_capability = staticmethod(brick.get_device_capability)
    is_bf16_supported = staticmethod(brick.is_bf16_supported)

    @staticmethod
    def exchange_device(device):
        previous = brick.current_device()
        if device != previous:
            brick.set_device(device)
        return previous

    @staticmethod
    def maybe_exchange_device(device):
        return -1 if device < 0 else BrickInterface.exchange_device(device)

    @staticmethod
    def _set_stream_by_id(stream_id, device_index, device_type):
        brick.set_stream(torch.Stream(stream_id=stream_id, device_index=device_index,
                                      device_type=device_type))

    @staticmethod
    def get_raw_stream(device_idx):
        return brick.current_stream(device_idx).stream_id

    @staticmethod
    def is_triton_capable(device=None):
        return False


def register() -> None:
    """Registers :class:`BrickInterface` for brick (idempotent)."""
    if BACKEND_NAME not in device_interfaces:
        register_interface_for_device(BACKEND_NAME, BrickInterface)
