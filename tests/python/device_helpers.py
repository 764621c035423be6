"""Shared pieces of test_devices.py and test_streams_events.py."""

import torch

import torch_brickdev  # noqa: F401  (registers brick)

COUNT = torch.brick.device_count()


def assert_device_still_works():
    x = torch.arange(6.0, device="brick").reshape(2, 3)
    assert torch.equal((x @ x.T).cpu(), torch.arange(6.0).reshape(2, 3) @ torch.arange(6.0).reshape(2, 3).T)
