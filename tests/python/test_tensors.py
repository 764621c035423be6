"""Tensor semantics on brick: zero-copy execution, views, in-place, out=, dtypes, copies, I/O."""

import io
import unittest.mock
import warnings

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import torch_brickdev

DTYPES = [
    torch.float32,
    torch.float64,
    torch.float16,
    torch.bfloat16,
    torch.int32,
    torch.int64,
    torch.bool,
    torch.complex64,
]


def sample(dtype, shape=(4, 5), seed=0):
    g = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=g).bool()
    if dtype.is_floating_point or dtype.is_complex:
        return torch.randn(shape, generator=g, dtype=dtype)
    return torch.randint(-50, 50, shape, generator=g, dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_and_elementwise_ops_match_cpu(dtype):
    a, b = sample(dtype, seed=1), sample(dtype, seed=2)
    ab, bb = a.to("brick"), b.to("brick")
    assert ab.dtype == dtype and ab.device.type == "brick"
    assert torch.equal(ab.cpu(), a)
    if dtype == torch.bool:
        pairs = [(a & b, ab & bb), (a | b, ab | bb), (~a, ~ab)]
    else:
        pairs = [(a + b, ab + bb), (a * b, ab * bb), (a - b, ab - bb), (a.sum(0), ab.sum(0))]
        if not dtype.is_complex:
            pairs += [(torch.maximum(a, b), torch.maximum(ab, bb)), (a.abs(), ab.abs())]
    for expected, actual in pairs:
        assert actual.device.type == "brick"
        torch.testing.assert_close(actual.cpu(), expected)


def test_ops_run_on_the_same_memory_without_copies():
    a = torch.randn(256, 256, device="brick")
    stats = torch.brick.memory_stats()
    a.mul_(2.0)  # an in-place op must not allocate at all
    after = torch.brick.memory_stats()
    assert after["allocation.all.allocated"] == stats["allocation.all.allocated"]
    b = a.relu()  # a fresh result: exactly one allocation of the result's size, adopted
    after = torch.brick.memory_stats()
    assert after["allocated_bytes.all.allocated"] - stats["allocated_bytes.all.allocated"] == b.nbytes
    assert b.data_ptr() != a.data_ptr()


def test_views_alias_their_base():
    base = torch.arange(24.0, device="brick")
    views = [
        base.view(4, 6),
        base.view(4, 6).t(),
        base.reshape(2, 3, 4),
        base[2:10],
        base.as_strided((3, 3), (2, 1), 1),
        base.view(4, 6).transpose(0, 1),
        base.view(4, 6).select(0, 1),
        base.view(4, 6).diagonal(),
        base.unfold(0, 4, 2),
        base.view(4, 6).expand(2, 4, 6),
    ]
    for view in views:
        assert view._base is base
        assert view.untyped_storage().data_ptr() == base.untyped_storage().data_ptr()
    base.add_(1)  # version counter is shared
    for view in views:
        assert view._version == base._version
    torch.testing.assert_close(views[1].cpu(), (torch.arange(24.0) + 1).view(4, 6).t())


def test_writes_through_views_reach_the_base():
    base = torch.zeros(3, 4, device="brick")
    base[1].fill_(5)
    base[:, 2].add_(1)
    base.t()[0, 0] = 7
    expected = torch.zeros(3, 4)
    expected[1].fill_(5)
    expected[:, 2].add_(1)
    expected.t()[0, 0] = 7
    assert torch.equal(base.cpu(), expected)


def test_complex_views_share_storage():
    c = torch.randn(5, dtype=torch.complex64, device="brick")
    r = torch.view_as_real(c)
    assert r.dtype == torch.float32 and r.shape == (5, 2) and r._base is c
    r[:, 1] = 0
    assert torch.all(c.imag.cpu() == 0)
    conj = c.conj()
    assert conj.is_conj()
    torch.testing.assert_close(conj.cpu(), c.cpu().conj())
    torch.testing.assert_close((conj * 2).cpu(), c.cpu().conj() * 2)


def test_in_place_ops_mutate():
    a = torch.ones(5, device="brick")
    ptr = a.data_ptr()
    a.add_(2).mul_(3).clamp_(max=8)
    assert a.data_ptr() == ptr
    assert torch.equal(a.cpu(), torch.full((5,), 8.0))


def test_out_arguments_are_written_and_resized():
    a = torch.randn(3, 4, device="brick")
    out = torch.empty(3, 4, device="brick")
    ptr = out.data_ptr()
    result = torch.mul(a, 2, out=out)
    assert result is out and out.data_ptr() == ptr
    torch.testing.assert_close(out.cpu(), a.cpu() * 2)
    small = torch.empty(0, device="brick")
    torch.matmul(a, a.t(), out=small)  # the kernel must grow the out= tensor
    assert small.shape == (3, 3) and small.device.type == "brick"
    torch.testing.assert_close(small.cpu(), a.cpu() @ a.cpu().t())
    values, indices = torch.empty(0, device="brick"), torch.empty(0, dtype=torch.long, device="brick")
    torch.max(a, dim=1, out=(values, indices))
    expected = a.cpu().max(dim=1)
    assert torch.equal(values.cpu(), expected.values) and torch.equal(indices.cpu(), expected.indices)


def test_resize_and_set():
    a = torch.arange(4.0, device="brick")
    a.resize_(2, 8)
    assert a.shape == (2, 8) and a.device.type == "brick"
    assert torch.equal(a.flatten()[:4].cpu(), torch.arange(4.0))
    # The grown part is uninitialized memory (it may hold NaN, which torch.equal never equals):
    # give it known values before views of it are compared.
    a.view(-1)[4:] = torch.arange(4.0, 16.0, device="brick")
    b = torch.empty(0, device="brick")
    b.set_(a)
    assert b.data_ptr() == a.data_ptr() and b.shape == a.shape
    c = torch.empty(0, device="brick").set_(a.untyped_storage(), 4, (3,), (1,))
    assert torch.equal(c.cpu(), a.flatten()[4:7].cpu())
    assert torch.equal(c.cpu(), torch.arange(4.0, 7.0))


def test_non_contiguous_and_zero_size_tensors():
    a = torch.randn(6, 8)
    ab = a.to("brick")
    nc = ab.t()[::2]
    assert not nc.is_contiguous()
    torch.testing.assert_close((nc * 3).cpu(), a.t()[::2] * 3)
    torch.testing.assert_close(nc.contiguous().cpu(), a.t()[::2].contiguous())
    assert torch.equal(nc.cpu(), a.t()[::2])
    z = torch.empty(0, 5, device="brick")
    assert (z + 1).shape == (0, 5)
    assert z.sum().item() == 0
    assert torch.cat([z, torch.ones(2, 5, device="brick")]).shape == (2, 5)


def test_copies_between_cpu_and_devices():
    a = torch.randn(4, 5)
    b0 = a.to("brick:0")
    b1 = b0.to("brick:1")
    assert b1.device == torch.device("brick:1")
    assert torch.equal(b1.cpu(), a)
    back = b1.to("brick:0")
    assert back.device == torch.device("brick:0") and torch.equal(back.cpu(), a)
    target = torch.zeros(4, 5, device="brick:1")
    target.copy_(b0)
    assert torch.equal(target.cpu(), a)
    nc_src = b0.t()
    dst = torch.empty(5, 4, dtype=torch.float64, device="brick:1")
    dst.copy_(nc_src)  # cross-device, non-contiguous and converting dtype
    assert torch.equal(dst.cpu(), a.t().double())
    host = torch.empty(5, 4)
    host.copy_(nc_src)
    assert torch.equal(host, a.t())


def test_print_shows_values_and_device():
    text = repr(torch.tensor([1.5, 2.5], device="brick:1"))
    assert "1.5000" in text and "device='brick:1'" in text


def test_item_tolist_numpy_and_comparisons():
    a = torch.tensor([3.0, 1.0, 2.0], device="brick")
    assert a.max().item() == 3.0
    assert a.tolist() == [3.0, 1.0, 2.0]
    assert a.cpu().numpy().tolist() == [3.0, 1.0, 2.0]
    assert bool((a > 0).all())
    assert torch.equal(torch.sort(a).values.cpu(), torch.tensor([1.0, 2.0, 3.0]))


def test_save_and_load_with_map_location(tmp_path):
    state = {"w": torch.randn(3, 3, device="brick:1"), "b": torch.arange(3, device="brick")}
    path = tmp_path / "state.pt"
    torch.save(state, path)
    loaded = torch.load(path)
    assert loaded["w"].device == torch.device("brick:1")
    assert torch.equal(loaded["w"].cpu(), state["w"].cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu["b"].device.type == "cpu"
    moved = torch.load(path, map_location="brick:0")
    assert moved["w"].device == torch.device("brick:0")
    buffer = io.BytesIO()
    torch.save(torch.nn.Linear(2, 2).to("brick").state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer)["weight"].device.type == "brick"


def test_indexing_with_brick_and_cpu_indices():
    a = torch.arange(12.0).view(3, 4)
    ab = a.to("brick")
    for index in (torch.tensor([2, 0]), torch.tensor([2, 0], device="brick")):
        assert torch.equal(ab[index].cpu(), a[index.cpu()])
    mask = ab > 5
    assert torch.equal(ab[mask].cpu(), a[a > 5])
    ab[torch.tensor([0], device="brick")] = -1.0
    a[torch.tensor([0])] = -1.0
    assert torch.equal(ab.cpu(), a)


def test_factories_on_brick():
    for tensor in (
        torch.zeros(2, 3, device="brick"),
        torch.ones(2, device="brick:1"),
        torch.full((2,), 3.0, device="brick"),
        torch.arange(5, device="brick"),
        torch.linspace(0, 1, 5, device="brick"),
        torch.eye(3, device="brick"),
        torch.randperm(6, device="brick"),
        torch.tril_indices(3, 3, device="brick"),
        torch.tensor([[1, 2]], device="brick"),
        torch.empty_like(torch.ones(2, device="brick:1")),
    ):
        assert tensor.device.type == "brick"
    assert torch.ones(2, device="brick:1").device.index == 1
    assert torch.equal(torch.tril_indices(3, 3, device="brick").cpu(), torch.tril_indices(3, 3))


def test_scaled_dot_product_attention_matches_cpu():
    q, k, v = (torch.randn(1, 2, 5, 8) for _ in range(3))
    out = torch.nn.functional.scaled_dot_product_attention(
        q.to("brick"), k.to("brick"), v.to("brick"), is_causal=True
    )
    torch.testing.assert_close(
        out.cpu(), torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    )


@pytest.mark.skipif(torch_brickdev.backing_device_type() != "cpu",
                    reason="the CPU's fused attention kernel is the host runtime's choice")
def test_cpu_flash_attention_with_a_mask_equals_the_cpu_forward_and_backward():
    # Two results, an optional mask: the attention kernel's direct path (and, for a mask left on
    # the CPU, the fallback's device error).
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    q, k, v = (torch.randn(1, 2, 5, 8, requires_grad=True) for _ in range(3))
    mask = torch.randn(5, 5)
    qb, kb, vb = (t.detach().to("brick").requires_grad_() for t in (q, k, v))
    out, logsumexp = flash(q, k, v, attn_mask=mask)
    out_b, logsumexp_b = flash(qb, kb, vb, attn_mask=mask.to("brick"))
    assert out_b.device.type == "brick" and logsumexp_b.device.type == "brick"
    torch.testing.assert_close(out_b.cpu(), out, rtol=0, atol=0)
    torch.testing.assert_close(logsumexp_b.cpu(), logsumexp, rtol=0, atol=0)
    out.sum().backward()
    out_b.sum().backward()
    for cpu_leaf, brick_leaf in ((q, qb), (k, kb), (v, vb)):
        assert brick_leaf.grad.device.type == "brick"
        torch.testing.assert_close(brick_leaf.grad.cpu(), cpu_leaf.grad, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="attn_mask"):
        flash(qb, kb, vb, attn_mask=mask)


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.complex64],
                         ids=str)
def test_same_device_copies_equal_the_cpu_and_leave_the_source_alone(dtype):
    # clone, .to(dtype) and zero_ run the backing device's kernel on the source's memory.
    cpu = sample(dtype, (2, 3, 4, 5))
    source = cpu.to("brick:1")
    for make in (
        lambda t: t.clone(),
        lambda t: t.clone(memory_format=torch.channels_last),
        lambda t: t.transpose(1, 3).clone(),
        lambda t: t.to(torch.float64),
        lambda t: t.to(torch.float16, memory_format=torch.channels_last),
        lambda t: t[:, 1].to(torch.int32),
    ):
        expected, got = make(cpu), make(source)
        assert got.device == torch.device("brick:1")
        assert got.dtype == expected.dtype and got.stride() == expected.stride()
        assert got.untyped_storage().data_ptr() != source.untyped_storage().data_ptr()
        torch.testing.assert_close(got.cpu(), expected, rtol=0, atol=0)
    assert torch.equal(source.cpu(), cpu)
    conj = torch.randn(3, dtype=torch.complex64)
    torch.testing.assert_close(conj.to("brick").conj().clone().cpu(), conj.conj().clone())
    zeroed = source[:, :, 1:3].zero_()
    cpu[:, :, 1:3].zero_()
    assert torch.equal(source.cpu(), cpu) and zeroed.device == source.device


def test_to_copies_between_devices_keep_their_path():
    # .to() that leaves the device (another brick device, the CPU, the current device without
    # an index) takes PyTorch's own path; pinned and other layouts too.
    cpu = torch.randn(4, 5)
    on_1 = cpu.to("brick:1")
    for target, dtype in (("brick:0", torch.float64), ("cpu", torch.float16), ("brick:1", None)):
        moved = on_1.to(target, dtype=dtype)
        assert moved.device == torch.device(target)
        torch.testing.assert_close(moved.cpu(), cpu.to(dtype or cpu.dtype), rtol=0, atol=0)
    with torch.brick.device(0):
        current = on_1.to("brick", dtype=torch.float64)  # no index: the current device, brick:0
    assert current.device == torch.device("brick:0")
    assert torch.equal(current.cpu(), cpu.double())
    with torch.brick.device(1):
        same = on_1.to("brick", dtype=torch.float64)
    assert same.device == torch.device("brick:1")
    assert torch.equal(same.cpu(), cpu.double())
    grad_source = on_1.clone().requires_grad_()
    (grad_source.to(torch.float64) * 2).sum().backward()
    assert torch.equal(grad_source.grad.cpu(), torch.full((4, 5), 2.0))
    assert grad_source.grad.device == torch.device("brick:1")


def test_arange_and_scalar_tensor_are_brick_tensors_equal_to_the_cpu():
    for args, kwargs in (((7,), {}), ((2, 9), {}), ((1, 2, 0.25), {}), ((10, 0, -3), {}),
                         ((5,), {"dtype": torch.bfloat16}), ((3,), {"pin_memory": False})):
        got = torch.arange(*args, device="brick:1", **kwargs)
        expected = torch.arange(*args, **kwargs)
        assert got.device == torch.device("brick:1") and got.dtype == expected.dtype
        assert torch.equal(got.cpu(), expected)
    with torch.brick.device(1):
        assert torch.arange(3, device="brick").device == torch.device("brick:1")
    scalar = torch.scalar_tensor(2.5, dtype=torch.float64, device="brick")
    assert scalar.device == torch.device("brick:0") and scalar.dim() == 0
    assert scalar.item() == 2.5 and scalar.dtype == torch.float64
    mask = torch.tensor([True, False, True])
    values = torch.tensor([1.0, 2.0, 3.0])
    where = torch.where(mask.to("brick"), values.to("brick"), -1.0)  # a scalar_tensor inside
    assert torch.equal(where.cpu(), torch.where(mask, values, -1.0))


def test_factories_name_a_bad_device_and_the_failing_op():
    with pytest.raises(RuntimeError, match=r"aten::arange.*device index 7 is out of range"):
        torch.arange(3, device="brick:7")
    with pytest.raises(RuntimeError, match=r"aten::scalar_tensor.*device index 2 is out of range"):
        torch.scalar_tensor(1.0, device="brick:2")
    # The backing device's own checks, with the op and the brick device named.
    with pytest.raises(RuntimeError, match=r"(?s)step must be nonzero.*aten::arange.*brick:0"):
        torch.arange(0, 3, 0, device="brick")


# ---- torch_openreg's test_storage.py: serialization, for brick -------------------------------


def test_serialization_location_tags_and_restore_location():
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device="brick")) == "brick:0"
    assert torch.serialization.location_tag(torch.UntypedStorage(4, device="brick:1")) == "brick:1"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        cpu_storage = torch.arange(16.0).storage()
    for index in (0, 1):
        restored = torch.serialization.default_restore_location(cpu_storage, f"brick:{index}")
        assert restored.is_brick and restored.device.index == index
        assert torch.equal(torch.tensor(restored.tolist()), torch.arange(16.0))


def test_save_load_map_location_between_brick_devices(tmp_path):
    t = torch.randn(3, 3, device="brick:0")
    path = tmp_path / "t.pt"
    torch.save(t, path)
    on1 = torch.load(path, map_location="brick:1")
    assert on1.device == torch.device("brick:1") and torch.equal(on1.cpu(), t.cpu())
    on_cpu = torch.load(path, map_location="cpu")
    assert on_cpu.is_cpu and torch.equal(on_cpu, t.cpu())


def test_legacy_numpy_rebuild_lands_on_brick():
    data = np.arange(1, 7, dtype=np.float32).reshape(2, 3)
    rebuilt = torch._utils._rebuild_device_tensor_from_numpy(data, torch.float32, "brick:1", False)
    assert rebuilt.device == torch.device("brick:1")
    assert torch.equal(rebuilt.cpu(), torch.tensor([[1.0, 2, 3], [4, 5, 6]]))


def test_storage_free_serialization_path():
    # The path PyTorch takes for backends without storage: through a CPU copy.
    x = torch.randn(2, 3)
    with unittest.mock.patch.object(torch._C, "_has_storage", return_value=False):
        xb = x.to("brick")
        rebuild = xb._reduce_ex_internal(torch.serialization.DEFAULT_PROTOCOL)[0]
        assert rebuild is torch._utils._rebuild_device_tensor_from_cpu_tensor
        buffer = io.BytesIO()
        torch.save({"x": xb}, buffer)
        buffer.seek(0)
        loaded = torch.load(buffer, weights_only=True)
        buffer.seek(0)
        loaded_cpu = torch.load(buffer, weights_only=True, map_location="cpu")
        with pytest.raises(RuntimeError,
                           match="Cannot serialize tensors on backends with no storage"):
            with torch.serialization.skip_data():
                torch.save({"x": xb}, io.BytesIO())
    assert loaded["x"].device.type == "brick" and torch.equal(loaded["x"].cpu(), x)
    assert loaded_cpu["x"].is_cpu and torch.equal(loaded_cpu["x"], x)


# ---- torch_openreg's test_utils.py: DLPack, for brick ----------------------------------------


def test_dlpack_round_trip():
    x = torch.randn(2, 3).to("brick:1")
    y = torch.from_dlpack(torch.utils.dlpack.to_dlpack(x))
    assert y.device == x.device
    assert y.data_ptr() == x.data_ptr()  # zero copy
    assert torch.equal(y.cpu(), x.cpu())


# ---- torch_openreg's test_ops.py and test_device_type.py, for brick --------------------------


def _close(actual, expected, **kw):
    assert actual.device.type == "brick", actual.device
    torch.testing.assert_close(actual.cpu(), expected, **kw)


def test_factories_fill_the_right_values():
    assert torch.zeros(3, device="brick").cpu().tolist() == [0.0, 0.0, 0.0]
    assert torch.tensor((), device="brick").shape == (0,)
    assert torch.equal(torch.ones(3, 4, device="brick").cpu(), torch.ones(3, 4))
    like = torch.ones_like(torch.randn(3, 4, device="brick:1"))
    assert like.device == torch.device("brick:1") and torch.equal(like.cpu(), torch.ones(3, 4))
    assert torch.equal(torch.full((3, 4), 5.0, device="brick").cpu(), torch.full((3, 4), 5.0))
    strided = torch.empty_strided((3, 4), (4, 1), device="brick")
    assert strided.shape == (3, 4) and strided.stride() == (4, 1)
    torch.manual_seed(5)
    r = torch.randn(3, 4, device="brick")
    torch.manual_seed(5)
    assert torch.equal(r.cpu(), torch.randn(3, 4))
    assert torch.equal(torch.triu_indices(3, 3, device="brick").cpu(),
                       torch.tensor([[0, 0, 0, 1, 1, 2], [0, 1, 2, 1, 2, 2]]))


def test_copies_between_devices_dtypes_and_non_blocking():
    a = torch.rand(10)
    assert torch.equal(a.to("brick").add(2).to("cpu"), a + 2)
    assert torch.equal(torch.ones(10, device="brick:0").to("brick:1").cpu(), torch.ones(10))
    x = torch.randn(3, 4, device="brick")
    y = torch.empty(3, 4, dtype=torch.float64, device="brick")
    y.copy_(x)
    assert y.dtype == torch.float64 and torch.equal(y.cpu(), x.cpu().double())
    c = x.clone()
    assert c.data_ptr() != x.data_ptr() and torch.equal(c.cpu(), x.cpu())
    nb = torch.empty(3, 4, device="brick")
    nb.copy_(x, non_blocking=True)
    torch.brick.synchronize()
    assert torch.equal(nb.cpu(), x.cpu())
    host = torch.randn(3, 4)
    dev = torch.empty(3, 4, device="brick")
    dev.copy_(host)
    back = torch.empty(3, 4)
    back.copy_(dev)
    assert torch.equal(back, host)


def test_to_same_device_aliases_and_copy_true_copies():
    x = torch.randn(3, 4, device="brick")
    assert x.to(device="brick") is x
    assert x.to("brick:0").data_ptr() == x.data_ptr()
    z = x.to(device="brick", copy=True)
    assert z.data_ptr() != x.data_ptr() and torch.equal(z.cpu(), x.cpu())


def test_dtype_propagation():
    x = torch.randn(3, 4, device="brick")
    assert (x + x).dtype == torch.float32
    d = torch.randn(3, 4, device="brick", dtype=torch.float64)
    assert (d * 2).dtype == torch.float64
    z = x.to(dtype=torch.float64)
    assert z.dtype == torch.float64 and z.device.type == "brick"
    assert torch.equal(z.cpu(), x.cpu().double())
    i = torch.randint(0, 100, (3, 4), device="brick")
    assert i.dtype == torch.int64 and 0 <= int(i.min()) and int(i.max()) < 100
    b = torch.zeros(3, 4, device="brick", dtype=torch.bool)
    assert b.dtype == torch.bool and bool(torch.all(~b))


def test_fallback_ops_match_cpu():
    t = torch.randn(10)
    tb = t.to("brick")
    assert torch.equal(torch.masked_select(tb, tb.gt(0)).cpu(), t.masked_select(t.gt(0)))
    x = torch.tensor([[1.0, 2, 3], [2, 3, 4]], device="brick")
    y = torch.tensor([1.0, 0, 2], device="brick")
    assert torch.equal(torch.sub(x, y).cpu(), torch.tensor([[0.0, 2, 1], [1, 3, 2]]))
    idx = torch.tensor([1, 0], device="brick")
    assert torch.equal(x[idx, idx].cpu(), torch.tensor([3.0, 1.0]))
    v = torch.tensor([1.0, 2, 3], device="brick")
    out = torch._foreach_add((v, v), (v, v))
    assert all(o.device.type == "brick" and torch.equal(o.cpu(), torch.tensor([2.0, 4, 6]))
               for o in out)
    s = torch.randn(3, 4, device="brick")
    _close(s + 1.0, s.cpu() + 1.0)
    _close(s * 2.0, s.cpu() * 2.0)
    _close(torch.abs(s.t()), torch.abs(s.cpu().t()))


def test_out_into_strided_views_matches_cpu():
    # out= views of a larger tensor: one the kernel writes in place, one it must resize/copy.
    x = torch.randn(2, 2, 3)
    o = torch.randn(2, 2, 6)
    xb, ob = x.to("brick"), o.to("brick")
    torch.abs(x, out=o[:, :, 0:6:2])
    torch.abs(xb, out=ob[:, :, 0:6:2])
    assert torch.equal(ob.cpu(), o)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", "An output with one or more elements was resized")
        torch.abs(x, out=o[:, :, 0:6:3])
        torch.abs(xb, out=ob[:, :, 0:6:3])
    assert torch.equal(ob.cpu(), o)
    out = torch.empty_like(xb)
    ptr = out.data_ptr()
    assert torch.abs(xb, out=out) is out and out.data_ptr() == ptr
    assert torch.equal(out.cpu(), x.abs())


def test_view_ops_alias_and_item():
    x = torch.tensor([[1], [2], [3]], device="brick")
    e = x.expand(3, 2)
    assert e.data_ptr() == x.data_ptr()
    assert torch.equal(e.cpu(), torch.tensor([[1, 1], [2, 2], [3, 3]]))
    r = torch.randn(2, 3, 4, device="brick")
    assert r.view(6, 4).data_ptr() == r.data_ptr()
    assert torch.equal(r.reshape(6, 4).cpu(), r.cpu().reshape(6, 4))
    a = torch.arange(12.0, device="brick").view(3, 4)
    strided = torch.as_strided(a, (2, 2), (4, 1), 1)
    assert strided.data_ptr() == a.data_ptr() + 4
    assert torch.equal(strided.cpu(), torch.tensor([[1.0, 2], [5, 6]]))
    assert torch.tensor([5.0], device="brick").item() == 5.0


def test_set_from_tensor_and_storage():
    x = torch.randn(3, 4, device="brick")
    y = torch.empty(3, 4, device="brick").set_(x)
    assert y.data_ptr() == x.data_ptr() and torch.equal(y.cpu(), x.cpu())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        z = torch.empty(3, 4, device="brick")
        z.set_(x.storage(), 0, z.size())
    assert torch.equal(z.cpu(), x.cpu())


def test_maximum_minimum_and_out():
    x = torch.tensor([1.0, 5.0, 3.0], device="brick")
    y = torch.tensor([4.0, 2.0, 6.0], device="brick")
    assert torch.maximum(x, y).cpu().tolist() == [4.0, 5.0, 6.0]
    assert torch.minimum(x, y).cpu().tolist() == [1.0, 2.0, 3.0]
    out = torch.empty(3, device="brick")
    assert torch.maximum(x, y, out=out) is out and out.cpu().tolist() == [4.0, 5.0, 6.0]
    assert torch.minimum(x, y, out=out) is out and out.cpu().tolist() == [1.0, 2.0, 3.0]


# ---- spec: SDPA equal to the CPU's flash kernel ----------------------------------------------


def _qkv(dtype=torch.bfloat16, shape=(2, 4, 64, 32), seed=0):
    g = torch.Generator().manual_seed(seed)
    return tuple(torch.randn(shape, generator=g, dtype=dtype) for _ in range(3))


def _cpu_flash(q, k, v, **kw):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, **kw)


def test_sdpa_backend_choice_is_the_cpus():
    q, k, v = _qkv()
    qb, kb, vb = (t.to("brick") for t in (q, k, v))
    assert torch._fused_sdp_choice(qb, kb, vb) == torch._fused_sdp_choice(q, k, v)
    mask = torch.rand(2, 4, 64, 64, dtype=torch.bfloat16)
    assert (torch._fused_sdp_choice(qb, kb, vb, mask.to("brick"))
            == torch._fused_sdp_choice(q, k, v, mask))


@pytest.mark.parametrize("is_causal", [False, True], ids=["full", "causal"])
def test_sdpa_bf16_equals_cpu_flash_kernel(is_causal):
    q, k, v = _qkv()
    expected = _cpu_flash(q, k, v, is_causal=is_causal)
    out = F.scaled_dot_product_attention(q.to("brick"), k.to("brick"), v.to("brick"),
                                         is_causal=is_causal)
    assert out.device.type == "brick" and out.dtype == torch.bfloat16
    diff = (out.cpu().float() - expected.float()).abs().max().item()
    assert torch.equal(out.cpu(), expected), f"max difference {diff}"


def test_sdpa_bf16_backward_equals_cpu_flash_kernel():
    q, k, v = _qkv(seed=1)
    leaves_cpu = [t.clone().requires_grad_() for t in (q, k, v)]
    expected = _cpu_flash(*leaves_cpu, is_causal=True)
    expected.backward(torch.ones_like(expected))
    leaves = [t.to("brick").requires_grad_() for t in (q, k, v)]
    out = F.scaled_dot_product_attention(*leaves, is_causal=True)
    out.backward(torch.ones_like(out))
    assert torch.equal(out.detach().cpu(), expected.detach())
    for name, ours, theirs in zip("qkv", leaves, leaves_cpu):
        assert torch.equal(ours.grad.cpu(), theirs.grad), name


def test_sdpa_with_dropout_is_reproducible_under_a_seed():
    q, k, v = (t.to("brick") for t in _qkv(dtype=torch.float32, shape=(2, 2, 16, 8)))
    torch.manual_seed(3)
    a = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    torch.manual_seed(3)
    b = F.scaled_dot_product_attention(q, k, v, dropout_p=0.5)
    assert a.device.type == "brick" and a.shape == (2, 2, 16, 8)
    assert torch.equal(a.cpu(), b.cpu())
    assert not torch.equal(a.cpu(), F.scaled_dot_product_attention(q, k, v).cpu())
