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


# ---- torch_openreg's test_streams.py, for brick ----------------------------------------------


@pytest.fixture
def restore_streams():
    """Tests that change current streams put the default streams back on every device."""
    yield
    for index in range(torch.brick.device_count()):
        torch.brick.set_stream(torch.brick.default_stream(index))


def test_stream_creation_and_equality():
    s = torch.Stream(device="brick")  # the current device
    assert s.device == torch.device("brick:0") and s.device_index == torch.brick.current_device()
    s1 = torch.Stream(device="brick:1")
    assert s1.device == torch.device("brick:1")
    by_index = torch.Stream(1)  # a bare index means the current accelerator
    assert by_index.device == torch.device("brick:1")
    rebuilt = torch.Stream(stream_id=by_index.stream_id, device_type=by_index.device_type,
                           device_index=by_index.device_index)
    assert rebuilt == by_index
    assert "torch.Stream device_type=brick, device_index=1" in repr(s1)
    assert s1.query() is True
    s1.record_event()
    s1.synchronize()
    assert s1.query() is True


def test_stream_context_and_accelerator_set_stream(restore_streams):
    with torch.Stream(device="brick:1") as s:
        assert torch.accelerator.current_stream() == s
        assert torch.accelerator.current_device_index() == 1
    assert torch.accelerator.current_device_index() == 0
    assert torch.accelerator.current_stream() == torch.brick.default_stream(0)
    s0a, s0b = torch.Stream(device="brick:0"), torch.Stream(device="brick:0")
    torch.accelerator.set_stream(s0a)
    assert torch.accelerator.current_stream().stream_id == s0a.stream_id
    torch.accelerator.set_stream(s0b)
    assert torch.accelerator.current_stream() == s0b
    s1 = torch.Stream(device="brick:1")
    torch.accelerator.set_stream(s1)  # as on CUDA, this also makes brick:1 current
    assert torch.accelerator.current_stream() == s1
    assert torch.accelerator.current_device_index() == 1


def test_streams_wait_across_devices_and_on_events():
    s0, s1 = torch.Stream(device="brick:0"), torch.Stream(device="brick:1")
    x = torch.arange(6.0, device="brick:0")
    with s0:
        y = x * 2
    s1.wait_stream(s0)
    e = s0.record_event()
    s_other = torch.Stream(device="brick")
    s_other.wait_event(e)
    with s1:
        z = y.to("brick:1") + 1
    s1.synchronize()
    assert torch.equal(z.cpu(), torch.arange(6.0) * 2 + 1)
    assert e.query()


# ---- torch_openreg's test_event.py, for brick ------------------------------------------------


def test_event_ids_and_devices():
    fresh = torch.Event(device="brick:1")
    assert fresh.device.type == "brick" and fresh.device.index is None
    assert fresh.event_id == 0 and fresh.query()
    assert torch.Event().device.type == "brick"  # the current accelerator by default
    s1 = torch.Stream(device="brick:1")
    a, b = s1.record_event(), s1.record_event()
    assert a.device == torch.device("brick:1")
    assert a.event_id != 0 and b.event_id != 0 and a.event_id != b.event_id
    e0 = torch.Event(device="brick:0")
    e0.record(torch.Stream(device="brick:0"))
    assert e0.device.index == 0 and e0.event_id != 0
    e0.synchronize()
    assert e0.query()


def test_event_timing_needs_enable_timing_and_measures_work():
    s = torch.Stream(device="brick:1")
    plain = [torch.Event(device="brick:1") for _ in range(2)]
    for e in plain:
        e.record(s)
    s.synchronize()
    with pytest.raises(ValueError,
                       match="Both events must be created with argument 'enable_timing=True'"):
        plain[0].elapsed_time(plain[1])
    start, end = (torch.Event(device="brick", enable_timing=True) for _ in range(2))
    a = torch.randn(256, 256, device="brick")
    start.record()
    for _ in range(5):
        a = (a @ a).clamp_(-1, 1)
    end.record()
    end.synchronize()
    assert start.elapsed_time(end) > 0


def test_event_reuse_and_interleaved_work():
    s = torch.Stream(device="brick:0")
    e = torch.Event(device="brick:0")
    e.record(s)
    s.synchronize()
    assert e.query() and e.event_id != 0
    e.record(s)  # reuse after synchronizing
    s.synchronize()
    assert e.query() and e.event_id != 0
    x, y = torch.randn(50, 50, device="brick"), torch.randn(50, 50, device="brick")
    e1 = s.record_event()
    z1 = x @ y
    e2 = s.record_event()
    z2 = z1 @ x
    s.synchronize()
    assert e1.query() and e2.query() and e1.event_id != e2.event_id
    torch.testing.assert_close(z2.cpu(), (x.cpu() @ y.cpu()) @ x.cpu())


def test_streams_waiting_on_one_event_compute_the_same():
    s1, s2, s3 = (torch.Stream(device="brick:0") for _ in range(3))
    assert len({s1.stream_id, s2.stream_id, s3.stream_id}) == 3
    x, y = torch.randn(30, 30, device="brick"), torch.randn(30, 30, device="brick")
    e = s1.record_event()
    s2.wait_event(e)
    s3.wait_event(e)
    with s2:
        z2 = x @ y
    with s3:
        z3 = x @ y
    torch.accelerator.synchronize()
    assert e.query()
    assert torch.equal(z2.cpu(), z3.cpu())
    torch.testing.assert_close(z2.cpu(), x.cpu() @ y.cpu())
