"""The brick devices: registration, autoload, device count, the current device and its guards,
synchronize, lazy runtime creation; and their misuse, each giving the documented error, never
undefined behaviour, with the device usable afterwards."""

import os
import threading

import pytest
import torch

import torch_brickdev
from device_helpers import COUNT, assert_device_still_works
from helpers import no_autoload_env, run_python

MISSING = COUNT  # the first index that does not exist


def test_registration_names_the_device_brick():
    assert torch._C._get_privateuse1_backend_name() == "brick"
    assert torch.device("brick").type == "brick"
    assert torch.brick is not None
    assert torch_brickdev.runtime_name() == "host"
    assert torch_brickdev.backing_device_type() == "cpu"


def test_plain_import_torch_loads_brick_under_brick_autoload():
    code = "import torch; print(torch.ones(2, device='brick').device, torch.brick.device_count())"
    out = run_python("-c", code, check=True, env=dict(os.environ, BRICK_AUTOLOAD="1"))
    assert out.stdout.split() == ["brick:0", "2"]


def test_host_device_count_comes_from_the_environment():
    code = "import torch_brickdev, torch; print(torch.brick.device_count())"
    out = run_python("-c", code, env=dict(os.environ, BRICK_HOST_DEVICES="5"))
    assert out.stdout.strip() == "5", out.stderr


def test_invalid_host_device_count_is_a_clear_import_error():
    code = "import torch_brickdev"
    out = run_python("-c", code, env=no_autoload_env(BRICK_HOST_DEVICES="zero"))
    assert out.returncode != 0
    assert "BRICK_HOST_DEVICES='zero'" in out.stderr
    assert "1 to 64" in out.stderr


def test_tensor_methods_and_properties(brick):
    cpu = torch.arange(6.0)
    t = cpu.brick()
    assert t.is_brick and not cpu.is_brick
    assert t.device == torch.device("brick", 0)
    assert cpu.to("brick:1").device == torch.device("brick", 1)
    assert torch.equal(t.cpu(), cpu)
    module = torch.nn.Linear(2, 2).brick()
    assert module.weight.device.type == "brick"
    storage = torch.UntypedStorage(8).brick()
    assert storage.device.type == "brick"


def test_availability_and_count():
    assert torch.brick.is_available()
    assert torch.brick.is_initialized()
    assert torch.brick.device_count() == 2
    assert torch.accelerator.is_available() or torch.accelerator.current_accelerator() is not None


def test_set_device_and_device_context():
    assert torch.brick.current_device() == 0
    torch.brick.set_device(1)
    assert torch.brick.current_device() == 1
    assert torch.ones(1, device="brick").device.index == 1
    torch.brick.set_device("brick:0")
    with torch.brick.device(1):
        assert torch.brick.current_device() == 1
        with torch.brick.device(torch.device("brick:0")):
            assert torch.brick.current_device() == 0
        assert torch.brick.current_device() == 1
    assert torch.brick.current_device() == 0


def test_device_of_tensor():
    t = torch.ones(1, device="brick:1")
    with torch.brick.device_of(t):
        assert torch.brick.current_device() == 1
    assert torch.brick.current_device() == 0


def test_current_device_is_per_thread():
    torch.brick.set_device(1)
    seen = []
    worker = threading.Thread(target=lambda: seen.append(torch.brick.current_device()))
    worker.start()
    worker.join(timeout=60)
    assert seen == [0]
    assert torch.brick.current_device() == 1


def test_device_guard_follows_tensors_across_devices():
    a = torch.ones(3, device="brick:1")
    b = a * 2  # runs on brick:1 whatever the current device is
    assert b.device == torch.device("brick:1")
    assert torch.brick.current_device() == 0


def test_synchronize_accepts_all_device_spellings():
    torch.brick.synchronize()
    torch.brick.synchronize(1)
    torch.brick.synchronize("brick:1")
    torch.brick.synchronize(torch.device("brick", 0))
    torch.accelerator.synchronize()


def test_importing_brick_creates_no_runtime_until_first_use():
    # A CUDA runtime initializes the GPU when created, after which forked children cannot use
    # CUDA: so importing brick (which `import torch` does) must not create it.
    script = (
        "import os, torch, torch_brickdev\n"
        "from torch_brickdev import _C\n"
        "before = _C._runtime_created_in_pid()\n"
        "torch.ones(1, device='brick')\n"
        "print(before, _C._runtime_created_in_pid() == os.getpid())\n"
    )
    out = run_python("-c", script, check=True)
    assert out.stdout.split() == ["-1", "True"]


# ---- a brick device index that does not exist ---------------------------------------------

MISSING_DEVICE_USES = {
    "factory": lambda: torch.ones(2, device=f"brick:{MISSING}"),
    "to": lambda: torch.ones(2).to(f"brick:{MISSING}"),
    "tensor.brick": lambda: torch.ones(2).brick(MISSING),
    "set_device": lambda: torch.brick.set_device(MISSING),
    "device context": lambda: torch.brick.device(MISSING).__enter__(),
    "synchronize": lambda: torch.brick.synchronize(MISSING),
    "Stream": lambda: torch.brick.Stream(device=MISSING),
    "torch.Stream": lambda: torch.Stream(device=f"brick:{MISSING}"),
    "current_stream": lambda: torch.brick.current_stream(MISSING),
    "memory_allocated": lambda: torch.brick.memory_allocated(MISSING),
    "memory_stats": lambda: torch.brick.memory_stats(MISSING),
    "manual_seed on a missing generator": lambda: torch.brick.get_rng_state(MISSING),
    "empty_strided": lambda: torch.empty_strided((2,), (1,), device=f"brick:{MISSING}"),
}


@pytest.mark.parametrize("use", MISSING_DEVICE_USES, ids=list(MISSING_DEVICE_USES))
def test_a_device_index_that_does_not_exist_is_refused(use):
    before = torch.brick.current_device()
    with pytest.raises((RuntimeError, ValueError, IndexError)) as raised:
        MISSING_DEVICE_USES[use]()
    message = str(raised.value)
    assert str(MISSING) in message, message
    assert "brick" in message, message
    assert torch.brick.current_device() == before
    assert_device_still_works()


def test_negative_device_index_is_refused():
    with pytest.raises((RuntimeError, ValueError)):
        torch.ones(2, device=torch.device("brick", -2))
    assert_device_still_works()


# ---- bad device arguments, devices mixed in one op ----------------------------------------


@pytest.mark.parametrize(
    "make",
    [
        lambda: torch.ones(1, device="brick:5"),
        lambda: torch.empty(2, 2, device="brick:9"),
        lambda: torch.ones(2).to("brick:3"),
        lambda: torch.brick.set_device(7),
        lambda: torch.brick.synchronize(2),
        lambda: torch.brick.memory_allocated(4),
        lambda: torch.brick.Stream(device=3),
    ],
    ids=["ones", "empty", "to", "set_device", "synchronize", "memory_allocated", "Stream"],
)
def test_device_index_out_of_range(make):
    with pytest.raises(RuntimeError, match=r"brick.*out of range.*0\.\.1"):
        make()
    assert torch.brick.current_device() == 0  # state unchanged


def test_mixing_brick_devices_in_one_op():
    a, b = torch.ones(3, device="brick:0"), torch.ones(3, device="brick:1")
    for op in (lambda: a + b, lambda: torch.mm(a.view(3, 1), b.view(1, 3)), lambda: torch.cat([a, b])):
        with pytest.raises(RuntimeError, match=r"brick:0 and brick:1|brick:1 and brick:0"):
            op()
    assert torch.equal(a.cpu(), torch.ones(3)) and torch.equal(b.cpu(), torch.ones(3))


def test_bad_arguments_to_the_device_module():
    with pytest.raises(TypeError, match="device"):
        torch.brick.set_device(1.5)
    with pytest.raises(ValueError, match="expected a brick device"):
        torch.brick.synchronize("cpu")
    with pytest.raises(ValueError, match="not a device"):
        torch.brick.memory_stats("nonsense:0")
    with pytest.raises(TypeError, match="seed must be an int"):
        torch.brick.manual_seed("abc")
    with pytest.raises(TypeError, match="new_state"):
        torch.brick.set_rng_state([1, 2, 3])
    with pytest.raises(TypeError, match="priority"):
        torch.brick.Stream(priority="high")
    with pytest.raises(TypeError, match="torch.Stream"):
        torch.brick.set_stream("stream")
    with pytest.raises(ValueError, match="brick stream"):
        torch.brick.set_stream(torch.Stream(device="cpu"))


def test_errors_leave_the_device_usable():
    a = torch.ones(4, device="brick")
    for _ in range(3):
        with pytest.raises(RuntimeError):
            a + torch.ones(4, device="brick:1")
    with torch.brick.device(1):
        with pytest.raises(RuntimeError):
            torch.ones(1, device="brick:8")
        assert torch.brick.current_device() == 1
    assert torch.equal((a * 2).cpu(), torch.full((4,), 2.0))
