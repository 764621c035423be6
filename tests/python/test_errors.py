"""Bad input: a clear error naming the device and the op, never a crash or a wrong result."""

import pytest
import torch


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


def test_mixing_brick_with_cpu_where_pytorch_refuses():
    a = torch.ones(2, 2, device="brick")
    with pytest.raises(RuntimeError, match=r"brick:0 and cpu.*aten::mm"):
        torch.mm(a, torch.ones(2, 2))
    with pytest.raises(RuntimeError, match=r"brick:0 and cpu"):
        a + torch.ones(2, 2)
    with pytest.raises(RuntimeError, match=r"brick:0 and cpu|cpu and brick:0"):
        torch.ones(2, 2).add_(a)


def test_cpu_scalars_mix_like_they_do_on_cuda():
    a = torch.ones(3, device="brick")
    assert torch.equal((a + torch.tensor(2.0)).cpu(), torch.full((3,), 3.0))
    assert torch.equal(torch.where(a > 0, a, torch.tensor(0.0)).cpu(), torch.ones(3))


def test_dtype_the_backing_device_cannot_run_names_op_and_device():
    a = torch.ones(2, 2, dtype=torch.bool, device="brick")
    with pytest.raises(NotImplementedError, match=r"(?s)not implemented for 'Bool'.*aten::mm.* on brick:0"):
        a @ a


def test_op_the_backing_device_lacks_names_op_and_device():
    x = torch.ones(2, 3, device="brick")
    w = torch.ones(3, device="brick")
    with pytest.raises(NotImplementedError, match=r"(?s)miopen_batch_norm.*brick: aten::miopen_batch_norm on brick:0"):
        torch.ops.aten.miopen_batch_norm(x, w, None, None, None, True, 0.1, 1e-5)


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
