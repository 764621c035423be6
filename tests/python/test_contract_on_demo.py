"""The decode-profiling contract, checked from pytest with the ``brick_profile`` fixture (the
plugin registered by entry point) on the demo model at small sizes, in each sync mode."""

import os
import statistics

import pytest
import torch

from torch_brickdev.tools import demo
from torch_brickdev.tools.contract import CHECK_IDS, run_checks

from contract_fixtures import MACHINE_TIMED, assert_contract_holds

pytestmark = pytest.mark.timing

# A wide MLP (intermediate 64 x hidden): a GateProjection call (16 MB of weights) then costs
# several RmsNorm calls even when another process slows the machine, so the per-call ordering
# holds by a margin that load cannot erase.
CONFIG = demo.DecodeConfig(layers=2, hidden=256, heads=4, kv_heads=2, vocab=32000,
                           prompt_tokens=4, tokens=16, intermediate=16384)
RUNS = 3


@pytest.fixture(scope="module")
def model():
    # One kernel thread: on a busy 2-core machine, two threads make the run-to-run variation
    # of such short decodes (what the stability check measures) swing far more.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield demo.build_model(CONFIG, "brick:0")
    torch.set_num_threads(threads)


# Each sync mode with ops timed at the dispatcher, and event mode with ops timed at brick's
# kernels (the contract's bricks are ranges: it holds either way).
@pytest.mark.parametrize("sync_mode,ops", [("event", "dispatcher"), ("immediate", "dispatcher"),
                                           ("deferred", "dispatcher"), ("event", "kernels")])
def test_demo_decode_satisfies_the_contract(brick_profile, model, sync_mode, ops):
    demo.decode(model, CONFIG, "brick:0")  # warm-up, unprofiled
    run_means, run_medians = [], []
    for _ in range(RUNS):
        result = demo.decode(model, CONFIG, "brick:0",
                             region=brick_profile.profile(sync_mode=sync_mode, ops=ops))
        run_means.append(statistics.fmean(result.token_latencies_ns))
        run_medians.append(result.median_token_ns)
    latencies = result.token_latencies_ns
    brick_profile.report.metadata["decode"] = {
        "layers": CONFIG.layers, "tokens": CONFIG.tokens, "runs": len(run_means),
        "token_latencies_ns": latencies, "run_mean_token_ns": run_means,
        "run_median_token_ns": run_medians,
        "tokens_per_s": 1e9 * CONFIG.tokens / sum(latencies), "sync_mode": sync_mode,
    }
    # The checks the code controls, through the fixture (it raises, listing every failed check);
    # the machine-timed ones in their load-robust form (see contract_fixtures.MACHINE_TIMED).
    results = brick_profile.check(*(i for i in CHECK_IDS if i not in MACHINE_TIMED))
    assert all(r.status == "pass" for r in results), [(r.id, r.status) for r in results]
    assert_contract_holds(brick_profile.report, run_checks(brick_profile.report))
    by_id = {r.id: r for r in results}
    assert brick_profile.report.brick("LmHead").count == CONFIG.tokens
    assert statistics.median(latencies) == run_medians[-1]
    if sync_mode == "deferred":
        assert "launch cost" in by_id["sync-mode"].message
    ops_seen = {b.name for b in brick_profile.report.bricks if b.kind == "op"}
    assert ("aten::linear" in ops_seen) == (ops == "dispatcher"), sorted(ops_seen)


def test_the_fixture_reports_a_violation(brick_profile, model):
    demo.decode(model, CONFIG, "brick:0", region=brick_profile.profile())
    with pytest.raises(AssertionError, match="lmhead-count"):
        brick_profile.check("lmhead-count", tokens=CONFIG.tokens + 1)


def test_the_demo_records_per_run_medians_and_its_threads(tmp_path):
    small = demo.DecodeConfig(layers=1, hidden=64, heads=4, kv_heads=2, vocab=256,
                              prompt_tokens=4, tokens=6)
    result = demo.run_demo(small, runs=3, out_dir=tmp_path, progress=False)
    decode = result["report"].metadata["decode"]
    assert len(decode["run_median_token_ns"]) == len(decode["run_mean_token_ns"]) == 3
    assert decode["run_median_token_ns"][-1] == statistics.median(decode["token_latencies_ns"])
    assert decode["run_mean_token_ns"][-1] == statistics.fmean(decode["token_latencies_ns"])
    assert decode["threads"] == result["threads"] == torch.get_num_threads()
    stability = {r.id: r for r in run_checks(result["report"])}["stability"]
    assert stability.figures["figure"] == "run_median_token_ns"
    summary = demo.format_summary(result)
    assert f"{result['threads']} kernel thread(s)" in summary and "median per run (ms)" in summary


@pytest.mark.parametrize("cpus, torch_threads, expected", [
    (2, 2, 1), (1, 1, 1), (16, 16, 8), (16, 4, 4), (3, 3, 1)])
def test_default_threads_leave_room_for_other_work(monkeypatch, cpus, torch_threads, expected):
    # Half the CPUs the process may use, at least 1, never above torch's own default.
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cpus)),
                        raising=False)
    monkeypatch.setattr(torch, "get_num_threads", lambda: torch_threads)
    assert demo.default_threads() == expected
