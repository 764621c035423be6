"""Traced device timing (``profile(device_timing="traced")``): each brick's device time is the
sum of the work the device's tracer recorded inside it, its nested bricks' included. Here on the
host runtime, whose tracer stamps brick's launches; on a GPU the same path reads CUPTI's records
(the GPU job measures it against event pairs).
"""

from __future__ import annotations

import json
import os
import textwrap
import threading
import time

import pytest
import torch

from helpers import run_python
from profiler_helpers import (  # noqa: F401  (clean_profiler is a fixture)
    TwoLayer,
    by_name,
    by_path,
    clean_profiler,
    spin_cpu_op,
)
from torch_brickdev import profiler as bp

record_function = torch.profiler.record_function


@pytest.fixture(autouse=True)
def _clean(clean_profiler):  # noqa: F811
    yield


def host_runtime() -> bool:
    return bp.work_tracer()[0] == "host"


needs_host_tracer = pytest.mark.skipif(not host_runtime(), reason="the host runtime's tracer")


@needs_host_tracer
def test_the_host_runtime_has_a_tracer_and_the_report_names_it():
    assert bp.work_tracer() == ("host", None)
    x = torch.randn(8, 8, device="brick")
    with bp.profile(sync_mode="event", device_timing="traced") as p:
        torch.mm(x, x)
    assert p.report.metadata["device_timing"] == {"timing": "traced", "tracer": "host"}
    with bp.profile(sync_mode="event") as p:
        torch.mm(x, x)
    assert "device_timing" not in p.report.metadata, "events: the default, not stated"


@needs_host_tracer
def test_a_known_busy_wait_is_inside_its_ops_traced_time_and_the_time_inside_the_call():
    spin = spin_cpu_op()
    x = torch.randn(4, device="brick")
    spin(x, 10)  # warm: the first call registers the fallback's path
    walls = []
    with bp.profile(sync_mode="event", device_timing="traced") as p:
        for _ in range(5):
            start = time.perf_counter_ns()
            spin(x, 2000)
            walls.append(time.perf_counter_ns() - start)
    row = by_name(p.report.bricks)["brick_test_cpu::spin"]
    assert row.count == 5
    # Each call busy-waits 2 ms inside the CPU kernel that brick's launch runs: its work holds
    # those 2 ms, and no more than the call's own wall time.
    assert row.min_ns >= 2_000_000
    assert row.total_ns <= sum(walls)


@needs_host_tracer
def test_a_composite_is_its_kernels_and_a_range_the_sum_of_the_work_inside_it():
    torch.manual_seed(0)
    model = TwoLayer().to("brick")
    x = torch.randn(16, 32, device="brick")
    model(x)
    with bp.profile(sync_mode="event", device_timing="traced") as p:
        for _ in range(10):
            model(x)
    paths = by_path(p.report.paths)
    for block in ("Block1", "Block2"):
        linear = paths[f"{block}/aten::linear"]
        addmm = paths[f"{block}/aten::linear/aten::addmm"]
        assert linear.total_ns == addmm.total_ns > 0, "aten::linear's only work is its addmm"
        children = [b for path, b in paths.items()
                    if path.startswith(f"{block}/") and path.count("/") == 1]
        assert paths[block].total_ns == sum(b.total_ns for b in children), \
            "a range is exactly the work of what ran inside it: no gaps between launches"
    assert paths["Block1/aten::linear/aten::t"].total_ns == 0, "a view queues no work"
    health = bp.health()
    assert health["traced_unattributed"] == 0 and health["traced_lost"] == 0
    assert health["pending_events"] == 0 and health["timing_failures"] == 0


@needs_host_tracer
def test_ops_timed_at_brick_kernels_are_traced_too():
    x = torch.randn(64, 64, device="brick")
    with bp.profile(sync_mode="event", ops="kernels", device_timing="traced") as p:
        with record_function("Step"):
            for _ in range(3):
                torch.relu(torch.mm(x, x))
    paths = by_path(p.report.paths)
    assert paths["Step/aten::mm"].count == 3
    assert paths["Step"].total_ns == sum(b.total_ns for path, b in paths.items()
                                         if path.startswith("Step/") and path.count("/") == 1)
    assert paths["Step"].total_ns > 0


@needs_host_tracer
def test_backward_on_the_autograd_engines_threads_is_in_the_range_around_it():
    torch.manual_seed(0)
    model = TwoLayer().to("brick")
    x = torch.randn(16, 32, device="brick")
    with bp.profile(sync_mode="event", device_timing="traced") as p:
        with record_function("Backward"):
            model(x).sum().backward()
    paths = by_path(p.report.paths)
    inside = [b for path, b in paths.items()
              if path.startswith("Backward/") and path.count("/") == 1]
    assert any("Backward" in b.name and b.name != "Backward" for b in inside), sorted(paths)
    assert paths["Backward"].total_ns == sum(b.total_ns for b in inside) > 0
    assert bp.health()["traced_unattributed"] == 0


@needs_host_tracer
def test_threads_are_traced_apart_each_brick_its_own_threads_work():
    x = torch.randn(128, 128, device="brick")
    errors = []

    def work(name):
        try:
            with record_function(name):
                for _ in range(20):
                    torch.mm(x, x)
        except BaseException as error:  # noqa: BLE001 (reported by the test)
            errors.append(error)

    with bp.profile(sync_mode="event", device_timing="traced") as p:
        threads = [threading.Thread(target=work, args=(f"T{i}",)) for i in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
    assert not errors
    paths = by_path(p.report.paths)
    for name in ("T0", "T1"):
        assert paths[f"{name}/aten::mm"].count == 20
        assert paths[name].total_ns == paths[f"{name}/aten::mm"].total_ns > 0


def test_bad_device_timings_are_refused_naming_what_is_expected():
    with pytest.raises(ValueError, match=r"device_timing must be 'events' or 'traced', got str \('cupti'\)"):
        bp.profile(device_timing="cupti")
    with pytest.raises(ValueError, match="sync_mode is 'deferred': use sync_mode='event'"):
        bp.profile(sync_mode="deferred", device_timing="traced")
    assert not bp.is_enabled()


def test_a_sync_mode_set_beforehand_that_traced_timing_cannot_serve_is_refused_at_entry():
    bp.set_sync_mode("immediate")
    profile = bp.profile(device_timing="traced")
    with pytest.raises(RuntimeError, match="traced device timing gives Event mode's device times"):
        with profile:
            pass
    assert not bp.is_enabled()
    bp.set_sync_mode("event")
    with bp.profile(sync_mode="event") as p:  # the settings were restored
        torch.ones(2, device="brick").add_(1)
    assert "device_timing" not in p.report.metadata


@needs_host_tracer
def test_the_command_line_profiles_a_script_with_traced_timing(tmp_path):
    script = tmp_path / "script.py"
    script.write_text("import torch, torch_brickdev\n"
                      "x = torch.randn(64, 64, device='brick')\n"
                      "with torch.profiler.record_function('Step'):\n"
                      "    torch.mm(x, x)\n")
    done = run_python("-m", "torch_brickdev", "profile", "--no-trace", "--device-timing",
                      "traced", "-o", str(tmp_path), str(script), cwd=tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    report = bp.load_report(tmp_path / "report.json")
    assert report.metadata["device_timing"] == {"timing": "traced", "tracer": "host"}
    assert by_path(report.paths)["Step"].total_ns == by_path(report.paths)["Step/aten::mm"].total_ns
    done = run_python("-m", "torch_brickdev", "profile", "--device-timing", "cupti", str(script),
                      cwd=tmp_path)
    assert done.returncode == 2 and "invalid choice: 'cupti'" in done.stderr


@needs_host_tracer
@pytest.mark.skipif(os.environ.get("BRICK_HOST_COMPLETION") == "deferred",
                    reason="an asynchronous runtime resolves traced bricks when the profile ends")
def test_a_long_profile_holds_a_bounded_number_of_closed_bricks_and_loses_none():
    x = torch.ones(4, device="brick")
    with bp.profile(sync_mode="event", device_timing="traced") as p:
        with record_function("Long"):
            for _ in range(6000):
                x.add_(1)
            held = bp.health()["pending_events"]
    assert held < 4096, "resolved as they go on the host, not all kept to the end"
    paths = by_path(p.report.paths)
    assert paths["Long/aten::add_"].count == 6000
    assert paths["Long"].total_ns == paths["Long/aten::add_"].total_ns > 0
    assert float(x[0].cpu()) == 6001.0


@needs_host_tracer
def test_the_demo_traced_passes_the_checks_that_do_not_depend_on_the_machine(tmp_path):
    from torch_brickdev.tools import demo
    from torch_brickdev.tools.contract import run_checks

    small = demo.DecodeConfig(layers=1, hidden=64, heads=4, kv_heads=2, vocab=256,
                              prompt_tokens=4, tokens=6)
    result = demo.run_demo(small, runs=2, out_dir=tmp_path, progress=False,
                           device_timing="traced")
    report = result["report"]
    assert report.metadata["device_timing"] == {"timing": "traced", "tracer": "host"}
    checks = {r.id: r for r in run_checks(report)}
    # Coverage: the bricks' work against all the work traced, which no load changes.
    assert checks["coverage"].status == "pass", checks["coverage"].message
    assert "of the device work traced" in checks["coverage"].message
    assert "traced by host" in checks["sync-mode"].message
    for check in ("lmhead-count", "structure", "completeness", "graph-capture"):
        assert checks[check].status == "pass", checks[check].message
    with pytest.raises(ValueError, match="device_timing must be 'events' or 'traced'"):
        demo.run_demo(small, out_dir=tmp_path, device_timing="yes")


@needs_host_tracer
@pytest.mark.skipif(os.environ.get("BRICK_HOST_COMPLETION") == "deferred",
                    reason="the child reads its bricks while the profile runs: a synchronous "
                    "runtime's")
def test_a_fork_inside_a_traced_profile_leaves_both_processes_exact():
    """The child gets a fresh registry and tracer state (a lock the parent's threads held at the
    fork is renewed), times its own bricks, and none of the parent's."""
    code = textwrap.dedent("""
        import json, os, threading, torch, torch_brickdev
        import torch_brickdev.profiler as bp
        x = torch.ones(64, device="brick")
        busy = threading.Event()
        stop = threading.Event()
        def launches():  # another thread launching while the fork happens
            y = torch.ones(64, device="brick")
            while not stop.is_set():
                y.add_(1)
                busy.set()
        with bp.profile(sync_mode="event", device_timing="traced") as p:
            for _ in range(300):
                x.add_(1)
            worker = threading.Thread(target=launches)
            worker.start()
            busy.wait(60)
            pid = os.fork()
            if pid == 0:
                for _ in range(10):
                    x.mul_(1.0)
                rows = {b.name: b for b in bp.stats()}
                ok = rows["aten::mul_"].count == 10 and rows["aten::mul_"].total_ns > 0 \\
                    and "aten::add_" not in rows
                os._exit(0 if ok else 3)
            stop.set()
            worker.join(60)
            _, status = os.waitpid(pid, 0)
            for _ in range(300):
                x.add_(1)
        add = p.report.brick("aten::add_")
        print(json.dumps({"child": os.waitstatus_to_exitcode(status),
                          "main_adds": p.report.paths and
                          {b.path: b.count for b in p.report.paths}.get("aten::add_"),
                          "add_ns": add.total_ns, "health": bp.health()}))
    """)
    done = run_python("-c", code)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["child"] == 0
    assert seen["main_adds"] >= 600 and seen["add_ns"] > 0
    assert seen["health"]["traced_lost"] == 0 and seen["health"]["timing_failures"] == 0


@pytest.fixture
def legacy_traced():
    bp.set_device_timing("traced")
    try:
        yield
    finally:
        bp.set_device_timing("events")


def legacy_rows(prof):
    return {e.key: e for e in prof.key_averages()}


@needs_host_tracer
def test_the_legacy_profiler_reads_traced_device_time_a_known_busy_wait_inside_it(legacy_traced):
    assert bp.device_timing() == "traced"
    spin = spin_cpu_op()
    x = torch.randn(4, device="brick")
    spin(x, 10)
    walls = []
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        for _ in range(3):
            start = time.perf_counter_ns()
            spin(x, 2000)
            walls.append(time.perf_counter_ns() - start)
    row = legacy_rows(prof)["brick_test_cpu::spin"]
    assert row.count == 3
    # Each call busy-waits 2 ms inside the CPU kernel brick's launch runs: its device time holds
    # them, and no more than the calls' own wall time.
    assert 3 * 2_000 <= row.device_time_total <= sum(walls) / 1000
    assert bp.health()["stub_failures"] == 0


@needs_host_tracer
def test_the_legacy_profilers_traced_ops_agree_with_the_registrys_and_a_composite_is_its_kernels(
        legacy_traced):
    torch.manual_seed(0)
    model = TwoLayer().to("brick")
    x = torch.randn(16, 32, device="brick")
    model(x)
    spin = spin_cpu_op()
    spin(x, 10)
    # Both profilers at once, on the one traced timer.
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        with bp.profile(sync_mode="event", device_timing="traced") as p:
            for _ in range(5):
                model(x)
            for _ in range(3):
                spin(x, 1000)
    rows = legacy_rows(prof)
    bricks = by_name(p.report.bricks)
    for name in ("aten::addmm", "aten::linear", "aten::relu", "aten::t"):
        assert rows[name].count == bricks[name].count == 10
    assert rows["aten::linear"].device_time_total == rows["aten::addmm"].device_time_total > 0
    assert rows["aten::t"].device_time_total == 0, "a view queues no work"
    # The same work in both: 3 ms of busy-wait. (Apart from it, only what each profiler's own
    # callbacks add on the host, where a launch's work is its wall time.)
    spin_us = bricks["brick_test_cpu::spin"].total_ns / 1000
    assert spin_us >= 3_000
    assert rows["brick_test_cpu::spin"].device_time_total == pytest.approx(spin_us, rel=0.05)
    assert bp.health()["stub_failures"] == 0 and bp.health()["traced_unattributed"] == 0


@needs_host_tracer
def test_the_legacy_profilers_traced_timing_ends_with_its_profile_and_starts_with_the_next(
        legacy_traced):
    x = torch.randn(64, 64, device="brick")
    for _ in range(2):
        with torch.autograd.profiler.profile(use_device="brick") as prof:
            torch.mm(x, x)
        assert legacy_rows(prof)["aten::mm"].device_time_total > 0
    # The registry's own traced profile afterwards starts the tracer afresh: nothing of the legacy
    # profiles' work is in it.
    with bp.profile(sync_mode="event", device_timing="traced") as p:
        torch.mm(x, x)
    assert by_name(p.report.bricks)["aten::mm"].count == 1
    assert bp.health()["traced_work_ns"] == by_name(p.report.bricks)["aten::mm"].total_ns
    bp.set_device_timing("events")
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        torch.mm(x, x)
    assert legacy_rows(prof)["aten::mm"].device_time_total > 0


@needs_host_tracer
def test_a_legacy_profile_read_after_the_next_one_ran_keeps_its_own_times(legacy_traced):
    # PyTorch reads a legacy profile's device times when its events are first asked for, which
    # may be after another profile has run: each keeps its own.
    spin = spin_cpu_op()
    x = torch.randn(4, device="brick")
    spin(x, 10)
    with torch.autograd.profiler.profile(use_device="brick") as first:
        spin(x, 3000)
    with torch.autograd.profiler.profile(use_device="brick") as second:
        spin(x, 1000)
    with bp.profile() as p:  # and the registry's profile in between
        spin(x, 500)
    later = legacy_rows(second)["brick_test_cpu::spin"].device_time_total
    earlier = legacy_rows(first)["brick_test_cpu::spin"].device_time_total
    assert earlier >= 3_000 and later >= 1_000, (earlier, later)  # (a busy machine adds to both)
    assert by_name(p.report.bricks)["brick_test_cpu::spin"].total_ns >= 500_000
    assert bp.health()["stub_failures"] == 0


@needs_host_tracer
def test_the_process_device_timing_is_what_a_profile_uses_unless_it_says_otherwise(legacy_traced):
    x = torch.randn(8, 8, device="brick")
    with bp.profile() as p:
        torch.mm(x, x)
    assert p.report.metadata["device_timing"] == {"timing": "traced", "tracer": "host"}
    with bp.profile(device_timing="events") as p:
        torch.mm(x, x)
    assert "device_timing" not in p.report.metadata


def test_bad_process_device_timings_are_refused_naming_what_is_expected():
    with pytest.raises(ValueError, match=r"timing must be 'events' or 'traced', got 'cupti'"):
        bp.set_device_timing("cupti")
    with pytest.raises(TypeError, match=r"timing must be 'events' or 'traced', got int"):
        bp.set_device_timing(1)
    assert bp.device_timing() == "events"
