"""The decode demo: per-block counts in every sync mode, the files it writes, brick == CPU, and
config validation."""

import json
import os

import pytest
import torch

from torch_brickdev.tools import demo
from torch_brickdev.tools.contract import DECODE_BRICKS
from torch_brickdev import profiler as bp

pytestmark = pytest.mark.timing

SMALL = dict(layers=2, hidden=64, heads=4, kv_heads=2, vocab=256, prompt_tokens=4, tokens=6)
RUNS = 2
MODES = ("event", "deferred", "immediate")


def _config(**overrides):
    return demo.DecodeConfig(**{**SMALL, **overrides})


@pytest.fixture(scope="module")
def cpu_tokens():
    config = _config()
    return demo.decode(demo.build_model(config, "cpu"), config, "cpu").tokens


@pytest.fixture(scope="module", params=MODES)
def demo_run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp(f"demo_{request.param}")
    return request.param, out, demo.run_demo(_config(), device="brick:0", sync_mode=request.param,
                                             runs=RUNS, out_dir=out, progress=False)


def test_block_counts_are_exact(demo_run):
    mode, _, result = demo_run
    c, report = result["config"], result["report"]
    assert report.sync_mode.value == mode
    per_layer = c.layers * c.tokens
    expected = {"Embedding": c.tokens, "RmsNorm": (2 * c.layers + 1) * c.tokens, "LmHead": c.tokens,
                "Sampling": c.tokens}
    for name in ("QkvProjection", "RopeEmbedding", "AttentionScore", "AttentionSoftmax",
                 "AttentionOutput", "OutputProjection", "GateProjection", "UpProjection",
                 "Activation", "DownProjection"):
        expected[name] = per_layer
    assert set(expected) == set(DECODE_BRICKS)
    for name, count in expected.items():
        brick = report.brick(name)
        assert (brick.kind, brick.count) == ("range", count), name
        assert brick.total_ns > 0, name
    ranges = {b.name for b in report.bricks if b.kind == "range"}
    assert ranges == set(DECODE_BRICKS)
    # The ranges are siblings: every range path sits at depth 0.
    assert all(p.depth == 0 for p in report.paths if p.kind == "range")
    assert report.health["unbalanced_exits"] == 0


def test_files_and_metadata(demo_run):
    _, out, result = demo_run
    c = result["config"]
    assert result["report_path"] == os.path.join(str(out), "report.json")
    loaded = bp.load_report(result["report_path"])
    assert loaded.brick("LmHead").count == c.tokens
    meta = loaded.metadata["decode"]
    assert meta["model"] == "qwen-style"
    assert (meta["layers"], meta["hidden"], meta["heads"], meta["kv_heads"], meta["vocab"]) == (2, 64, 4, 2, 256)
    assert meta["intermediate"] == 192 and meta["intermediate"] % 64 == 0
    assert (meta["prompt_tokens"], meta["tokens"], meta["runs"], meta["device"]) == (4, 6, RUNS, "brick:0")
    assert len(meta["token_latencies_ns"]) == c.tokens and all(t > 0 for t in meta["token_latencies_ns"])
    assert len(meta["run_mean_token_ns"]) == RUNS
    assert meta["tokens_per_s"] > 0 and 0 < meta["p50_token_ns"] <= meta["p99_token_ns"]
    assert "LmHead.count == tokens" in meta["final_token"]
    with open(result["trace_path"]) as f:
        trace = json.load(f)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"LmHead", "Sampling", "RmsNorm"} <= names
    summary = demo.format_summary(result)
    for text in ("LmHead", "Self BRICK", "tokens/s", "p50", "p99", result["report_path"], result["trace_path"]):
        assert text in summary


def test_tokens_match_cpu(demo_run, cpu_tokens):
    _, _, result = demo_run
    assert len(cpu_tokens) == SMALL["tokens"]
    assert result["tokens"] == cpu_tokens  # hence identical across the sync modes too
    assert result["legacy_tokens"] == cpu_tokens


def test_default_config_is_valid():
    c = demo.DecodeConfig().validate()
    # Sizes at which LmHead > 10 x RmsNorm holds on a 2-core CPU (the contract's ordering check).
    assert (c.layers, c.hidden, c.heads, c.kv_heads, c.vocab, c.prompt_tokens, c.tokens) == (2, 512, 8, 2, 32000, 16, 32)
    assert c.intermediate_size == 1408


@pytest.mark.parametrize("overrides, message", [
    (dict(layers=0), "layers must be a positive integer, got 0"),
    (dict(tokens=-1), "tokens must be a positive integer"),
    (dict(heads=6), "heads (6) must divide hidden size (64)"),
    (dict(heads=4, kv_heads=3), "kv_heads (3) must divide heads (4)"),
    (dict(hidden=60, heads=4, kv_heads=2), "head_dim = hidden / heads = 15 must be even"),
    (dict(prompt_tokens=4000, tokens=100), "must not exceed max_positions (4096)"),
])
def test_validation_fails_before_any_work(overrides, message, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("build_model reached")

    monkeypatch.setattr(demo.run, "build_model", no_model)
    before = torch.brick.memory_stats()["allocation.all.allocated"]
    out = tmp_path / "out"
    with pytest.raises(ValueError) as info:
        demo.run_demo(_config(**overrides), out_dir=out, progress=False)
    assert message in str(info.value)
    with pytest.raises(ValueError):
        _config(**overrides).validate()
    assert torch.brick.memory_stats()["allocation.all.allocated"] == before
    assert not out.exists()


def test_kv_cache_decode_matches_full_recompute():
    """Each cached decode step's token is the argmax of a cache-free pass over the whole prefix."""
    config = _config()
    calls = []
    result = demo.decode(demo.build_model(config, "cpu"), config, "cpu",
                         progress=lambda step, total, ns: calls.append((step, total)))
    assert calls == [(k + 1, config.tokens) for k in range(config.tokens)]
    fresh = demo.build_model(config, "cpu")
    sequence = result.prompt + result.tokens
    with torch.no_grad():
        for k, token in enumerate(result.tokens):
            prefix = torch.tensor([sequence[:config.prompt_tokens + k]])
            assert int(fresh(prefix, 0).argmax()) == token, k
