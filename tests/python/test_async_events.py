"""The profiler's paths for an asynchronous device, run on the host runtime with deferred
completion (``BRICK_HOST_COMPLETION=deferred``: an event completes 20 µs after it is recorded, as
if a GPU were still running the work). These are the paths the CUDA runtime takes: Event-mode
pairs queued and resolved later (by the thread itself, by a snapshot on another thread, at
thread exit), bounded outstanding events, and trace device times resolved lazily.

Each test runs a script in a fresh interpreter (the runtime is chosen at import).
"""

import json
import os
import textwrap

import pytest

from helpers import run_python

pytestmark = pytest.mark.timing

PRELUDE = """
import json, os, sys, threading, time
import torch
import torch_brickdev
import torch_brickdev.profiler as bp
from torch.autograd.profiler import record_function
assert torch_brickdev._C._runtime_name() == "host"
x = torch.ones(16, device="brick")
def counts():
    return {s.path: s.count for s in bp.stats(by="path")}
"""


def run(body: str, timeout: float = 120.0) -> dict:
    env = dict(os.environ, BRICK_HOST_COMPLETION="deferred", BRICK_RUNTIME="host")
    script = PRELUDE + textwrap.dedent(body)
    done = run_python("-c", script, env=env, timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_deferred_completion_is_selected_by_the_environment():
    seen = run("""
        e = torch.brick.Event(enable_timing=True); f = torch.brick.Event(enable_timing=True)
        e.record(); f.record()
        pending = not f.query()
        f.synchronize()
        print(json.dumps({"pending": pending, "done": f.query(), "ms": e.elapsed_time(f)}))
    """)
    assert seen["pending"] and seen["done"] and seen["ms"] >= 0


def test_event_mode_queues_pairs_and_resolves_every_one():
    seen = run("""
        with bp.profile(sync_mode="event"):
            with record_function("loop"):
                for _ in range(3000):
                    x.add_(1)
            pending_inside = bp.health()["pending_events"]
        after = counts()
        h = bp.health()
        print(json.dumps({"pending_inside": pending_inside, "counts": after, "health": h,
                          "min_ns": min(s.min_ns for s in bp.stats())}))
    """)
    assert seen["pending_inside"] > 0  # the asynchronous path really ran
    assert seen["counts"]["loop"] == 1
    assert seen["counts"]["loop/aten::add_"] == 3000
    assert seen["health"]["pending_events"] == 0
    assert seen["health"]["timing_failures"] == 0
    assert seen["health"]["unbalanced_exits"] == 0
    assert seen["min_ns"] >= 0


def test_ops_timed_at_kernels_take_the_same_event_path():
    """profile(ops="kernels") on an asynchronous device: each kernel's pair starts at its first
    queued work and resolves later, as an op's does at the dispatcher."""
    seen = run("""
        with bp.profile(sync_mode="event", ops="kernels"):
            with record_function("loop"):
                for _ in range(3000):
                    x.add_(1)
            pending_inside = bp.health()["pending_events"]
        after = counts()
        print(json.dumps({"pending_inside": pending_inside, "counts": after,
                          "health": bp.health()}))
    """)
    assert seen["pending_inside"] > 0
    assert seen["counts"] == {"loop": 1, "loop/aten::add_": 3000}
    assert seen["health"]["pending_events"] == 0
    assert seen["health"]["timing_failures"] == 0 and seen["health"]["unbalanced_exits"] == 0


def test_event_mode_times_an_ops_device_work_from_its_first_launch():
    """On an asynchronous device an op's Event-mode time is its device work's: from the stream's
    point where its first work was queued to the end of its last. A view queues none (its time
    is 0, its calls all counted, no event made); host work in an op before its first launch (here
    a Python kernel's 2 ms spin before its clone) is not device time; a range still times the
    stream from its enter to its exit."""
    seen = run("""
        sys.path.insert(0, os.path.join(os.getcwd(), "tests", "python"))
        from profiler_helpers import spin_op
        spin = spin_op()
        y = torch.ones(64, 64, device="brick")
        with bp.profile(sync_mode="event"):
            with record_function("block"):
                for _ in range(50):
                    y.t()
                for _ in range(5):
                    spin(y, 2000)
        stats = {s.path: (s.count, s.total_ns) for s in bp.stats(by="path")}
        print(json.dumps({"stats": stats, "health": bp.health()}))
    """)
    stats = seen["stats"]
    assert stats["block/aten::t"][0] == 50 and stats["block/aten::t"][1] == 0
    assert stats["block/aten::t/aten::transpose"][1] == 0
    spin_count, spin_ns = stats["block/brick_test::spin"]
    assert spin_count == 5
    assert 0 < spin_ns / 5 < 1_000_000, "the 2 ms host spin before the clone is not device time"
    assert stats["block/brick_test::spin/aten::clone"][0] == 5
    assert stats["block"][1] >= 5 * 2_000_000, "a range times the stream from enter to exit"
    assert seen["health"]["timing_failures"] == 0 and seen["health"]["pending_events"] == 0


def test_a_snapshot_resolves_the_pairs_other_threads_still_owe():
    seen = run("""
        recorded, release = threading.Barrier(5), threading.Event()
        def worker():
            y = torch.ones(8, device="brick")
            for _ in range(500):
                y.mul_(1.0)
            recorded.wait()
            release.wait()  # alive and idle: it resolves nothing itself
        bp.enable("event")
        threads = [threading.Thread(target=worker) for _ in range(4)]
        for t in threads: t.start()
        recorded.wait()
        owed = bp.health()["pending_events"]
        found = counts()
        release.set()
        for t in threads: t.join()
        bp.disable()
        print(json.dumps({"owed": owed, "mul": found.get("aten::mul_", 0),
                          "pending_after": bp.health()["pending_events"]}))
    """)
    assert seen["owed"] > 0
    assert seen["mul"] == 4 * 500
    assert seen["pending_after"] == 0


def test_pairs_owed_by_exiting_threads_are_recorded():
    seen = run("""
        def worker():
            y = torch.ones(8, device="brick")
            for _ in range(700):
                y.sub_(1.0)
        bp.enable("event")
        threads = [threading.Thread(target=worker) for _ in range(3)]
        for t in threads: t.start()
        for t in threads: t.join()
        bp.disable()
        print(json.dumps({"sub": counts().get("aten::sub_", 0), "health": bp.health()}))
    """)
    assert seen["sub"] == 3 * 700
    assert seen["health"]["timing_failures"] == 0


def test_nested_ops_share_the_events_of_their_common_start_and_end():
    """aten::linear's only work is the aten::mm inside its aten::matmul: the three start at the
    mm's kernel and end with nothing queued after it, so they share one start and one end event
    (two records where there were six) and their device times are equal to the nanosecond. A
    range is no op (work it holds need not be brick's): its end is recorded, never shared, and it
    ends after the add queued behind the linear."""
    seen = run("""
        a = torch.randn(8, 16, device="brick"); w = torch.randn(4, 16, device="brick")
        y = torch.ones(4, device="brick")
        with bp.profile(sync_mode="event"):
            for _ in range(200):
                with record_function("block"):
                    torch.nn.functional.linear(a, w)
                    y.add_(1)
        totals = {s.path: (s.count, s.total_ns) for s in bp.stats(by="path")}
        print(json.dumps({"totals": totals, "health": bp.health()}))
    """)
    totals = seen["totals"]
    mm = totals["block/aten::linear/aten::matmul/aten::mm"]
    assert totals["block/aten::linear"] == totals["block/aten::linear/aten::matmul"] == mm, totals
    assert mm[0] == 200 and mm[1] > 0
    assert totals["block"][1] > mm[1] + totals["block/aten::add_"][1] - 1, totals
    assert seen["health"]["timing_failures"] == 0


def test_outstanding_events_stay_bounded_without_snapshots():
    seen = run("""
        bp.enable("event")
        start = bp.health()["live_events"]
        highest_pending = highest_live = 0
        for i in range(30000):
            x.add_(1)
            if i % 1000 == 0:
                h = bp.health()
                highest_pending = max(highest_pending, h["pending_events"])
                highest_live = max(highest_live, h["live_events"])
        bp.disable()
        print(json.dumps({"start": start, "highest_pending": highest_pending,
                          "highest_live": highest_live, "add": counts()["aten::add_"]}))
    """)
    assert 0 < seen["highest_pending"] <= 4096 + 32
    assert seen["highest_live"] - seen["start"] <= 2 * (4096 + 64)
    assert seen["add"] == 30000


def test_legacy_profiler_device_times_resolve_lazily():
    seen = run("""
        from torch_brickdev.profiler.trace import device_intervals
        a = torch.randn(64, 64, device="brick")
        with torch.autograd.profiler.profile(use_device="brick") as prof:
            for _ in range(50):
                torch.mm(a, a)
        matches, info = device_intervals(prof)
        rows = {e.key: e for e in prof.key_averages()}
        mm = [m for m in matches if m[0].name() == "aten::mm"]
        print(json.dumps({"mm_matched": len(mm), "all_ordered": all(m[3] <= m[4] for m in matches),
                          "count": rows["aten::mm"].count,
                          "brick_us": rows["aten::mm"].self_device_time_total}))
    """)
    assert seen["count"] == 50
    assert seen["mm_matched"] == 50  # every op got its device interval once its events completed
    assert seen["all_ordered"]
    assert seen["brick_us"] > 0


def test_a_fork_with_pairs_outstanding_leaves_the_parent_exact():
    seen = run("""
        bp.enable("event")
        for _ in range(300):
            x.add_(1)
        pid = os.fork()
        if pid == 0:
            for _ in range(10):
                x.mul_(1.0)
            ok = counts().get("aten::mul_") == 10 and "aten::add_" not in counts()
            os._exit(0 if ok else 3)
        _, status = os.waitpid(pid, 0)
        for _ in range(300):
            x.add_(1)
        bp.disable()
        print(json.dumps({"child": os.waitstatus_to_exitcode(status), "add": counts()["aten::add_"],
                          "mul": counts().get("aten::mul_", 0)}))
    """)
    assert seen["child"] == 0
    assert seen["add"] == 600
    assert seen["mul"] == 0


@pytest.mark.parametrize("mode", ["immediate", "deferred"])
def test_other_sync_modes_on_an_asynchronous_device(mode):
    seen = run(f"""
        with bp.profile(sync_mode="{mode}"):
            for _ in range(200):
                x.add_(1)
        print(json.dumps({{"add": counts()["aten::add_"], "health": bp.health()}}))
    """)
    assert seen["add"] == 200
    assert seen["health"]["pending_events"] == 0
    assert seen["health"]["timing_failures"] == 0


def test_profilers_make_events_only_on_the_devices_they_record_on():
    """On CUDA an event on a GPU needs a context there (~0.5 GB per GPU and rank under torchrun):
    the registry, the legacy profiler's stubs and torch.profiler's device activity must create
    events only on the brick devices the program uses (here brick:0 of two)."""
    seen = run("""
        from torch.profiler import ProfilerActivity, profile
        assert torch.brick.device_count() == 2
        with bp.profile(sync_mode="event"):
            for _ in range(50):
                x.add_(1)
        with torch.autograd.profiler.profile(use_device="brick"):
            for _ in range(50):
                x.add_(1)
        activities = [ProfilerActivity.CPU, ProfilerActivity.PrivateUse1]
        with profile(activities=activities):
            for _ in range(50):
                x.add_(1)
        time.sleep(0.5)  # the stub pool's background refill has run
        print(json.dumps(torch_brickdev._C._profiler.live_events_by_device()))
    """)
    assert seen[0] > 0  # the asynchronous event paths really ran
    assert seen[1] == 0, seen


def test_legacy_profiler_times_a_range_whose_current_device_changed_inside_it():
    """A range that starts on brick:0 and ends on brick:1 (set_device inside it) has its two
    stub events on two devices: its device time comes from both placed on the host clock, and
    nothing escapes into PyTorch's post-processing (which would lose the whole profile)."""
    seen = run("""
        torch.brick.set_device(0)
        with torch.autograd.profiler.profile(use_device="brick") as prof:
            with record_function("switch"):
                x.add_(1)
                time.sleep(0.002)
                torch.brick.set_device(1)
        torch.brick.set_device(0)
        rows = {e.key: e.device_time_total for e in prof.key_averages()}
        print(json.dumps({"switch_us": rows["switch"], "health": bp.health()}))
    """)
    assert seen["switch_us"] >= 2000
    assert seen["health"]["stub_failures"] == 0
