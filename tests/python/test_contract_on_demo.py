"""The decode-profiling contract, checked from pytest with the ``brick_profile`` fixture (the
plugin registered by entry point) on the demo model at small sizes, in each sync mode."""

import statistics

import pytest
import torch

from torch_brickdev.tools import demo

CONFIG = demo.DecodeConfig(layers=2, hidden=256, heads=4, kv_heads=2, vocab=32000,
                           prompt_tokens=4, tokens=16)


@pytest.fixture(scope="module")
def model():
    # One kernel thread: on a busy 2-core machine, two threads make the run-to-run variation
    # of such short decodes (what the stability check measures) swing far more.
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield demo.build_model(CONFIG, "brick:0")
    torch.set_num_threads(threads)


@pytest.mark.parametrize("sync_mode", ["event", "immediate", "deferred"])
def test_demo_decode_satisfies_the_contract(brick_profile, model, sync_mode):
    demo.decode(model, CONFIG, "brick:0")  # warm-up, unprofiled
    run_means = []
    for _ in range(3):
        result = demo.decode(model, CONFIG, "brick:0",
                             region=brick_profile.profile(sync_mode=sync_mode))
        run_means.append(statistics.fmean(result.token_latencies_ns))
    latencies = result.token_latencies_ns
    brick_profile.report.metadata["decode"] = {
        "layers": CONFIG.layers, "tokens": CONFIG.tokens, "runs": len(run_means),
        "token_latencies_ns": latencies, "run_mean_token_ns": run_means,
        "tokens_per_s": 1e9 * CONFIG.tokens / sum(latencies), "sync_mode": sync_mode,
    }
    results = brick_profile.check()  # raises, listing every failed check, on a violation
    by_id = {r.id: r for r in results}
    assert all(r.status == "pass" for r in results), [(r.id, r.status) for r in results]
    assert brick_profile.report.brick("LmHead").count == CONFIG.tokens
    if sync_mode == "deferred":
        assert "launch cost" in by_id["sync-mode"].message


def test_the_fixture_reports_a_violation(brick_profile, model):
    demo.decode(model, CONFIG, "brick:0", region=brick_profile.profile())
    with pytest.raises(AssertionError, match="lmhead-count"):
        brick_profile.check("lmhead-count", tokens=CONFIG.tokens + 1)
