"""Faults inside profiled code: exceptions, KeyboardInterrupt, re-entry and fork().

The profiler must never lose or double-count a brick, never leave a brick open, and the next
profiling run must be exact, whatever happened in the previous one.
"""

import contextlib
import json
import os
import signal
import threading
import time
import _thread

import pytest
import torch
from torch.autograd.profiler import record_function
from torch.utils.data import DataLoader, Dataset

import torch_brickdev.profiler as bp

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")


def counts(by="name"):
    return {s.path if by == "path" else s.name: s.count for s in bp.stats(by=by)}


def assert_healthy():
    health = bp.health()
    assert health["unbalanced_exits"] == 0, health
    assert health["timing_failures"] == 0, health


def exact_run(n=25):
    """A profiled run whose counts are known: proves the profiler is in a clean state."""
    x = torch.ones(16, device="brick")
    with bp.profile():
        with record_function("clean_run"):
            for _ in range(n):
                x = x + 1
    found = counts("path")
    assert found["clean_run"] == 1
    assert found["clean_run/aten::add"] == n
    assert not bp.is_enabled()
    assert_healthy()


@pytest.fixture(autouse=True)
def _profiler_off():
    yield
    if bp.is_enabled():
        bp.disable()


# ---- exceptions ---------------------------------------------------------------------------


def test_exception_inside_an_op_closes_its_brick_and_ranges():
    a = torch.ones(2, 3, device="brick")
    b = torch.ones(4, 5, device="brick")
    with bp.profile():
        for _ in range(3):
            with pytest.raises(RuntimeError, match="shapes cannot be multiplied"):
                with record_function("outer"):
                    with record_function("inner"):
                        torch.mm(a, b)
        after = a + 1  # a brick after the failures sits at top level: nothing was left open
    found = counts("path")
    assert found["outer"] == 3
    assert found["outer/inner"] == 3
    assert found["outer/inner/aten::mm"] == 3  # a failed op is a completed (short) call
    assert found["aten::add"] == 1
    assert after.sum().item() == 12
    assert_healthy()
    exact_run()


def test_exception_inside_a_range_records_the_range_once():
    x = torch.ones(4, device="brick")
    with bp.profile():
        with pytest.raises(ValueError):
            with record_function("failing_range"):
                x = x * 2
                raise ValueError("user code failed")
        x = x * 2
    found = counts("path")
    assert found["failing_range"] == 1
    assert found["failing_range/aten::mul"] == 1
    assert found["aten::mul"] == 1
    assert_healthy()


def test_exception_leaving_the_profile_context_still_disables_and_reports():
    x = torch.ones(4, device="brick")
    session = bp.profile()
    with pytest.raises(KeyError):
        with session:
            x = x + 1
            raise KeyError("boom")
    assert not bp.is_enabled()
    assert session.report is not None
    assert session.report.brick("aten::add").count == 1
    exact_run()


# ---- KeyboardInterrupt --------------------------------------------------------------------

# How long a loop waits for the interrupt it arranged (sent 0.05 s in) before the test fails.
INTERRUPT_WAIT_S = 30.0


@contextlib.contextmanager
def sigint_raises_keyboard_interrupt():
    """Python's own SIGINT handler for the body, the previous disposition restored after. A
    process started with SIGINT ignored (a background job of a non-interactive shell, as many
    CI runners start their jobs) has no handler: neither interrupt_main() nor a real SIGINT
    would interrupt anything, and a loop waiting for one would never end."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        # None: the previous handler was not installed from Python; SIG_DFL is what it was.
        signal.signal(signal.SIGINT, signal.SIG_DFL if previous is None else previous)


def run_until_interrupted(step, send, wait_s=INTERRUPT_WAIT_S):
    """Calls ``step()`` until a KeyboardInterrupt ends it. ``send`` delivers the interrupt from a
    timer thread armed after the first step, so it lands inside the caller's region with work
    done; without one the test fails after ``wait_s`` instead of looping forever."""
    step()
    timer = threading.Timer(0.05, send)
    timer.daemon = True
    timer.start()
    deadline = time.monotonic() + wait_s
    try:
        while time.monotonic() < deadline:
            step()
    finally:
        timer.join(timeout=wait_s)  # due 0.05 s after it started
    pytest.fail(f"no KeyboardInterrupt within {wait_s} s")


@pytest.fixture(params=["inherited", "ignored"], ids=lambda d: f"sigint-{d}")
def sigint_disposition(request):
    """Runs an interrupt test with SIGINT as pytest was started, and with SIGINT ignored (as a CI
    runner may start it); either way the test must end, and leave the disposition as it was."""
    before = signal.getsignal(signal.SIGINT)
    if request.param == "ignored":
        signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        expected = signal.getsignal(signal.SIGINT)
        yield
        assert signal.getsignal(signal.SIGINT) == expected, "SIGINT's disposition was not restored"
    finally:
        signal.signal(signal.SIGINT, signal.SIG_DFL if before is None else before)


def test_keyboard_interrupt_during_a_profiled_region(sigint_disposition):
    x = torch.ones(64, device="brick")
    calls = 0

    def step():
        nonlocal x, calls
        x = x + 1
        calls += 1

    with sigint_raises_keyboard_interrupt(), pytest.raises(KeyboardInterrupt):
        with bp.profile() as session:
            with record_function("loop"):
                run_until_interrupted(step, _thread.interrupt_main)
    assert not bp.is_enabled()
    assert session.report.brick("aten::add").count == calls
    found = counts("path")
    assert found["loop"] == 1
    # Every op that ran was recorded once: the interrupt lands between Python bytecodes.
    assert found["loop/aten::add"] == calls
    assert_healthy()
    exact_run()


def test_keyboard_interrupt_under_the_legacy_profiler_and_the_registry(sigint_disposition):
    x = torch.ones(64, device="brick")

    def step():
        nonlocal x
        x = x + 1

    with sigint_raises_keyboard_interrupt(), pytest.raises(KeyboardInterrupt):
        with torch.autograd.profiler.profile(use_device="brick"):
            with bp.profile():
                run_until_interrupted(step, _thread.interrupt_main)
    assert not bp.is_enabled()
    exact_run()
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        x = x * 3
    rows = {e.key: e for e in prof.key_averages()}
    assert rows["aten::mul"].count == 1


def test_sigint_handler_raising_inside_ops_leaves_no_open_brick(sigint_disposition):
    # A real SIGINT delivered while ops run (Python's default handler raises KeyboardInterrupt).
    x = torch.ones(256, device="brick")
    pid = os.getpid()

    def step():
        nonlocal x
        with record_function("step"):
            x = torch.sin(x)

    with sigint_raises_keyboard_interrupt(), pytest.raises(KeyboardInterrupt):
        with bp.profile():
            run_until_interrupted(step, lambda: os.kill(pid, signal.SIGINT))
    exact_run()


def test_a_missing_interrupt_fails_at_the_deadline_instead_of_hanging():
    started = time.monotonic()
    with pytest.raises(pytest.fail.Exception, match="no KeyboardInterrupt within 0.2 s"):
        run_until_interrupted(lambda: time.sleep(0.001), lambda: None, wait_s=0.2)
    assert time.monotonic() - started < 5


# ---- re-entry and nesting -----------------------------------------------------------------


def test_nested_profile_is_refused_and_the_outer_one_stays_exact():
    x = torch.ones(4, device="brick")
    with bp.profile() as outer:
        x = x + 1
        with pytest.raises(RuntimeError, match="already running"):
            with bp.profile():
                pass
        with pytest.raises(RuntimeError, match="already enabled"):
            bp.enable()
        assert bp.is_enabled()
        x = x + 1
    assert outer.report.brick("aten::add").count == 2
    assert_healthy()


def test_profile_reentered_many_times_in_a_row():
    x = torch.ones(4, device="brick")
    for n in range(1, 20):
        with bp.profile() as session:
            for _ in range(n):
                x = x + 1
        assert session.report.brick("aten::add").count == n
    assert_healthy()


def test_registry_and_legacy_profiler_nest_both_ways():
    x = torch.ones(4, device="brick")
    with bp.profile() as session:
        with torch.autograd.profiler.profile(use_device="brick") as prof:
            x = x + 1
    with torch.autograd.profiler.profile(use_device="brick") as prof2:
        with bp.profile() as session2:
            x = x + 1
    for p, s in ((prof, session), (prof2, session2)):
        assert {e.key: e.count for e in p.key_averages()}["aten::add"] == 1
        assert s.report.brick("aten::add").count == 1


# ---- fork ---------------------------------------------------------------------------------


def run_in_child(body, timeout=30.0):
    """Runs `body()` in a forked child; returns what it returned (JSON), failing on a hang."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        status = 0
        try:
            result = json.dumps(body())
        except BaseException as error:  # report anything, including KeyboardInterrupt
            result = json.dumps({"error": f"{type(error).__name__}: {error}"})
            status = 1
        os.write(write_end, result.encode())
        os._exit(status)
    os.close(write_end)
    deadline = time.monotonic() + timeout
    done = 0
    try:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                pytest.fail(f"the forked child hung for more than {timeout} s")
            time.sleep(0.01)
    finally:
        if not done:  # timed out, or the wait itself was interrupted: no child outlives its test
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    with os.fdopen(read_end) as pipe:
        result = json.loads(pipe.read() or "null")
    assert os.waitstatus_to_exitcode(status) == 0, result
    return result


def test_forked_child_records_into_its_own_registry():
    x = torch.ones(4, device="brick")
    with bp.profile() as session:
        for _ in range(5):
            x = x + 1

        def child():
            y = torch.ones(4, device="brick")
            for _ in range(7):
                y = y * 2
            return {"counts": counts(), "health": bp.health(), "enabled": bp.is_enabled()}

        seen = run_in_child(child)
        for _ in range(5):
            x = x + 1
    # The child started empty and recorded only its own work (profiling was on when it forked).
    assert seen["enabled"]
    assert seen["counts"]["aten::mul"] == 7
    assert "aten::add" not in seen["counts"]
    assert seen["health"]["unbalanced_exits"] == 0
    # The parent saw none of the child's work and lost none of its own.
    assert session.report.brick("aten::add").count == 10
    assert "aten::mul" not in {b.name for b in session.report.bricks}
    exact_run()


def test_forked_child_can_run_its_own_profiles():
    def child():
        results = []
        for n in (3, 4):
            z = torch.ones(4, device="brick")
            with bp.profile() as s:
                with record_function("child_range"):
                    for _ in range(n):
                        z = z - 1
            results.append(counts("path"))
        with torch.autograd.profiler.profile(use_device="brick") as prof:
            z = z + 1
        legacy = {e.key: e.count for e in prof.key_averages()}
        return {"registry": results, "legacy_add": legacy.get("aten::add")}

    seen = run_in_child(child)
    assert seen["registry"][0]["child_range/aten::sub"] == 3
    assert seen["registry"][1]["child_range/aten::sub"] == 4
    assert seen["legacy_add"] == 1
    exact_run()


def test_forked_child_logs_into_its_own_empty_timeline():
    from torch_brickdev import _C

    timeline = _C._profiler.timeline
    bp.clear_timeline()
    x = torch.ones(4, device="brick")
    with torch.autograd.profiler.profile(use_device="brick"):
        x = x + 1
    bp.mark("parent")
    before = timeline()
    assert before["records"] and [a[0] for a in before["annotations"]] == ["parent"]

    def child():
        empty = timeline()
        with torch.autograd.profiler.profile(use_device="brick"):
            torch.ones(4, device="brick").add_(1)
        bp.mark("child")
        after = timeline()
        return {"empty": [len(empty["records"]), len(empty["annotations"]),
                          empty["dropped_records"]],
                "records": len(after["records"]),
                "annotations": [a[0] for a in after["annotations"]]}

    seen = run_in_child(child)
    assert seen["empty"] == [0, 0, 0]  # none of the parent's records or marks
    assert seen["records"] > 0  # the child's own profile was logged
    assert seen["annotations"] == ["child"]
    after = timeline()  # the parent's timeline is as it was
    assert after["records"] == before["records"]
    assert after["annotations"] == before["annotations"]
    bp.clear_timeline()
    assert not timeline()["records"]


class BrickWork(Dataset):
    """Each item does brick work in the worker process."""

    def __len__(self):
        return 32

    def __getitem__(self, index):
        t = torch.full((8,), float(index), device="brick")
        return (t * 2).sum().cpu()


def test_dataloader_workers_do_not_touch_the_parents_stats():
    x = torch.ones(4, device="brick")
    with bp.profile() as session:
        with record_function("epoch"):
            loader = DataLoader(BrickWork(), batch_size=4, num_workers=2,
                                multiprocessing_context="fork", timeout=60)  # s per batch
            total = 0.0
            for batch in loader:
                total += float(batch.sum())
                x = x + 1
    assert total == sum(2.0 * 8 * i for i in range(32))
    found = counts("path")
    assert found["epoch"] == 1
    assert found["epoch/aten::add"] == 8  # one per batch, all in the parent
    # The workers' brick work (aten::full, aten::mul, ...) went to their own registries.
    assert not any(path.endswith("aten::full") for path in found), found
    assert_healthy()
    exact_run()


def test_fork_while_other_threads_are_profiling_never_deadlocks_the_child():
    # Other threads hold the profiler's locks at arbitrary moments; the fork handlers must hand
    # the child every lock released.
    stop = threading.Event()
    started = threading.Barrier(4, timeout=30)  # a broken barrier raises in every thread

    def hammer():
        y = torch.ones(4, device="brick")
        first = True
        while not stop.is_set():
            with record_function("hammer"):
                y = y + 1
            bp.mark("tick")
            if first:
                started.wait()
                first = False

    with torch.autograd.profiler.profile(use_device="brick"):
        with bp.profile():
            threads = [threading.Thread(target=hammer, daemon=True) for _ in range(3)]
            for t in threads:
                t.start()
            try:
                # Forks begin once every thread has run an op under both profilers. Right after
                # a profiler starts, each thread's first op refreshes its copy of
                # RecordFunction's callbacks under a lock of PyTorch's own
                # (at::GlobalCallbackManager); a fork at that moment leaves the child waiting
                # on it forever. Brick cannot hold that lock across fork(); its own locks are
                # what this test exercises.
                torch.ones(1, device="brick").add_(1)
                started.wait()
                for _ in range(15):
                    seen = run_in_child(lambda: {
                        "sum": float((torch.ones(4, device="brick") + 1).sum()),
                        "counts": counts(),
                        "stats": len(bp.stats()),
                        "timeline": len(torch_brickdev_timeline()),
                    }, timeout=20.0)
                    assert seen["sum"] == 8.0
                    assert "hammer" not in seen["counts"]  # the hammering threads are not there
            finally:
                stop.set()
                for t in threads:
                    t.join(timeout=60)
    assert not any(t.is_alive() for t in threads), "a hammering thread did not stop"
    assert_healthy()
    exact_run()


def torch_brickdev_timeline():
    from torch_brickdev import _C

    return _C._profiler.timeline()["records"]


def test_a_range_with_an_empty_name_is_timed_not_lost():
    x = torch.ones(4, device="brick")
    with bp.profile():
        with record_function(""):
            x = x + 1
    found = counts("path")
    assert found["(unnamed range)"] == 1
    assert found["(unnamed range)/aten::add"] == 1
    assert_healthy()
