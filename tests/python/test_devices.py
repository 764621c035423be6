"""The brick devices: registration, autoload, device count, the current device and its guards,
synchronize, lazy runtime creation; and their misuse, each giving the documented error, never
undefined behaviour, with the device usable afterwards."""

import multiprocessing
import os
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch
import torch.nn as nn

import torch_brickdev
from device_helpers import COUNT, assert_device_still_works
from helpers import no_autoload_env, run_python

MISSING = COUNT  # the first index that does not exist
COMMON_DTYPES = {
    torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int8, torch.uint8,
    torch.int16, torch.int32, torch.int64, torch.bool, torch.complex64, torch.complex128,
}


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


# ---- torch_openreg's test_device.py, for brick -----------------------------------------------


def test_accelerator_device_count_and_switching():
    assert torch.accelerator.device_count() == 2
    assert torch.accelerator.current_accelerator() == torch.device("brick")
    for index in range(torch.accelerator.device_count()):
        torch.accelerator.set_device_index(index)
        assert torch.accelerator.current_device_index() == index
        assert torch.brick.current_device() == index
        assert torch.randn(2, 3, device="brick").device == torch.device("brick", index)
    torch.accelerator.set_device_index(0)
    assert torch.accelerator.current_device_index() == 0


def test_accelerator_device_index_context_restores_even_after_exceptions():
    with torch.accelerator.device_index(None):
        assert torch.accelerator.current_device_index() == 0
    with pytest.raises(ValueError, match="boom"):
        with torch.accelerator.device_index(1):
            assert torch.randn(2, 2, device="brick").device.index == 1
            raise ValueError("boom")
    assert torch.accelerator.current_device_index() == 0
    with pytest.raises(RuntimeError, match="nested"):
        with torch.accelerator.device_index(1):
            with torch.accelerator.device_index(0):
                assert torch.accelerator.current_device_index() == 0
                raise RuntimeError("nested")
    assert torch.accelerator.current_device_index() == 0


def test_invalid_device_index_through_the_accelerator_api():
    with pytest.raises(RuntimeError, match=r"brick.*out of range"):
        torch.accelerator.set_device_index(2)
    assert torch.accelerator.current_device_index() == 0


def test_tensors_follow_the_current_device_and_ops_do_not_move_it():
    torch.accelerator.set_device_index(1)
    a = torch.randn(5, 5, device="brick")
    b = torch.matmul(a, a)
    s = (a + b).sum()
    assert (a.device.index, b.device.index, s.device.index) == (1, 1, 1)
    torch.testing.assert_close(b.cpu(), a.cpu() @ a.cpu())
    assert torch.accelerator.current_device_index() == 1
    torch.accelerator.set_device_index(0)
    assert torch.randn(1, device="brick").device.index == 0


def test_concurrent_device_switching_in_threads():
    threads, rounds = 4, 20
    barrier = threading.Barrier(threads, timeout=60)

    def work(thread_id):
        index = thread_id % 2
        barrier.wait()
        problems = []
        for i in range(rounds):
            torch.accelerator.set_device_index(index)
            x = torch.full((8, 8), float(i), device="brick")
            y = torch.matmul(x, torch.eye(8, device="brick"))
            total = y.sum()
            if torch.accelerator.current_device_index() != index:
                problems.append(f"thread {thread_id}: current device moved")
            if {x.device.index, y.device.index, total.device.index} != {index}:
                problems.append(f"thread {thread_id}: result on the wrong device")
            if total.item() != 64.0 * i:
                problems.append(f"thread {thread_id}: sum {total.item()} != {64.0 * i}")
        return problems

    pool = ThreadPoolExecutor(max_workers=threads)
    try:
        futures = [pool.submit(work, i) for i in range(threads)]
        problems = [p for f in futures for p in f.result(timeout=120)]
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # never wait without a deadline
    assert problems == []
    assert torch.accelerator.current_device_index() == 0  # other threads' devices are their own


def test_device_usable_after_an_op_error():
    x, y = torch.randn(5, 5, device="brick"), torch.randn(3, 3, device="brick")
    with pytest.raises(RuntimeError):
        torch.matmul(x, y)
    assert torch.accelerator.current_device_index() == 0
    z = torch.randn(5, 5, device="brick")
    torch.testing.assert_close(torch.matmul(x, z).cpu(), x.cpu() @ z.cpu())


def _spawned_worker(device_index, results):
    # Runs in a spawned interpreter (module level so that spawn can find it).
    try:
        import torch_brickdev  # noqa: F401

        torch.accelerator.set_device_index(device_index)
        x = torch.arange(16.0, device="brick").view(4, 4)
        y = torch.matmul(x, x)
        results.put(("ok", str(y.device), y.sum().item()))
    except Exception as error:  # pragma: no cover - reported to the parent
        results.put(("error", type(error).__name__, str(error)))


def test_spawned_process_computes_on_brick():
    ctx = multiprocessing.get_context("spawn")
    results = ctx.Queue()
    process = ctx.Process(target=_spawned_worker, args=(1, results))
    process.start()
    try:
        status = results.get(timeout=180)
    finally:
        process.join(timeout=60)
        if process.is_alive():
            process.kill()
            process.join(timeout=10)
    expected = (torch.arange(16.0).view(4, 4) @ torch.arange(16.0).view(4, 4)).sum().item()
    assert status == ("ok", "brick:1", expected)
    assert process.exitcode == 0


@pytest.mark.skipif(not hasattr(os, "fork") or torch_brickdev.runtime_name() != "host",
                    reason="the host runtime survives fork(); CUDA backing refuses forked children")
def test_forked_child_computes_on_brick():
    torch.brick.synchronize()  # the runtime exists in the parent before the fork
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: report and leave without running any Python clean-up
        code = 1
        try:
            os.close(read_end)
            x = torch.arange(4.0, device="brick")
            os.write(write_end, f"{(x * 2).sum().item()} {x.device}".encode())
            code = 0
        finally:
            os._exit(code)
    os.close(write_end)
    deadline = time.monotonic() + 120
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            pytest.fail("the forked child hung")
        time.sleep(0.02)
    with os.fdopen(read_end) as pipe:
        said = pipe.read()
    assert os.waitstatus_to_exitcode(status) == 0
    assert said == "12.0 brick:0"


# ---- spec: torch.brick.init and the device queries (torch.cuda semantics) --------------------


def test_brick_init_initializes_and_is_idempotent():
    torch.brick.init()
    assert torch.brick.is_initialized()
    torch.brick.init()  # a second call is a no-op, as torch.cuda.init()
    assert torch.brick.is_initialized()
    assert torch.accelerator.device_count() == 2


def test_brick_get_device_name_and_properties():
    for index in range(2):
        name = torch.brick.get_device_name(index)
        assert isinstance(name, str) and name
        assert torch.brick.get_device_name(f"brick:{index}") == name
        assert torch.brick.get_device_name(torch.device("brick", index)) == name
        props = torch.brick.get_device_properties(index)
        assert props.name == name
        assert isinstance(props.total_memory, int) and props.total_memory > 0
        assert torch.brick.get_device_capability(index) == (props.major, props.minor)
    assert torch.brick.get_device_name() == torch.brick.get_device_name(0)
    with torch.brick.device(1):
        assert torch.brick.get_device_name() == torch.brick.get_device_name(1)
    with pytest.raises((RuntimeError, ValueError, IndexError), match="brick"):
        torch.brick.get_device_properties(2)


def test_brick_get_device_capability_is_a_major_minor_pair():
    capability = torch.brick.get_device_capability()
    assert isinstance(capability, tuple) and len(capability) == 2
    assert all(isinstance(part, int) for part in capability)
    assert torch.brick.get_device_capability(1) == capability  # identical virtual devices


def test_brick_is_bf16_supported():
    assert torch.brick.is_bf16_supported() is True
    x = torch.ones(4, dtype=torch.bfloat16, device="brick")
    assert (x + x).dtype == torch.bfloat16


# ---- spec: torch.accelerator for brick -------------------------------------------------------


def test_accelerator_get_device_capability_lists_supported_dtypes():
    capability = torch.accelerator.get_device_capability("brick:0")
    assert isinstance(capability, dict)
    supported = capability["supported_dtypes"]
    assert isinstance(supported, set)
    assert COMMON_DTYPES <= supported, COMMON_DTYPES - supported
    assert torch.accelerator.get_device_capability("brick:1")["supported_dtypes"] == supported
    assert torch.accelerator.get_device_capability()["supported_dtypes"] == supported


# ---- torch_openreg's test_misc.py: the backend's name, module and generated methods ----------


def test_backend_name_and_rename():
    assert torch._C._get_privateuse1_backend_name() == "brick"
    torch.utils.rename_privateuse1_backend("brick")  # the same name again is fine
    with pytest.raises(RuntimeError, match="has already been set"):
        torch.utils.rename_privateuse1_backend("dev")
    assert torch._C._get_privateuse1_backend_name() == "brick"


def test_device_module_registration_errors_and_lookup():
    import types

    with pytest.raises(RuntimeError, match="Expected one of cpu"):
        torch._register_device_module("dev", types.ModuleType("fake"))
    with pytest.raises(RuntimeError, match="The runtime module of"):
        torch._register_device_module("brick", types.ModuleType("fake"))
    assert torch.brick is torch_brickdev.brick
    get = torch.utils.backend_registration._get_custom_mod_func
    with pytest.raises(RuntimeError, match=r"Try to call torch\.brick\.func_name_"):
        get("func_name_")
    assert get("device_count")() == 2


def test_generated_methods_exist_and_cannot_be_generated_twice():
    with pytest.raises(RuntimeError, match="The custom device module of"):
        torch.utils.generate_methods_for_privateuse1_backend()
    for cls in (torch.Tensor, torch.TypedStorage, torch.UntypedStorage,
                torch.nn.utils.rnn.PackedSequence):
        assert hasattr(cls, "is_brick") and hasattr(cls, "brick"), cls
    assert hasattr(torch.nn.Module, "brick")


def test_generated_methods_move_tensors_storages_modules_and_packed_sequences():
    x = torch.arange(16.0).view(4, 4)
    assert not x.is_brick
    for arg, index in ((torch.device("brick"), 0), (torch.device("brick:0"), 0), (0, 0), (1, 1)):
        y = x.brick(arg)
        assert y.is_brick and y.device.index == index and torch.equal(y.cpu(), x)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        typed = x.storage()
        assert not typed.is_brick and typed.brick().is_brick
    untyped = x.untyped_storage()
    assert not untyped.is_brick and untyped.brick().is_brick

    class Holder(nn.Module):
        def __init__(self):
            super().__init__()
            self.p = nn.Parameter(torch.randn(3, 3))
            self.register_buffer("b", torch.ones(2))

    m = Holder()
    assert m.p.device.type == "cpu"
    m.brick()
    assert m.p.is_brick and m.b.is_brick and isinstance(m.p, nn.Parameter)
    packed = nn.utils.rnn.PackedSequence(torch.rand(5, 3), torch.tensor([1, 1, 1, 1, 1]))
    assert not packed.is_brick
    moved = packed.brick()
    assert moved.is_brick and moved.data.is_brick
    assert torch.equal(moved.data.cpu(), packed.data)
    assert moved.batch_sizes.device.type == "cpu"  # batch sizes always stay on the CPU


def test_legacy_type_strings(monkeypatch):
    names = {
        torch.bool: "BoolTensor", torch.double: "DoubleTensor", torch.float32: "FloatTensor",
        torch.half: "HalfTensor", torch.int32: "IntTensor", torch.int64: "LongTensor",
        torch.int8: "CharTensor", torch.short: "ShortTensor", torch.uint8: "ByteTensor",
    }
    for dtype, name in names.items():
        assert torch.empty(4, 4, dtype=dtype, device="brick").type() == f"torch.brick.{name}"
    cpu = torch.randn(8)
    assert cpu.type() == "torch.FloatTensor"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        assert cpu.storage().type() == "torch.FloatStorage"
        storage = cpu.brick().storage()
        assert storage.type() == "torch.storage.TypedStorage"

        class CustomFloatStorage:
            __module__ = "torch.brick"
            __name__ = "FloatStorage"

        monkeypatch.setattr(torch.brick, "FloatStorage", CustomFloatStorage(), raising=False)
        assert storage.type() == "torch.brick.FloatStorage"
        assert cpu.int().brick().storage().type() == "torch.storage.TypedStorage"


def test_profiler_and_device_type_aliases():
    from torch._C._autograd import DeviceType
    from torch._C._profiler import ProfilerActivity

    assert ProfilerActivity.BRICK == ProfilerActivity.PrivateUse1
    assert ProfilerActivity.BRICK.name == "BRICK"
    assert str(ProfilerActivity.BRICK) == "ProfilerActivity.BRICK"
    assert DeviceType.BRICK == DeviceType.PrivateUse1
    assert DeviceType.BRICK.name == "BRICK" and str(DeviceType.BRICK) == "DeviceType.BRICK"
