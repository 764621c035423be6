"""The torch.brick device module and the generic torch.Stream / torch.Event on brick."""

import os
import subprocess
import sys
import threading
import time

import pytest
import torch

import torch_brickdev


def test_registration_names_the_device_brick():
    assert torch._C._get_privateuse1_backend_name() == "brick"
    assert torch.device("brick").type == "brick"
    assert torch.brick is not None
    assert torch_brickdev.runtime_name() == "host"
    assert torch_brickdev.backing_device_type() == "cpu"


def test_plain_import_torch_autoloads_brick():
    code = "import torch; print(torch.ones(2, device='brick').device, torch.brick.device_count())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         timeout=120)
    assert out.stdout.split() == ["brick:0", "2"]


def test_host_device_count_comes_from_the_environment():
    code = "import torch_brickdev, torch; print(torch.brick.device_count())"
    env = dict(os.environ, BRICK_HOST_DEVICES="5")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
    assert out.stdout.strip() == "5", out.stderr


def test_invalid_host_device_count_is_a_clear_import_error():
    code = "import torch_brickdev"
    env = dict(os.environ, BRICK_HOST_DEVICES="zero", TORCH_DEVICE_BACKEND_AUTOLOAD="0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env,
                         timeout=120)
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


def test_event_record_on_stream_and_wait():
    s = torch.brick.Stream()
    e = torch.Event(device="brick")
    s.record_event(e)
    torch.brick.current_stream().wait_event(e)
    e.wait(torch.brick.current_stream())
    assert e.query()


def test_event_elapsed_without_timing_is_an_error():
    a, b = torch.brick.Event(), torch.brick.Event()
    a.record()
    b.record()
    with pytest.raises(ValueError, match="enable_timing=True"):
        a.elapsed_time(b)


def test_event_elapsed_before_record_is_an_error():
    a, b = torch.brick.Event(enable_timing=True), torch.brick.Event(enable_timing=True)
    with pytest.raises(ValueError, match="recorded"):
        a.elapsed_time(b)


def test_rng_manual_seed_is_reproducible_and_matches_cpu():
    torch.manual_seed(1234)
    a = torch.randn(16, device="brick")
    torch.manual_seed(1234)
    b = torch.randn(16, device="brick")
    torch.manual_seed(1234)
    c = torch.randn(16)
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), c)  # brick draws from a generator of the backing device


def test_rng_state_round_trip_and_per_device_generators():
    torch.brick.manual_seed_all(7)
    state = torch.brick.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    x = torch.rand(8, device="brick")
    torch.brick.set_rng_state(state)
    y = torch.rand(8, device="brick")
    assert torch.equal(x.cpu(), y.cpu())
    torch.brick.manual_seed(1)  # only device 0
    assert torch.brick.default_generators[0].initial_seed() == 1
    assert torch.brick.default_generators[1].initial_seed() == 7
    assert len(torch.brick.get_rng_state_all()) == 2
    assert torch.brick.initial_seed() == 1


def test_explicit_generator_on_brick():
    g = torch.Generator(device="brick")
    assert g.device.type == "brick"
    g.manual_seed(3)
    a = torch.rand(4, device="brick", generator=g)
    g.manual_seed(3)
    b = torch.rand(4, device="brick", generator=g)
    assert torch.equal(a.cpu(), b.cpu())


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
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         check=True, timeout=120)
    assert out.stdout.split() == ["-1", "True"]
