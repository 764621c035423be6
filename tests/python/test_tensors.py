"""Tensor semantics on brick: zero-copy execution, views, in-place, out=, dtypes, copies, I/O."""

import io

import pytest
import torch

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
