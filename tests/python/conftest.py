import pytest
import torch

import torch_brickdev  # noqa: F401  (registers brick even with autoload disabled)


@pytest.fixture
def brick():
    return torch.device("brick")


@pytest.fixture(autouse=True)
def _restore_current_device():
    previous = torch.brick.current_device()
    yield
    torch.brick.set_device(previous)
