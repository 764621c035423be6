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

# The files whose tests assert measured durations, ratios against known work, or verdicts that
# read the machine's load (timing accuracy, the decode contract, baselines, busy-machine
# detection, the roofline's measured peaks). scripts/run.sh runs the other tests in parallel
# (pytest-xdist) and these alone afterwards, so that no other test's work lands inside their
# measurements. A timing test elsewhere says so with @pytest.mark.timing.
TIMING_FILES = frozenset({
    "test_async_events.py", "test_busy_machine.py", "test_cli.py", "test_contract.py",
    "test_contract_file.py", "test_contract_on_demo.py", "test_cuda_backing.py", "test_demo.py",
    "test_diff.py", "test_kineto.py", "test_module_bricks.py", "test_profiler.py",
    "test_roofline.py", "test_streams_events.py", "test_trace.py",
})


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by mark
def pytest_collection_modifyitems(items):
    for item in items:
        if item.path.name in TIMING_FILES:
            item.add_marker(pytest.mark.timing)


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
