"""Verdicts that know a busy machine: a report carries what the machine denied the profiled region
(report.machine), and a timing check whose failure that explains is INCONCLUSIVE, while the
same failure with the CPU available still fails. Crafted reports for each rule; the real demo
beside two busy loops (never FAIL) and a measurement of the denial itself."""

from __future__ import annotations

import copy
import json
import os
import time

import pytest
import torch

from contract_fixtures import decode_report, undisturbed_dict
from helpers import busy_loops, run_cli, run_python, set_avg
import torch_brickdev
from torch_brickdev import profiler as bp
from torch_brickdev.tools.contract import EXIT_INCONCLUSIVE, format_results, run_checks

pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def base_dict():
    d = undisturbed_dict(decode_report("event", runs=3))  # every check passes on it
    d["machine"] = {"denied_share": 0.0, "denied_source": "runqueue"}
    decode = d["metadata"]["decode"]
    decode["run_median_token_ns"] = [1e6, 1.01e6, 0.99e6]
    decode["run_denied_share"] = [0.0, 0.0, 0.0]
    return d


def result_of(d, check):
    return {r.id: r for r in run_checks(d)}[check]


def with_runs(base, medians, denied):
    d = copy.deepcopy(base)
    d["metadata"]["decode"]["run_median_token_ns"] = medians
    d["metadata"]["decode"]["run_denied_share"] = denied
    return d


def test_the_base_passes(base_dict):
    results = run_checks(base_dict)
    assert all(r.status == "pass" for r in results), format_results(results)


# ---- stability ---------------------------------------------------------------------------------


def test_a_slow_run_the_machine_descheduled_is_inconclusive(base_dict):
    r = result_of(with_runs(base_dict, [1e6, 1.5e6, 1.01e6], [0.0, 0.33, 0.01]), "stability")
    assert r.status == "inconclusive", r.message
    assert "run 2 33%" in r.message and "less those waits the runs agree" in r.message


def test_a_slow_run_its_waits_do_not_account_for_fails(base_dict):
    """Run 2 waited for a CPU 6 % of its time but took 1.5x as long: 33 % of it is more than
    its waits; the rest is the program's own (a sleep, a lock)."""
    r = result_of(with_runs(base_dict, [1e6, 1.5e6, 1.01e6], [0.0, 0.06, 0.0]), "stability")
    assert r.status == "fail", r.message
    assert "run 2 6%" in r.message and "less those waits the runs still differ" in r.message


def test_a_slow_run_with_the_cpu_available_still_fails(base_dict):
    r = result_of(with_runs(base_dict, [1e6, 1.5e6, 1.01e6], [0.0, 0.0, 0.01]), "stability")
    assert r.status == "fail" and "no run was descheduled" in r.message


def test_undisturbed_runs_that_differ_fail_on_a_busy_machine(base_dict):
    r = result_of(with_runs(base_dict, [1e6, 1.6e6, 0.7e6], [0.0, 0.4, 0.0]), "stability")
    assert r.status == "fail" and "less those waits the runs still differ" in r.message


def test_runs_the_machine_all_descheduled_are_judged_less_their_waits(base_dict):
    """Every run waited for a CPU: less its waits (not below the fastest run), each must come
    to what the others do. Run 2, 2.3x the fastest, waiting 60 % of its time does; waiting 40 %
    it does not (at most 1.67x)."""
    r = result_of(with_runs(base_dict, [1e6, 1.6e6, 0.7e6], [0.3, 0.6, 0.35]), "stability")
    assert r.status == "inconclusive" and "less those waits the runs agree" in r.message
    r = result_of(with_runs(base_dict, [1e6, 1.6e6, 0.7e6], [0.3, 0.4, 0.35]), "stability")
    assert r.status == "fail" and "more than the machine accounts for" in r.message


def test_shares_of_time_off_the_cpu_excuse_nothing(base_dict):
    """Where no run-queue wait was measured, a run's share is the time its thread was off its
    CPU: its own sleep, I/O and locks as much as the machine's doing."""
    d = with_runs(base_dict, [1e6, 1.5e6, 1.01e6], [0.0, 0.33, 0.01])
    d["machine"]["denied_source"] = "off-cpu"
    r = result_of(d, "stability")
    assert r.status == "fail" and "no run-queue wait was measured" in r.message, r.message


def test_a_malformed_denied_series_excuses_nothing_and_is_named(base_dict):
    r = result_of(with_runs(base_dict, [1e6, 1.6e6, 0.7e6], [0.3, 1.4, 0.35]), "stability")
    assert r.status == "fail"
    assert "metadata decode.run_denied_share[1] is number 1.4: expected a list of numbers in " \
        "[0, 1]" in r.message


# ---- coverage and ordering ---------------------------------------------------------------------


def test_coverage_the_denied_time_accounts_for_is_inconclusive(base_dict):
    d = copy.deepcopy(base_dict)
    d["wall_ns"] = round(d["top_level_ns"] / 0.6)
    d["wall_s"] = d["wall_ns"] / 1e9
    d["machine"]["denied_share"] = 0.35
    r = result_of(d, "coverage")
    assert r.status == "inconclusive" and "accounts for the gap: 0.60 + 0.35 >= 0.85" in r.message
    d["machine"]["denied_share"] = 0.1
    r = result_of(d, "coverage")
    assert r.status == "fail" and "not a busy machine" in r.message
    d["machine"]["steal_share"] = 0.16  # the hypervisor's steal is denied time too
    r = result_of(d, "coverage")
    assert r.status == "inconclusive" and "+ steal" in r.message, r.message
    # Off its CPU 35 % of the wall with no run-queue wait measured: its own sleep or I/O.
    d["machine"] = {"denied_share": 0.35, "denied_source": "off-cpu"}
    r = result_of(d, "coverage")
    assert r.status == "fail" and "no run-queue wait was measured" in r.message, r.message
    del d["machine"]
    assert result_of(d, "coverage").status == "fail"  # no figures: nothing excuses it


def test_an_ordering_the_median_keeps_is_inconclusive_on_a_busy_machine(base_dict):
    d = copy.deepcopy(base_dict)
    lm = next(b for b in d["bricks"] if b["name"] == "LmHead")
    set_avg(d, "RmsNorm", lm["total_ns"] / lm["count"] / 5)  # preempted RmsNorm calls
    rms = next(b for b in d["bricks"] if b["name"] == "RmsNorm")
    beyond = (rms["total_ns"] - rms["count"] * rms["p50_ns"]) / d["wall_ns"]
    d["machine"]["denied_share"] = min(1.0, beyond)  # the waits that made those calls long
    r = result_of(d, "per-call-ordering")
    assert r.status == "inconclusive" and "the order holds by the median call" in r.message
    d["machine"]["denied_share"] = 0.01
    assert result_of(d, "per-call-ordering").status == "fail"
    # Waits under half of the time RmsNorm's calls spent beyond their median: its own (a lock,
    # a sleep in some calls), however busy the machine was.
    d["machine"]["denied_share"] = 0.45 * beyond
    assert d["machine"]["denied_share"] >= 0.05, beyond  # past `busy`: the proportion decides
    r = result_of(d, "per-call-ordering")
    assert r.status == "fail" and "spent beyond its median calls is more than the machine " \
        "denied the thread" in r.message, r.message


def test_the_command_line_exits_with_a_distinct_status(base_dict, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(with_runs(base_dict, [1e6, 1.5e6, 1.01e6], [0.0, 0.33, 0.01])))
    done = run_cli("check", str(path))
    assert done.returncode == EXIT_INCONCLUSIVE == 3, done
    assert done.stdout.splitlines()[-1].startswith("verdict: INCONCLUSIVE (10 passed, 0 failed, "
                                                   "1 inconclusive, 0 n/a of 11 checks")


# ---- what the machine denied, measured ---------------------------------------------------------


def test_a_report_carries_what_the_machine_denied(one_thread):
    x = torch.randn(256, 256, device="brick")

    def profiled():
        with bp.profile() as prof:
            end = time.perf_counter() + 0.6
            while time.perf_counter() < end:
                x @ x
        return prof.report.machine
    quiet = profiled()
    cpus = len(os.sched_getaffinity(0))
    loops = busy_loops(cpus + 1, seconds=60)  # more runnable threads than CPUs: some wait
    try:
        time.sleep(0.3)
        busy = profiled()
    finally:
        for p in loops:
            p.kill()
            p.wait()
    for m in (quiet, busy):
        assert 0 < m["thread_cpu_ns"] <= m["wall_ns"] * 1.05
        assert 0 <= m["denied_share"] <= 1 and m["denied_source"] in ("runqueue", "off-cpu")
        if m["denied_source"] == "runqueue":  # one thread: the pool is the profiling thread
            assert m["kernel_thread_runqueue_wait_ns"] == m["runqueue_wait_ns"], m
    # Sharing the CPUs with more busy threads than there are CPUs, the thread waited for one.
    assert busy["denied_share"] > 0.1, (quiet, busy)
    # And the loops' CPU time shows as the rest of the machine's: at least half a CPU's worth.
    assert busy["others_cpu_ns"] >= 0.5 * busy["wall_ns"], (quiet, busy)
    assert busy["others_share"] > quiet["others_share"], (quiet, busy)


def test_the_intra_op_pool_is_every_thread_a_parallel_kernel_runs_on():
    import threading

    from torch_brickdev.profiler import machine

    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        pool = machine.kernel_thread_ids()
        assert len(pool) == 2 and threading.get_native_id() in pool, pool
        torch.set_num_threads(1)
        assert machine.kernel_thread_ids() == (threading.get_native_id(),)
    finally:
        torch.set_num_threads(threads)


def test_an_intra_op_threads_wait_is_the_evidence_where_longer_than_the_profiling_threads():
    """A parallel op ends with its slowest thread: a pool thread kept from a CPU delays it while
    the profiling thread, its share done, waits at the barrier without queueing for a CPU."""
    from torch_brickdev.profiler import machine

    figures = {"denied_share": 0.1, "denied_source": "runqueue", "wall_ns": 1_000_000,
               "kernel_thread_runqueue_wait_ns": 600_000}
    got = machine.denied(figures, 1_000_000)
    assert (got.runqueue_ns, got.kernel_thread) == (600_000, True)
    assert got.text() == "run-queue wait of an intra-op thread 0.6 ms"
    figures["kernel_thread_runqueue_wait_ns"] = 50_000  # shorter: the profiling thread's counts
    got = machine.denied(figures, 1_000_000)
    assert (got.runqueue_ns, got.kernel_thread) == (100_000, False)
    for odd in (True, -5, "600000", 1e9):  # never more evidence than a measured int
        figures["kernel_thread_runqueue_wait_ns"] = odd
        assert machine.denied(figures, 1_000_000).runqueue_ns <= 1_000_000


@pytest.mark.timeout(300)
def test_the_demo_beside_two_busy_loops_never_fails(tmp_path):
    loops = busy_loops(2, seconds=60)
    try:
        done = run_cli("demo", "--no-progress", "--tokens", "16", "--runs", "3", "-o",
                       str(tmp_path), timeout=240)
    finally:
        for p in loops:
            p.kill()
            p.wait()
    verdict = done.stdout.splitlines()[-1]
    assert done.returncode in (0, EXIT_INCONCLUSIVE), done.stdout[-3000:] + done.stderr[-3000:]
    assert verdict.startswith(("verdict: PASS", "verdict: INCONCLUSIVE")), verdict
    machine = json.loads((tmp_path / "report.json").read_text())["machine"]
    assert machine["denied_share"] > 0  # the loops took the CPUs now and then


def test_the_fixture_warns_on_an_inconclusive_check_and_does_not_fail(brick_profile, base_dict):
    from torch_brickdev.tools.pytest_plugin import BrickInconclusiveWarning

    brick_profile.report = bp.load_report(
        with_runs(base_dict, [1e6, 1.5e6, 1.01e6], [0.0, 0.33, 0.01]))
    with pytest.warns(BrickInconclusiveWarning, match="stability inconclusive: CV of per-token"):
        results = brick_profile.check()
    assert [r.id for r in results if r.inconclusive] == ["stability"]


def _slowed(base, factor, name="LmHead"):
    """``base`` with ``name`` ``factor`` times slower (every call), the wall grown by as much."""
    d = copy.deepcopy(base)
    b = next(b for b in d["bricks"] if b["name"] == name)
    added = b["total_ns"] * (factor - 1)
    for key in ("total_ns", "min_ns", "max_ns", "last_ns", "p50_ns", "p90_ns", "p99_ns"):
        b[key] = type(b[key])(b[key] * factor)
    b["avg_us"] = b["total_ns"] / b["count"] / 1000
    d["wall_ns"] += int(added)
    d["wall_s"] = d["wall_ns"] / 1e9
    return d


def test_the_fixture_fails_a_baseline_slowed_by_sleeping_beside_busy_processes(
        brick_profile, base_dict, tmp_path):
    """LmHead 5x slower while other processes used 34 % more of the machine's CPUs and the
    thread hardly waited for one: compare_baseline fails; the same slowdown with the thread
    waiting for a CPU most of the added time warns, inconclusive."""
    from torch_brickdev.tools.pytest_plugin import BrickInconclusiveWarning

    base = copy.deepcopy(base_dict)
    base["machine"].update(others_share=0.05, denied_share=0.01)
    path = tmp_path / "baseline.json"
    path.write_text(json.dumps(base))
    slept = _slowed(base, 5.0)
    slept["machine"].update(others_share=0.39, denied_share=0.02)
    brick_profile.report = bp.load_report(slept)
    with pytest.raises(AssertionError, match=r"1 brick\(s\) regressed against the baseline .*"
                       r"LmHead"):
        brick_profile.compare_baseline(str(path))
    waited = _slowed(base, 5.0)
    added = waited["wall_ns"] - base["wall_ns"]
    waited["machine"]["denied_share"] = 0.01 + 0.8 * added / waited["wall_ns"]
    brick_profile.report = bp.load_report(waited)
    with pytest.warns(BrickInconclusiveWarning, match="inconclusive"):
        assert brick_profile.compare_baseline(str(path)).inconclusive


# A profiled program for the end-to-end test: STEPS steps of a fixed number of matmuls (the same
# work in every run), each step sleeping argv[3] seconds, its thread and its kernels' pinned to
# CPU argv[2]; the report written to argv[1].
_STEPS_SCRIPT = """
import os, sys, time
os.sched_setaffinity(0, {int(sys.argv[2])})
import torch
from torch.profiler import record_function
import torch_brickdev
from torch_brickdev import profiler as bp

torch.set_num_threads(1)
x = torch.randn(256, 256, device="brick")
with bp.profile() as prof:
    for _ in range(10):
        with record_function("Step"):
            for _ in range(int(sys.argv[4])):
                x @ x
            time.sleep(float(sys.argv[3]))
prof.report.write_json(sys.argv[1])
"""


@pytest.mark.skipif(not os.path.isfile("/proc/self/schedstat"), reason="needs Linux schedstat")
@pytest.mark.timeout(400)
def test_a_real_run_that_sleeps_fails_and_one_that_lost_its_cpu_is_inconclusive(tmp_path):
    """One CPU, the program on it alone, then beside two busy loops on the same CPU: sleeping
    300 ms in each step, its slowdown is its own and diff fails it (exit 1) though the loops
    made it wait for the CPU now and then; doing only its work, slowed by waiting for the CPU
    the loops held, diff calls it inconclusive (exit 3)."""
    script = tmp_path / "steps.py"
    script.write_text(_STEPS_SCRIPT)
    cpu = min(os.sched_getaffinity(0))
    matmuls = 40

    def run(name, sleep_s, loops):
        out = tmp_path / f"{name}.json"
        busy = busy_loops(loops, seconds=120, cpu=cpu)
        try:
            done = run_python(str(script), str(out), str(cpu), str(sleep_s), str(matmuls),
                              timeout=180)
        finally:
            for p in busy:
                p.kill()
                p.wait()
        assert done.returncode == 0, done.stdout + done.stderr
        return str(out)

    def diff(base, new):
        return run_cli("diff", base, new)

    base = run("base", 0, 0)
    slept = diff(base, run("slept", 0.3, 2))
    assert slept.returncode == 1, slept.stdout + slept.stderr
    step = next(line for line in slept.stdout.splitlines() if line.startswith("Step "))
    assert " slower " in step and "the program's own time" in step, slept.stdout
    waited = diff(base, run("waited", 0, 2))
    # Never a regression. Inconclusive where the base run had its CPU: on a machine whose other
    # work already took the CPU from the base run (it waited too), the loops may add too little
    # to tell, and diff may pass.
    base_denied = json.loads(open(base).read()).get("machine", {}).get("denied_share") or 0
    if base_denied >= 0.1 and waited.returncode == 0:
        return
    assert waited.returncode == 3, waited.stdout + waited.stderr
    step = next(line for line in waited.stdout.splitlines() if line.startswith("Step "))
    assert " busy " in step, waited.stdout


def _schedstat_descriptors() -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        count += "/task/" in target and target.endswith("/schedstat")
    return count


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_machine_samples_keep_one_descriptor_per_live_thread_and_none_across_a_fork():
    import threading

    from torch_brickdev.profiler import machine

    release = threading.Event()
    workers = [threading.Thread(target=release.wait) for _ in range(4)]
    for worker in workers:
        worker.start()
    try:
        machine.sample()
        assert _schedstat_descriptors() == len(os.listdir("/proc/self/task"))
    finally:
        release.set()
        for worker in workers:
            worker.join()
    sample = machine.sample()  # the ended threads' files are closed
    assert _schedstat_descriptors() == len(os.listdir("/proc/self/task"))
    assert sample.thread_schedstat is not None
    pid = os.fork()
    if pid == 0:  # the child's sample reads its own task, not the parent's descriptors
        ok = machine.sample().thread_schedstat is not None and _schedstat_descriptors() == len(
            os.listdir("/proc/self/task"))
        os._exit(0 if ok else 1)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs Linux's /proc")
def test_machine_samples_see_every_thread_though_they_list_the_threads_only_on_a_change():
    """A sample lists /proc/self/task again only when the thread count changed or a listed
    thread ended; each sample still holds exactly the process's threads, also when one thread
    ended and another started between two samples (the same count)."""
    import threading

    from torch_brickdev.profiler import machine

    def listings():
        return torch_brickdev._C._profiler.machine_sample_reads()[1]

    def threads_now():
        return {int(tid) for tid in os.listdir("/proc/self/task")}

    machine.sample()
    before = listings()
    assert set(machine.sample().process_waits) == threads_now()
    assert listings() == before  # nothing changed: not listed again

    release = [threading.Event() for _ in range(2)]
    workers = [threading.Thread(target=event.wait) for event in release]
    workers[0].start()
    try:
        assert set(machine.sample().process_waits) == threads_now()  # one more thread
        old = workers[0].native_id
        release[0].set()
        workers[0].join()
        workers[1].start()  # one ended, another started: the same count
        seen = set(machine.sample().process_waits)
        assert seen == threads_now() and old not in seen and workers[1].native_id in seen
    finally:
        for event in release:
            event.set()
        for worker in workers:
            if worker.is_alive() or worker.ident is not None:
                worker.join()
    assert set(machine.sample().process_waits) == threads_now()


@pytest.mark.skipif(not os.path.isfile("/proc/stat"), reason="needs Linux's /proc/stat")
def test_tick_figures_come_only_with_regions_long_enough_for_them():
    """/proc/stat counts 10 ms ticks: over a region shorter than 20 ticks of the machine's CPUs,
    the steal and the other processes' CPU time would be a tick or two, so the report leaves
    them out, and the profile does not pay for reading /proc/stat at its end."""
    from torch_brickdev.profiler import machine

    def stat_reads():
        return torch_brickdev._C._profiler.machine_sample_reads()[0]

    x = torch.ones(4, device="brick")
    first = stat_reads()
    with bp.profile() as short:
        x + x
    assert stat_reads() == first + 1  # at the start only
    assert not machine.spans_enough_ticks(short.report.machine["wall_ns"])
    assert not {"steal_ns", "others_cpu_ns", "others_share"} & set(short.report.machine)
    needed = 20 * 1e9 / os.sysconf("SC_CLK_TCK") / (os.cpu_count() or 1)
    with bp.profile() as long:
        time.sleep(needed / 1e9 * 1.2)
    assert stat_reads() == first + 3 and machine.spans_enough_ticks(long.report.machine["wall_ns"])
    assert 0 <= long.report.machine["others_share"] <= 1
    assert long.report.machine["others_cpu_ns"] >= 0
