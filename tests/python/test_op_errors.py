"""Ops given inputs brick cannot run: a clear error naming the device and the op, never a crash
or a wrong result; CPU scalars mix as they do on CUDA."""

import pytest
import torch


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
