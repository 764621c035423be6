import importlib.util

import pytest
import torch

# PyTorch 2.13 workaround (not a brick bug): the first legacy profile of a process imports
# torch.profiler._cupti_monitor inside __enter__; with with_stack=True the Python tracer then
# names one of that module's frames with garbage bytes and key_averages() raises
# UnicodeDecodeError. Importing it up front keeps with_stack tests deterministic. PyTorch 2.14
# no longer has the module (nor the problem).
if importlib.util.find_spec("torch.profiler._cupti_monitor") is not None:
    importlib.import_module("torch.profiler._cupti_monitor")

import torch_brickdev  # noqa: F401  (registers brick even with autoload disabled)


@pytest.fixture
def brick():
    return torch.device("brick")


@pytest.fixture(autouse=True)
def _restore_current_device():
    previous = torch.brick.current_device()
    yield
    torch.brick.set_device(previous)


@pytest.fixture
def one_thread():
    """One intra-op thread for the test (the count restored after): bit-equality with the CPU is
    compared at one thread count on both devices."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)
