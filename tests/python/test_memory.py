"""Memory of brick devices: statistics, adopted op results, per-device counts, profile_memory;
allocation, storages, pinned memory, and torch.brick's and torch.accelerator's memory functions."""

import gc
import warnings

import pytest
import torch

import torch_brickdev

MiB = 1024 * 1024


def test_memory_stats_track_allocations_and_peak():
    torch.brick.synchronize()
    torch.brick.reset_peak_memory_stats()
    base = torch.brick.memory_allocated()
    t = torch.empty(1024, 1024, device="brick")  # 4 MiB
    assert torch.brick.memory_allocated() == base + 4 * 1024 * 1024
    stats = torch.brick.memory_stats()
    assert stats["allocated_bytes.all.current"] == base + 4 * 1024 * 1024
    assert stats["allocation.all.current"] >= 1
    del t
    assert torch.brick.memory_allocated() == base
    assert torch.brick.max_memory_allocated() >= base + 4 * 1024 * 1024
    torch.brick.reset_peak_memory_stats()
    assert torch.brick.max_memory_allocated() == base


def test_op_results_are_counted_as_adopted_brick_memory():
    a = torch.ones(1000, device="brick")
    base = torch.brick.memory_stats()
    b = torch.relu(a)  # result allocated by the backing device, adopted by brick without a copy
    after = torch.brick.memory_stats()
    assert after["adopted_bytes.all.current"] == base["adopted_bytes.all.current"] + 4000
    assert after["allocated_bytes.all.current"] == base["allocated_bytes.all.current"] + 4000
    del b
    assert torch.brick.memory_stats()["adopted_bytes.all.current"] == base["adopted_bytes.all.current"]


def test_memory_is_per_device():
    base1 = torch.brick.memory_allocated(1)
    base0 = torch.brick.memory_allocated(0)
    t = torch.empty(256, device="brick:1")
    assert torch.brick.memory_allocated(1) == base1 + 1024
    assert torch.brick.memory_allocated(0) == base0
    del t


def test_profile_memory_sees_brick_allocations():
    with torch.autograd.profiler.profile(profile_memory=True) as prof:
        t = torch.empty(4096, device="brick")
        del t
    empty = [e for e in prof.function_events if e.name == "aten::empty"]
    assert [e.device_memory_usage for e in empty] == [4096 * 4]
    assert [e.cpu_memory_usage for e in empty] == [0]


# ---- torch_openreg's test_memory.py, for brick -----------------------------------------------


def test_allocation_shapes_dtypes_formats_and_requires_grad():
    for shape in ((100,), (10000,), (10, 20, 30), (0, 5)):
        t = torch.empty(shape, device="brick")
        assert t.device.type == "brick" and t.shape == shape
    for dtype in (torch.float32, torch.float64, torch.int32, torch.int64):
        t = torch.zeros(100, dtype=dtype, device="brick")
        assert t.dtype == dtype and int(t.sum().item()) == 0
    cl = torch.empty(2, 3, 4, 4, device="brick", memory_format=torch.channels_last)
    assert cl.is_contiguous(memory_format=torch.channels_last) and cl.stride() == (48, 1, 12, 3)
    plain = torch.empty(2, 3, 4, 4, device="brick", memory_format=torch.contiguous_format)
    assert plain.is_contiguous() and plain.stride() == (48, 16, 4, 1)
    big = torch.empty(10 * MiB // 4, device="brick")
    assert big.untyped_storage().nbytes() == 10 * MiB
    g = torch.randn(100, device="brick", requires_grad=True)
    (g * 3).sum().backward()
    assert torch.equal(g.grad.cpu(), torch.full((100,), 3.0))


def test_storage_of_a_brick_tensor():
    x = torch.randn(100, device="brick")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)  # TypedStorage is deprecated
        storage = x.storage()
        assert storage.device.type == "brick" and storage.is_brick
        assert storage.size() == x.numel()
    y = x.view_as(x)
    assert y.data_ptr() == x.data_ptr()
    x.fill_(5.0)
    assert torch.all(y == 5.0).item()
    r = torch.randn(4, 4).brick()
    assert r.untyped_storage().nbytes() == 64
    r.resize_(2, 2, 2, 2)  # same element count: the storage is kept
    assert r.shape == (2, 2, 2, 2) and r.untyped_storage().nbytes() == 64
    r.resize_(50)  # grows
    assert r.untyped_storage().nbytes() == 200


def test_alloc_free_cycles_return_memory_to_baseline():
    gc.collect()
    base = torch.brick.memory_stats()
    for i in range(200):
        size = (100, 500, 1000, 5000)[i % 4]
        x = torch.randn(size, device="brick", requires_grad=i % 2 == 0)
        views = (x.view(-1, 1), x[: size // 2], x.reshape(1, size))
        copy = x.detach().cpu().to("brick").clone()
        with torch.no_grad():
            y = x.detach().add_(1).mul_(2).div_(2).sub_(1)
        z = x + copy
        del x, views, copy, y, z
    held = [torch.empty(1000, device="brick") for _ in range(100)]
    assert torch.brick.memory_allocated() == base["allocated_bytes.all.current"] + 100 * 4000
    del held
    gc.collect()
    after = torch.brick.memory_stats()
    for key in ("allocated_bytes.all.current", "allocation.all.current",
                "adopted_bytes.all.current"):
        assert after[key] == base[key], key


def test_devices_have_disjoint_memory():
    on0 = [torch.empty(1000, device="brick:0") for _ in range(10)]
    on1 = [torch.empty(1000, device="brick:1") for _ in range(10)]
    assert {t.device.index for t in on0} == {0} and {t.device.index for t in on1} == {1}
    assert not {t.data_ptr() for t in on0} & {t.data_ptr() for t in on1}
    x = torch.randn(100, device="brick:0")
    y = x.to("brick:1")
    assert y.device.index == 1 and y.data_ptr() != x.data_ptr()
    assert torch.equal(y.to("brick:0").cpu(), x.cpu())


def test_shallow_copy_between_cpu_and_brick():
    # `param.data = other` across CPU and brick, as on openreg (the same check decides whether
    # Module.to() keeps Parameter objects, and so tied weights).
    cpu, brick = torch.randn(4, 4), torch.randn(4, 4, device="brick")
    assert torch._has_compatible_shallow_copy_type(cpu, brick)
    cpu.data = brick
    assert cpu.device.type == "brick" and cpu.data_ptr() == brick.data_ptr()
    brick2, cpu2 = torch.randn(4, 4, device="brick"), torch.randn(4, 4)
    assert torch._has_compatible_shallow_copy_type(brick2, cpu2)
    brick2.data = cpu2
    assert brick2.device.type == "cpu" and brick2.data_ptr() == cpu2.data_ptr()


# ---- spec: pinned memory ---------------------------------------------------------------------


def test_pin_memory_pins_tensors_and_their_views():
    plain = torch.randn(20)
    assert not plain.is_pinned()
    pinned = plain.pin_memory()
    assert pinned.is_pinned()
    assert torch.equal(pinned, plain)
    for view in (pinned[2:5], pinned[::2], pinned.view(4, 5)):
        assert view.is_pinned()
    shared = torch.tensor((), dtype=torch.float32).set_(pinned.untyped_storage())
    assert shared.is_pinned()
    storage = torch.randn(10).untyped_storage()
    assert not storage.is_pinned()
    assert storage.pin_memory().is_pinned()
    on_brick = pinned.to("brick", non_blocking=True)
    torch.brick.synchronize()
    assert torch.equal(on_brick.cpu(), plain)


def test_rewrapped_pinned_storage_is_pinned():
    pinned = torch.randn(10).pin_memory()
    rewrapped = torch.tensor((), dtype=torch.float32).set_(
        pinned.untyped_storage()[8:], size=(5,), stride=(1,), storage_offset=0)
    assert rewrapped.is_pinned()
    assert rewrapped.data_ptr() == pinned.data_ptr() + 8
    assert torch.equal(rewrapped, pinned[2:7])


class _Squares(torch.utils.data.Dataset):
    def __len__(self):
        return 16

    def __getitem__(self, index):
        return torch.full((3,), float(index)), torch.tensor(index * index)


@pytest.mark.parametrize("workers", [0, 2], ids=["main_process", "two_workers"])
def test_dataloader_pin_memory_feeds_brick(workers):
    # PyTorch's pin-memory thread calls torch.set_num_threads(1), which also becomes the count
    # of threads started later (brick's autograd thread among them): restored for later tests.
    threads = torch.get_num_threads()
    try:
        extra = dict(num_workers=workers, timeout=60) if workers else {}
        loader = torch.utils.data.DataLoader(_Squares(), batch_size=4, pin_memory=True, **extra)
        seen = []
        for features, targets in loader:
            assert features.is_pinned() and targets.is_pinned()
            fb = features.to("brick", non_blocking=True)
            tb = targets.to("brick", non_blocking=True)
            torch.brick.synchronize()
            assert fb.device.type == "brick"
            seen.append((fb.sum(1) / 3).long().cpu())
            assert torch.equal(tb.cpu(), seen[-1] ** 2)
        assert torch.equal(torch.cat(seen), torch.arange(16))
    finally:
        torch.set_num_threads(threads)


# ---- spec: torch.brick's memory functions (torch.cuda semantics) -----------------------------


def test_brick_mem_get_info_and_memory_reserved():
    free, total = torch.brick.mem_get_info()
    assert isinstance(free, int) and isinstance(total, int)
    assert 0 < free <= total
    assert total == torch.brick.get_device_properties(0).total_memory
    assert torch.brick.mem_get_info(1)[1] == torch.brick.get_device_properties(1).total_memory
    t = torch.empty(MiB, device="brick")  # 4 MiB
    reserved = torch.brick.memory_reserved()
    assert isinstance(reserved, int)
    assert reserved >= torch.brick.memory_allocated() >= t.nbytes
    assert torch.brick.memory_reserved(1) >= torch.brick.memory_allocated(1)


def test_brick_empty_cache_keeps_live_tensors_and_their_counts():
    keep = torch.arange(1000.0, device="brick")
    freed = torch.empty(MiB, device="brick")
    del freed
    gc.collect()
    allocated = torch.brick.memory_allocated()
    assert torch.brick.empty_cache() is None
    assert torch.brick.memory_allocated() == allocated
    assert torch.brick.memory_reserved() >= allocated
    assert torch.equal(keep.cpu(), torch.arange(1000.0))


def test_brick_memory_summary_and_snapshot():
    t = torch.empty(MiB, device="brick")
    summary = torch.brick.memory_summary()
    assert isinstance(summary, str) and "Allocated memory" in summary
    assert isinstance(torch.brick.memory_summary(1, abbreviated=True), str)
    if torch_brickdev.backing_device_type() == "cpu":
        # The host runtime keeps no block list (no lock on the op path): it says so, and where
        # the figures are, rather than answering with an empty list.
        with pytest.raises(RuntimeError, match=r"memory_snapshot\(\).*memory_stats\(\)"):
            torch.brick.memory_snapshot()
    else:
        snapshot = torch.brick.memory_snapshot()
        assert isinstance(snapshot, list) and snapshot, "a live brick tensor has a segment"
        assert all(isinstance(segment, dict) for segment in snapshot)
    del t


# ---- spec: torch.accelerator's memory functions for brick ------------------------------------


def test_accelerator_memory_allocated_tracks_brick_allocations():
    torch.accelerator.synchronize()
    base = torch.accelerator.memory_allocated()
    assert base == torch.brick.memory_allocated()
    t = torch.empty(MiB, device="brick")  # 4 MiB
    assert torch.accelerator.memory_allocated() == base + 4 * MiB
    assert torch.accelerator.memory_allocated("brick:0") == base + 4 * MiB
    base1 = torch.accelerator.memory_allocated(1)
    t1 = torch.empty(256, device="brick:1")
    assert torch.accelerator.memory_allocated(1) == base1 + 1024
    del t, t1
    assert torch.accelerator.memory_allocated() == base


def test_accelerator_peak_and_reset_peak_memory_stats():
    torch.accelerator.reset_peak_memory_stats()
    base = torch.accelerator.memory_allocated()
    assert torch.accelerator.max_memory_allocated() == base
    t = torch.empty(2 * MiB, device="brick")  # 8 MiB
    del t
    assert torch.accelerator.max_memory_allocated() >= base + 8 * MiB
    assert torch.accelerator.max_memory_allocated() == torch.brick.max_memory_allocated()
    torch.accelerator.reset_peak_memory_stats()
    assert torch.accelerator.max_memory_allocated() == base


def test_accelerator_memory_stats_and_empty_cache():
    t = torch.empty(1024, device="brick")
    stats = torch.accelerator.memory_stats()
    ours = torch.brick.memory_stats()
    for key in ("allocated_bytes.all.current", "allocated_bytes.all.peak",
                "allocation.all.current"):
        assert stats[key] == ours[key], key
    assert stats["allocated_bytes.all.current"] >= t.nbytes
    allocated = torch.accelerator.memory_allocated()
    torch.accelerator.empty_cache()
    assert torch.accelerator.memory_allocated() == allocated
    assert torch.equal(t.fill_(2).cpu(), torch.full((1024,), 2.0))


def test_accelerator_memory_reserved_and_memory_info():
    # Beyond the brief's list, but the same DeviceAllocator provides them.
    assert torch.accelerator.memory_reserved() >= torch.accelerator.memory_allocated()
    assert torch.accelerator.max_memory_reserved() >= torch.accelerator.memory_reserved()
    free, total = torch.accelerator.get_memory_info()
    assert 0 < free <= total
    assert total == torch.brick.mem_get_info()[1]
