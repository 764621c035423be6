"""The decode-profiling contract checks (torch_brickdev.tools.contract) over real brick reports of a
tiny decode workload (contract_fixtures.py), and over reports crafted to break each check."""

from __future__ import annotations

import copy
import json
import math
import random
import statistics

import pytest

from torch_brickdev.tools import contract, demo
from torch_brickdev.tools.contract import CHECK_IDS, format_results, load, main, run_checks
from torch_brickdev.profiler import load_report

from contract_fixtures import (
    LAYERS, RUNS, TOKENS, TinyDecoder, assert_contract_holds, decode_report, undisturbed_dict,
)
from helpers import REPO, run_python, set_avg

pytestmark = pytest.mark.timing


@pytest.fixture(scope="module")
def reports():
    return {mode: decode_report(mode) for mode in ("event", "immediate", "deferred")}


@pytest.fixture(scope="module")
def base_dict(reports):
    """The event report as a dict: a base on which every check passes, for the tests that break
    one check at a time. The figures that other processes move whatever the code does (see
    MACHINE_TIMED) are set as the run would read undisturbed: every call at its median time,
    the wall 5% above the bricks, per-run medians 1% apart around the last run's median."""
    d = undisturbed_dict(reports["event"])
    median = statistics.median(_decode(d)["token_latencies_ns"])
    _decode(d)["run_median_token_ns"] = [median * (1 + 0.01 * (k - 1)) for k in range(RUNS)]
    return d


def statuses(results):
    return {r.id: r.status for r in results}


def by_id(results):
    return {r.id: r for r in results}


# ---- real reports ------------------------------------------------------------------------------


def test_checks_are_ordered_with_stable_ids():
    assert list(CHECK_IDS) == [
        "coverage", "lmhead-count", "token-accounting", "per-call-ordering", "sync-mode",
        "completeness", "avg-agreement", "structure", "stability", "no-placeholders",
        "graph-capture"]
    assert all(callable(fn) for _, fn in contract.CHECKS)


@pytest.mark.parametrize("mode", ["event", "immediate"])
def test_every_check_passes_on_a_real_decode(reports, mode):
    """Every check passes on a real decode, the machine-timed ones in a form that load cannot
    break (see assert_contract_holds). Stability's verdict is the machine's: other processes (a
    loaded CI runner) make runs differ whatever the code does. It must have compared the median
    of every run and decided by its threshold; what it detects is tested on crafted runs
    (test_stability_*)."""
    results = run_checks(reports[mode])
    assert [r.id for r in results] == list(CHECK_IDS)
    assert_contract_holds(reports[mode], results)
    assert all(r.message for r in results)
    stability = by_id(results)["stability"]
    decode = reports[mode].metadata["decode"]
    assert stability.figures["figure"] == "run_median_token_ns"
    assert stability.figures["runs"] == RUNS == len(decode["run_median_token_ns"])
    assert decode["run_median_token_ns"][-1] == statistics.median(decode["token_latencies_ns"])
    assert stability.figures["run_median_token_ns"] == decode["run_median_token_ns"]
    cv = stability.figures["cv"]
    assert math.isfinite(cv) and cv >= 0
    if cv < contract.STABILITY_MAX_CV:
        assert stability.status == "pass", stability.message
    elif stability.status == "inconclusive":
        # a run the machine descheduled is named as such (test_busy_machine.py covers the rule)
        assert "the machine was busy" in stability.message, stability.message
    else:
        assert stability.status == "fail", stability.message


def test_every_check_passes_on_the_report_read_back(base_dict, tmp_path):
    path = tmp_path / "report.json"
    path.write_text(json.dumps(base_dict))
    results = run_checks(str(path))
    assert all(r.status == "pass" for r in results), format_results(results)
    assert by_id(results)["avg-agreement"].figures["source"] == "file"


def test_deferred_mode_is_recognised_as_launch_cost(reports):
    result = by_id(run_checks(reports["deferred"]))["sync-mode"]
    assert result.status == "pass"
    assert result.message.startswith("deferred: launch cost")
    assert result.figures["sync_mode"] == "deferred"
    assert result.figures["avg_us_cv"] > 0


def test_lmhead_count_states_how_the_final_token_is_counted(reports):
    result = by_id(run_checks(reports["event"]))["lmhead-count"]
    final = reports["event"].metadata["decode"]["final_token"]
    assert repr(final) in result.message and "final sampled token" in result.message
    assert f"ran {TOKENS} times for {TOKENS} decoded tokens" in result.message


def test_format_results_lines_and_verdict(base_dict):
    # The undisturbed report: a real run's coverage is the machine's (a preemption between the
    # bricks lowers it; see MACHINE_TIMED), the format is not.
    results = run_checks(copy.deepcopy(base_dict), only=["coverage"])
    lines = format_results(results).splitlines()
    assert len(lines) == 2
    assert lines[0].startswith("PASS  coverage  top-level 0.95")
    assert "of wall (expected 0.85-1.0)" in lines[0]
    assert lines[1].startswith("verdict: PASS")


def _traced(d, work_ns):
    d["metadata"]["device_timing"] = {"timing": "traced", "tracer": "CUPTI"}
    d["health"]["traced_work_ns"] = work_ns


@pytest.mark.parametrize("work, status, words", [
    (1.0, "pass", "top-level 1.00 of the device work traced"),
    (1.05, "pass", "top-level 0.95 of the device work traced"),
    (2.0, "fail", "0.50 of the device work traced (expected 0.85-1.0)"),
    (0.5, "fail", "work is counted twice"),
    (None, "fail", "health['traced_work_ns'] is None: expected the device work"),
])
def test_traced_bricks_cover_the_device_work_traced_not_the_wall(base_dict, work, status, words):
    """Traced timing sums each brick's work: on a GPU a launch-bound decode's bricks cover a
    fraction of the wall, but must cover all the work the tracer saw."""
    d = copy.deepcopy(base_dict)
    d["wall_ns"] = d["top_level_ns"] * 3  # the host's time between launches
    _traced(d, int(d["top_level_ns"] * work) if work is not None else 0)
    if work is None:  # a report that says it was traced without the figure
        del d["health"]["traced_work_ns"]
    result = by_id(run_checks(d, only=["coverage", "sync-mode"]))
    assert result["coverage"].status == status, result["coverage"].message
    assert words in result["coverage"].message
    assert "traced by CUPTI" in result["sync-mode"].message


def test_only_selects_and_rejects_unknown_ids(reports):
    results = run_checks(reports["event"], only=["stability", "coverage"])
    assert [r.id for r in results] == ["coverage", "stability"]
    with pytest.raises(ValueError, match="'nope'"):
        run_checks(reports["event"], only=["nope"])


# ---- every check fails on a report that breaks it, and only that one ----------------------


def _entries(d, name):
    """The per-name entry and the top-level path entry of a brick."""
    brick = next(b for b in d["bricks"] if b["name"] == name)
    path = next(p for p in d["paths"] if p["path"] == name)
    return brick, path


def _set_count(d, name, count):
    for e in _entries(d, name):
        e["count"] = count
        e["min_ns"] = min(e["min_ns"], e["total_ns"] // count)
        e["p50_ns"] = max(min(e["p50_ns"], e["max_ns"]), e["min_ns"])
        e["avg_us"] = e["total_ns"] / count / 1000


def _avg_ns(d, name):
    brick, _ = _entries(d, name)
    return brick["total_ns"] / brick["count"]


def _decode(d):
    return d["metadata"]["decode"]


def _coverage_low(d):
    d["wall_ns"] = d["top_level_ns"] * 2


def _coverage_high(d):
    d["wall_ns"] = int(d["top_level_ns"] * 0.9)


def _extra_lmhead(d):
    # An LmHead that also ran for the prompt: per-token figures stay consistent with it.
    _set_count(d, "LmHead", TOKENS + 1)
    _decode(d)["tokens_per_s"] = (TOKENS + 1) / sum(_decode(d)["token_latencies_ns"]) * 1e9


def _rate_by_total_calls(d):
    calls = sum(b["count"] for b in d["bricks"])
    _decode(d)["tokens_per_s"] = calls / sum(_decode(d)["token_latencies_ns"]) * 1e9


def _rate_off(d):
    _decode(d)["tokens_per_s"] *= 1.05


def _gate_above_lmhead(d):
    set_avg(d, "GateProjection", _avg_ns(d, "LmHead") * 1.5)


def _lmhead_under_ten_rmsnorm(d):
    # Keeps LmHead > GateProjection > RmsNorm but LmHead < 10 x RmsNorm.
    gate = _avg_ns(d, "GateProjection")
    set_avg(d, "RmsNorm", gate * 0.9)
    set_avg(d, "LmHead", gate * 2)


def _mode_not_reaching_executor(d):
    _decode(d)["sync_mode"] = "deferred"


def _duplicate_brick(d):
    d["bricks"].append(copy.deepcopy(next(b for b in d["bricks"] if b["name"] == "aten::mm")))


def _avg_field_off(d):
    _entries(d, "GateProjection")[0]["avg_us"] *= 1.05


def _extra_attention(d):
    _set_count(d, "AttentionScore", TOKENS * LAYERS + 1)


def _unstable(d):
    median = _decode(d)["run_median_token_ns"][0]
    _decode(d)["run_median_token_ns"] = [median, median * 1.6, median * 0.7]


def _min_above_avg(d):
    brick, _ = _entries(d, "Activation")
    brick["min_ns"] = brick["max_ns"] + 1


def _same_token_latency(d):
    # a constant pasted in for every token (tokens_per_s still agrees with it)
    lat = _decode(d)["token_latencies_ns"]
    _decode(d)["token_latencies_ns"] = [1_000_000] * len(lat)
    _decode(d)["tokens_per_s"] = TOKENS / (1_000_000 * len(lat)) * 1e9


def _skipped_capture(d):
    d["health"]["skipped_capture"] = 3


def _pending_events(d):
    d["health"]["pending_events"] = 2


VIOLATIONS = [
    ("coverage", _coverage_low, "0.50 of wall"),
    ("coverage", _coverage_high, "counted twice"),
    ("lmhead-count", _extra_lmhead, f"LmHead ran {TOKENS + 1} times"),
    ("token-accounting", _rate_by_total_calls, "total brick calls / time"),
    ("token-accounting", _rate_off, "off by 5.0%"),
    ("per-call-ordering", _gate_above_lmhead, "expected LmHead > GateProjection > RmsNorm"),
    ("per-call-ordering", _lmhead_under_ten_rmsnorm, "LmHead > 10 x RmsNorm (event mode)"),
    ("sync-mode", _mode_not_reaching_executor, "did not reach the executor"),
    ("completeness", _duplicate_brick, "duplicate brick name(s) 'aten::mm'"),
    ("avg-agreement", _avg_field_off, "GateProjection: avg_us"),
    ("structure", _extra_attention, f"AttentionScore ran {TOKENS * LAYERS + 1} times, expected "
                                    f"{TOKENS * LAYERS}"),
    ("stability", _unstable, "expected < 0.15"),
    ("no-placeholders", _min_above_avg, "'Activation'"),
    ("no-placeholders", _same_token_latency, "token_latencies_ns: all"),
    ("graph-capture", _skipped_capture, "skipped_capture 3"),
    ("graph-capture", _pending_events, "pending_events 2"),
]


def test_every_check_has_a_violation():
    assert {check for check, _, _ in VIOLATIONS} == set(CHECK_IDS)


@pytest.mark.parametrize("check,mutate,words", VIOLATIONS,
                         ids=[f"{c}-{m.__name__.strip('_')}" for c, m, _ in VIOLATIONS])
def test_a_violation_fails_exactly_its_check(base_dict, check, mutate, words):
    before = statuses(run_checks(copy.deepcopy(base_dict)))
    assert before[check] == "pass"
    d = copy.deepcopy(base_dict)
    mutate(d)
    results = run_checks(d)
    after = statuses(results)
    assert after[check] == "fail", format_results(results)
    assert words in by_id(results)[check].message, by_id(results)[check].message
    others = {k: v for k, v in after.items() if k != check}
    assert others == {k: v for k, v in before.items() if k != check}, format_results(results)


def test_the_ten_times_rule_does_not_apply_to_deferred(base_dict):
    d = copy.deepcopy(base_dict)
    _lmhead_under_ten_rmsnorm(d)
    d["sync_mode"] = "deferred"
    assert by_id(run_checks(d))["per-call-ordering"].status == "pass"


@pytest.mark.parametrize("device", [{"runtime": "cuda"},
                                    {"runtime": "host", "asynchronous": True}])
def test_timing_checks_are_not_applicable_to_deferred_mode_on_an_asynchronous_device(
        base_dict, device):
    """Deferred mode times launches: on an asynchronous device (CUDA; the host runtime with
    deferred completion) coverage and the per-call ordering say n/a there, not fail; in
    immediate and event mode, and in deferred mode on a synchronous device, they are checked."""
    d = copy.deepcopy(base_dict)
    d["device"] = {**d["device"], "asynchronous": None, **device}
    _coverage_low(d)  # the launches cover half the wall
    _lmhead_under_ten_rmsnorm(d)
    ids = ("coverage", "per-call-ordering")
    for mode, asynchronous in (("deferred", True), ("event", True), ("deferred", False)):
        d["sync_mode"] = mode
        if not asynchronous:
            d["device"] = {**d["device"], "runtime": "host", "asynchronous": False}
        results = by_id(run_checks(d, only=ids))
        if mode == "deferred" and asynchronous:
            assert {results[i].status for i in ids} == {"n/a"}, [results[i] for i in ids]
            assert "the launches', not the device's work" in results["coverage"].message
        else:
            assert results["coverage"].status == "fail", (mode, results["coverage"])


def test_missing_brick_is_named(base_dict):
    d = copy.deepcopy(base_dict)
    d["bricks"] = [b for b in d["bricks"] if b["name"] != "AttentionSoftmax"]
    d["paths"] = [p for p in d["paths"] if not p["path"].startswith("AttentionSoftmax")]
    result = by_id(run_checks(d))["completeness"]
    assert result.status == "fail"
    assert "brick 'AttentionSoftmax' never ran" in result.message
    assert result.figures["missing"] == ["AttentionSoftmax"]


def test_unknown_sync_mode_fails(reports):
    report = copy.copy(reports["event"])
    report.sync_mode = None
    result = by_id(run_checks(report))["sync-mode"]
    assert result.status == "fail"
    assert "field 'sync_mode' must be one of 'immediate', 'deferred', 'event', got null" in \
        result.message


def test_all_bricks_sharing_one_avg_is_a_placeholder(base_dict):
    d = copy.deepcopy(base_dict)
    for name in contract.DECODE_BRICKS:
        set_avg(d, name, 50_000)
    result = by_id(run_checks(d))["no-placeholders"]
    assert result.status == "fail" and "share one avg" in result.message


# ---- missing metadata: n/a, and overrides ------------------------------------------------------


def test_checks_without_metadata_are_not_applicable(base_dict):
    d = copy.deepcopy(base_dict)
    d["metadata"] = {}
    results = by_id(run_checks(d))
    for check in ("lmhead-count", "token-accounting", "structure", "stability"):
        assert results[check].status == "n/a", results[check]
    assert results["structure"].message == (
        "report has no decode metadata (layers, tokens): run the demo or pass them")
    assert all(r.status == "pass" for k, r in results.items()
               if k not in ("lmhead-count", "token-accounting", "structure", "stability"))
    overridden = by_id(run_checks(d, layers=LAYERS, tokens=TOKENS))
    assert overridden["structure"].status == "pass"
    assert overridden["lmhead-count"].status == "pass"
    assert by_id(run_checks(d, layers=LAYERS, tokens=TOKENS + 1))["structure"].status == "fail"
    assert "decode" not in d["metadata"]  # overrides never touch the report


def test_stability_needs_two_runs(base_dict):
    d = copy.deepcopy(base_dict)
    _decode(d)["run_median_token_ns"] = _decode(d)["run_median_token_ns"][:1]
    result = by_id(run_checks(d))["stability"]
    assert result.status == "n/a" and "at least 2" in result.message


# ---- stability: what it detects, what it tolerates -------------------------------------------


def _with_runs(base_dict, runs):
    """``base_dict`` with the per-run figures of ``runs`` (per-token latencies of each run),
    computed as the demo computes them."""
    d = copy.deepcopy(base_dict)
    decoded = [demo.DecodeResult(tokens=[], prompt=[], token_latencies_ns=r) for r in runs]
    _decode(d)["run_median_token_ns"] = [r.median_token_ns for r in decoded]
    _decode(d)["run_mean_token_ns"] = [r.mean_token_ns for r in decoded]
    return d


def _steady_runs(runs=5, tokens=32, per_token_ns=20_000_000, seed=0):
    """Per-token latencies of ``runs`` decodes at one pace, with 3% token-to-token noise."""
    rng = random.Random(seed)
    return [[int(per_token_ns * rng.uniform(0.97, 1.03)) for _ in range(tokens)]
            for _ in range(runs)]


def test_stability_passes_when_a_few_tokens_are_slowed(base_dict):
    # Another process takes the core for a few tokens of some runs (7x, 5x, 4x as long): the
    # runs' medians stay together; their means would not.
    runs = _steady_runs()
    for run, token, factor in ((1, 3, 7), (1, 20, 7), (1, 21, 5), (3, 9, 5), (3, 30, 4)):
        runs[run][token] *= factor
    d = _with_runs(base_dict, runs)
    result = by_id(run_checks(d))["stability"]
    assert result.status == "pass", result.message
    assert result.figures["cv"] < 0.05 and "median of each run" in result.message
    by_means = copy.deepcopy(d)
    del _decode(by_means)["run_median_token_ns"]  # as a report from before the medians
    by_means_result = by_id(run_checks(by_means))["stability"]
    assert by_means_result.status == "fail", by_means_result.message
    assert "mean of each run" in by_means_result.message


@pytest.mark.parametrize("slow_run", [0, 2, 4])
def test_stability_fails_when_a_run_is_systematically_slower(base_dict, slow_run):
    # A profiler that perturbs one run (every token 1.5x as long) is what the check detects,
    # also with a few outlier tokens elsewhere.
    runs = _steady_runs()
    runs[slow_run] = [int(t * 1.5) for t in runs[slow_run]]
    runs[(slow_run + 1) % 5][7] *= 6
    result = by_id(run_checks(_with_runs(base_dict, runs)))["stability"]
    assert result.status == "fail", result.message
    assert result.figures["cv"] > 0.15 and "expected < 0.15" in result.message


def test_stability_fails_when_runs_drift(base_dict):
    # Each run 12% slower than the one before (a profiler that accumulates work across runs).
    runs = [[int(t * 1.12 ** k) for t in run] for k, run in enumerate(_steady_runs())]
    result = by_id(run_checks(_with_runs(base_dict, runs)))["stability"]
    assert result.status == "fail", result.message


def test_stability_reads_run_means_of_older_reports(base_dict):
    d = copy.deepcopy(base_dict)
    del _decode(d)["run_median_token_ns"]
    _decode(d)["run_mean_token_ns"] = [1e6, 1.01e6, 0.99e6]
    result = by_id(run_checks(d))["stability"]
    assert result.status == "pass" and result.figures["figure"] == "run_mean_token_ns"
    _decode(d)["run_mean_token_ns"] = [1e6, 1.6e6, 0.7e6]
    assert by_id(run_checks(d))["stability"].status == "fail"
    del _decode(d)["run_mean_token_ns"]
    result = by_id(run_checks(d))["stability"]
    assert result.status == "n/a" and "run_median_token_ns or run_mean_token_ns" in result.message


def test_damaged_run_medians_fail_stability_and_no_placeholders(base_dict):
    d = copy.deepcopy(base_dict)
    _decode(d)["run_median_token_ns"][1] = -5
    results = by_id(run_checks(d))
    assert results["stability"].status == "fail"
    assert "run_median_token_ns[1] is integer -5" in results["stability"].message
    assert results["no-placeholders"].status == "fail"


# ---- loading and the command line -------------------------------------------------------------


def test_load_accepts_path_dict_and_report(reports, base_dict, tmp_path):
    path = tmp_path / "r.json"
    reports["event"].write_json(path)
    assert load(reports["event"]) is reports["event"]
    for source in (path, str(path), copy.deepcopy(base_dict)):
        assert load(source).brick("LmHead").count == TOKENS


def _write(tmp_path, d, name="report.json"):
    path = tmp_path / name
    path.write_text(json.dumps(d))
    return str(path)


def test_main_exit_codes(base_dict, tmp_path, capsys):
    good = _write(tmp_path, base_dict)
    assert main([good]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].startswith("PASS  coverage")
    assert out.splitlines()[-1].startswith("verdict: PASS")

    bad = copy.deepcopy(base_dict)
    _extra_attention(bad)
    assert main([_write(tmp_path, bad, "bad.json")]) == 1
    out = capsys.readouterr().out
    assert "FAIL  structure" in out and "verdict: FAIL" in out and "failed: structure" in out

    assert main([_write(tmp_path, bad, "bad2.json"), "--only", "coverage,sync-mode"]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3

    bare = copy.deepcopy(base_dict)
    bare["metadata"] = {}
    bare_path = _write(tmp_path, bare, "bare.json")
    assert main([bare_path]) == 0
    assert "N/A   structure" in capsys.readouterr().out
    assert main([bare_path, "--layers", str(LAYERS), "--tokens", str(TOKENS + 1)]) == 1
    assert "FAIL  structure" in capsys.readouterr().out


@pytest.mark.parametrize("damage,field", [
    (lambda text, d: text[: len(text) // 2], "truncated"),
    (lambda text, d: json.dumps({**d, "version": 99}), "'version'"),
    (lambda text, d: json.dumps({k: v for k, v in d.items() if k != "wall_ns"}), "'wall_ns'"),
    (lambda text, d: json.dumps({**d, "bricks": [{**d["bricks"][0], "count": "7"}]}), "'count'"),
], ids=["truncated", "wrong-version", "missing-field", "wrong-type"])
def test_main_unreadable_report_exits_2(base_dict, tmp_path, capsys, damage, field):
    path = tmp_path / "broken.json"
    path.write_text(damage(json.dumps(base_dict), base_dict))
    assert main([str(path)]) == 2
    err = capsys.readouterr().err
    assert str(path) in err and field in err


def test_main_missing_file_exits_2(tmp_path, capsys):
    assert main([str(tmp_path / "nowhere.json")]) == 2
    assert "nowhere.json" in capsys.readouterr().err


def test_command_line_in_a_subprocess(base_dict, tmp_path):
    def cli(*args):
        return run_python("-m", "torch_brickdev.tools.contract", *args, cwd=REPO)

    good = cli(_write(tmp_path, base_dict))
    assert good.returncode == 0, good.stderr
    assert "verdict: PASS" in good.stdout
    bad = copy.deepcopy(base_dict)
    _rate_by_total_calls(bad)
    failed = cli(_write(tmp_path, bad, "bad.json"))
    assert failed.returncode == 1 and "FAIL  token-accounting" in failed.stdout
    truncated = tmp_path / "cut.json"
    truncated.write_text(json.dumps(base_dict)[:100])
    broken = cli(str(truncated))
    assert broken.returncode == 2 and str(truncated) in broken.stderr and not broken.stdout


# ---- the pytest plugin ---------------------------------------------------------------------------


def test_brick_profile_fixture(brick_profile, base_dict):
    import torch
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        model = TinyDecoder()
        model.decode(2)
        with brick_profile.profile(sync_mode="event", metadata={"run": "plugin"}) as prof:
            model.decode(4)
    finally:
        torch.set_num_threads(threads)
    assert brick_profile.report is prof.report
    results = brick_profile.check("lmhead-count", "structure", "graph-capture",
                                  layers=LAYERS, tokens=4)
    assert [r.status for r in results] == ["pass", "pass", "pass"]
    # The machine-timed checks (coverage, per-call-ordering), in their load-robust form.
    assert_contract_holds(prof.report, run_checks(prof.report, layers=LAYERS, tokens=4))
    with pytest.raises(AssertionError, match=r"structure: layers=2, tokens=5: AttentionScore ran 8 times"):
        brick_profile.check("structure", layers=LAYERS, tokens=5)

    d = copy.deepcopy(base_dict)
    _coverage_low(d)
    _skipped_capture(d)
    brick_profile.report = load_report(d)
    with pytest.raises(AssertionError) as info:
        brick_profile.check()
    text = str(info.value)
    assert "2 check(s) of the contract 'gpu-decode-profiling-v1' failed" in text
    assert "coverage: top-level 0.50 of wall" in text and "skipped_capture 3" in text
