"""Memory of brick devices: statistics, adopted op results, per-device counts, profile_memory."""

import torch


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
