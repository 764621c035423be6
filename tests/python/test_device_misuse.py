"""Misuse of the device: each gives the documented error (or the documented CUDA-like result),
never undefined behaviour, and the device stays usable afterwards."""

import gc

import pytest
import torch

COUNT = torch.brick.device_count()
MISSING = COUNT  # the first index that does not exist


def assert_device_still_works():
    x = torch.arange(6.0, device="brick").reshape(2, 3)
    assert torch.equal((x @ x.T).cpu(), torch.arange(6.0).reshape(2, 3) @ torch.arange(6.0).reshape(2, 3).T)


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


# ---- freeing or resizing memory a stream still uses ----------------------------------------


def test_freeing_a_tensor_while_a_side_stream_uses_it():
    side = torch.brick.Stream()
    gc.collect()  # garbage of earlier tests must not be freed between the two readings
    baseline = torch.brick.memory_allocated()
    source = torch.full((1024,), 3.0, device="brick")
    with torch.brick.stream(side):
        result = source * 2  # queued on the side stream
    source.record_stream(side)  # as on CUDA: the free waits for the side stream's work
    del source
    gc.collect()
    side.synchronize()
    assert torch.equal(result.cpu(), torch.full((1024,), 6.0))
    del result
    gc.collect()
    assert torch.brick.memory_allocated() == baseline


def test_freeing_without_record_stream_keeps_the_result_correct():
    # The host runtime runs every op on the issuing thread before returning, so a tensor is
    # never in use by a stream once the call that used it returned: freeing it is safe.
    side = torch.brick.Stream()
    for _ in range(20):
        source = torch.randn(4096, device="brick")
        expected = source.cpu() + 1
        with torch.brick.stream(side):
            out = source + 1
        del source
        assert torch.equal(out.cpu(), expected)


def test_resizing_a_tensor_a_side_stream_just_used():
    side = torch.brick.Stream()
    t = torch.arange(16.0, device="brick")
    with torch.brick.stream(side):
        doubled = t * 2
    t.resize_(1 << 16)  # grows: new memory, the first 16 values kept
    side.synchronize()
    assert torch.equal(t[:16].cpu(), torch.arange(16.0))
    assert torch.equal(doubled.cpu(), torch.arange(16.0) * 2)
    t.resize_(4)  # shrinks in place
    assert torch.equal(t.cpu(), torch.arange(4.0))


def test_record_stream_with_a_stream_of_another_device_is_refused():
    if COUNT < 2:
        pytest.skip("needs two brick devices")
    t = torch.ones(4, device="brick:0")
    other = torch.brick.Stream(device=1)
    with pytest.raises(RuntimeError, match="brick"):
        t.record_stream(other)
    assert_device_still_works()


# ---- events used wrongly ------------------------------------------------------------------


def test_synchronizing_an_event_never_recorded_returns_at_once():
    # As on CUDA: an event that was never recorded has no work to wait for.
    event = torch.brick.Event()
    event.synchronize()
    assert event.query()
    torch.brick.current_stream().wait_event(event)  # waits for nothing
    assert_device_still_works()


def test_elapsed_time_on_events_without_timing_names_enable_timing():
    a, b = torch.brick.Event(), torch.brick.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


def test_elapsed_time_with_one_timing_event_is_refused():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


def test_elapsed_time_before_both_events_are_recorded_is_refused():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event(enable_timing=True)
    a.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)
    b.record()
    assert a.elapsed_time(b) >= 0.0


def test_elapsed_time_across_devices_is_refused():
    if COUNT < 2:
        pytest.skip("needs two brick devices")
    a = torch.Event(device="brick:0", enable_timing=True)
    b = torch.Event(device="brick:1", enable_timing=True)
    a.record(torch.brick.current_stream(0))
    b.record(torch.brick.current_stream(1))
    with pytest.raises((RuntimeError, ValueError), match="brick"):
        a.elapsed_time(b)


def test_re_recording_an_event_on_another_devices_stream_is_refused():
    if COUNT < 2:
        pytest.skip("needs two brick devices")
    # A fresh event takes the device of the stream that first records it (as on CUDA); after
    # that, a stream of another device cannot record it.
    event = torch.Event(device="brick")
    event.record(torch.brick.current_stream(0))
    with pytest.raises((RuntimeError, ValueError), match="device"):
        event.record(torch.brick.current_stream(1))
    assert_device_still_works()


def test_re_recording_an_event_moves_it_forward():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event(enable_timing=True)
    a.record()
    b.record()
    first = a.elapsed_time(b)
    a.record()  # now after b
    assert a.elapsed_time(b) <= 0.0 <= first
