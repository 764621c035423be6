"""Streams and events on brick (torch.brick.Stream/Event and the generic torch.Stream/Event):
current, default and per-device streams, event timing and waiting, record_stream and freeing or
resizing memory a side stream uses; and their misuse, each giving the documented error (or the
documented CUDA-like result), with the device usable afterwards."""

import gc
import time

import pytest
import torch

from device_helpers import COUNT, assert_device_still_works


@pytest.mark.timing
def test_streams_current_default_and_context():
    default = torch.brick.default_stream()
    assert default.stream_id == 0 and default.device == torch.device("brick:0")
    assert torch.brick.current_stream() == default
    s = torch.brick.Stream()
    assert isinstance(s, torch.Stream) and isinstance(s, torch.brick.Stream)
    assert not isinstance(torch.Stream(device="cpu"), torch.brick.Stream)
    assert s != default
    with torch.brick.stream(s):
        assert torch.brick.current_stream() == s
    assert torch.brick.current_stream() == default
    generic = torch.Stream(device="brick")
    with generic:
        assert torch.brick.current_stream().stream_id == generic.stream_id
    assert torch.brick.current_stream() == default
    torch.brick.set_stream(s)
    assert torch.brick.current_stream() == s
    torch.brick.set_stream(default)
    assert s.query() is True
    s.synchronize()
    s.wait_stream(default)


@pytest.mark.timing
def test_streams_are_per_device():
    s1 = torch.brick.Stream(device=1)
    assert s1.device == torch.device("brick:1")
    with torch.brick.stream(s1):
        assert torch.brick.current_stream(1) == s1
        assert torch.brick.current_stream(0).stream_id == 0


def _busy(ms):
    end = time.perf_counter() + ms / 1000
    x = torch.ones(64, 64, device="brick")
    while time.perf_counter() < end:
        x = x @ x.clamp(max=1.0) / 64


@pytest.mark.timing
def test_event_elapsed_time_measures_the_work_between_events():
    start = torch.brick.Event(enable_timing=True)
    end = torch.Event(device="brick", enable_timing=True)
    wall_start = time.perf_counter()
    start.record()
    _busy(20)
    end.record()
    wall = (time.perf_counter() - wall_start) * 1000
    end.synchronize()
    assert end.query()
    elapsed = start.elapsed_time(end)
    # On the host runtime events stamp the clock where they are recorded: they measure the work
    # (>= 20 ms) and nothing outside the two record() calls (<= the wall time around them,
    # whatever else the machine runs; 0.01 ms for the clocks' rounding).
    assert 20 <= elapsed <= wall + 0.01


@pytest.mark.timing
def test_event_record_on_stream_and_wait():
    s = torch.brick.Stream()
    e = torch.Event(device="brick")
    s.record_event(e)
    torch.brick.current_stream().wait_event(e)
    e.wait(torch.brick.current_stream())
    assert e.query()


@pytest.mark.timing
def test_event_elapsed_without_timing_is_an_error():
    a, b = torch.brick.Event(), torch.brick.Event()
    a.record()
    b.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        a.elapsed_time(b)


@pytest.mark.timing
def test_event_elapsed_before_record_is_an_error():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event(enable_timing=True)
    with pytest.raises(ValueError, match="recorded"):
        a.elapsed_time(b)


# ---- events used wrongly ------------------------------------------------------------------


@pytest.mark.timing
def test_synchronizing_an_event_never_recorded_returns_at_once():
    # As on CUDA: an event that was never recorded has no work to wait for.
    event = torch.brick.Event()
    event.synchronize()
    assert event.query()
    torch.brick.current_stream().wait_event(event)  # waits for nothing
    assert_device_still_works()


@pytest.mark.timing
def test_elapsed_time_on_events_without_timing_names_enable_timing():
    a, b = torch.brick.Event(), torch.brick.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


@pytest.mark.timing
def test_elapsed_time_with_one_timing_event_is_refused():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event()
    a.record()
    b.record()
    with pytest.raises((RuntimeError, ValueError), match="enable_timing"):
        a.elapsed_time(b)


@pytest.mark.timing
def test_elapsed_time_before_both_events_are_recorded_is_refused():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event(enable_timing=True)
    a.record()
    with pytest.raises((RuntimeError, ValueError), match="recorded"):
        a.elapsed_time(b)
    b.record()
    assert a.elapsed_time(b) >= 0.0


@pytest.mark.timing
def test_elapsed_time_across_devices_is_refused():
    if COUNT < 2:
        pytest.skip("needs two brick devices")
    a = torch.Event(device="brick:0", enable_timing=True)
    b = torch.Event(device="brick:1", enable_timing=True)
    a.record(torch.brick.current_stream(0))
    b.record(torch.brick.current_stream(1))
    with pytest.raises((RuntimeError, ValueError), match="brick"):
        a.elapsed_time(b)


@pytest.mark.timing
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


@pytest.mark.timing
def test_re_recording_an_event_moves_it_forward():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event(enable_timing=True)
    a.record()
    b.record()
    first = a.elapsed_time(b)
    a.record()  # now after b
    assert a.elapsed_time(b) <= 0.0 <= first


# ---- freeing or resizing memory a stream still uses ----------------------------------------


@pytest.mark.timing
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


@pytest.mark.timing
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


@pytest.mark.timing
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


@pytest.mark.timing
def test_record_stream_with_a_stream_of_another_device_is_refused():
    if COUNT < 2:
        pytest.skip("needs two brick devices")
    t = torch.ones(4, device="brick:0")
    other = torch.brick.Stream(device=1)
    with pytest.raises(RuntimeError, match="brick"):
        t.record_stream(other)
    assert_device_still_works()
