"""Where the registry times ops: at the dispatcher (``profile()``, every op through PyTorch's
RecordFunction) or at brick's kernels (``profile(ops="kernels")``, the ops that run device
work, without RecordFunction on the op path). Ranges and autograd nodes are bricks either way."""

import json
import time

import pytest
import torch

from helpers import run_cli
from profiler_helpers import TwoLayer, by_name, clean_profiler, spin_cpu_op  # noqa: F401
from torch_brickdev import _C
from torch_brickdev import profiler as bp

pytestmark = pytest.mark.usefixtures("clean_profiler")


def _train_step(model, x):
    model.zero_grad()
    loss = model(x).sum()
    with torch.profiler.record_function("Backward"):
        loss.backward()


def _brick_level_counts(report, kernel_names):
    """Per op name, the dispatcher's calls made at brick level: not inside another brick kernel's
    own work (the backing device's kernels dispatch ops of their own, e.g. a CPU sum's inner
    sum), which a profile of kernels does not see."""
    kinds = {b.path: b.kind for b in report.paths}
    counts = {}
    for b in report.paths:
        parent, _, name = b.path.rpartition("/")
        parent_name = parent.rpartition("/")[2]
        if b.kind == "op" and not (parent and kinds[parent] == "op" and parent_name in kernel_names):
            counts[name] = counts.get(name, 0) + b.count
    return counts


def _profile(ops, work):
    with bp.profile(ops=ops) as p:
        work()
    return p.report


def test_kernels_are_the_ops_that_run_device_work_with_the_dispatchers_counts(brick):
    torch.manual_seed(0)
    model = TwoLayer().to(brick)
    x = torch.randn(4, 32, device=brick)
    _train_step(model, x)  # warm: the first call's one-off work is in neither report

    kernels = _profile("kernels", lambda: _train_step(model, x))
    dispatcher = _profile("dispatcher", lambda: _train_step(model, x))

    kernel_ops = {b.name: b for b in kernels.bricks if b.kind == "op"}
    dispatched_ops = {b.name: b for b in dispatcher.bricks if b.kind == "op"}
    assert "aten::addmm" in kernel_ops and "aten::relu" in kernel_ops, sorted(kernel_ops)
    # Composites and views run no kernel of their own: only their kernels are bricks.
    assert not {"aten::linear", "aten::t", "aten::view", "aten::expand"} & set(kernel_ops)
    assert "aten::linear" in dispatched_ops
    # Every kernel is an op the dispatcher also saw at brick level, called as often.
    brick_level = _brick_level_counts(dispatcher, set(kernel_ops))
    for name, brick_op in kernel_ops.items():
        assert name in dispatched_ops, f"{name}: a kernel the dispatcher did not record"
        assert brick_op.count == brick_level[name], name
        assert brick_op.total_ns > 0, name
    # Ranges and autograd nodes are bricks in both, and kernels nest inside them.
    ranges = {b.name for b in kernels.bricks if b.kind == "range"}
    assert {"Block1", "Block2"} <= ranges
    assert ranges == {b.name for b in dispatcher.bricks if b.kind == "range"}
    paths = {b.path for b in kernels.paths}
    assert "Block1/aten::addmm" in paths and "Block2/aten::relu" in paths, sorted(paths)
    assert "Backward/AddmmBackward0/aten::mm" in paths, sorted(paths)
    # The backward's kernels (on the autograd engine's thread), its gradient sums between nodes
    # included, are inside the range open around backward(), as at the dispatcher.
    outside = {p for p in paths if p.split("/")[0] not in ("Block1", "Block2", "Backward")}
    assert outside == {"aten::sum"}, sorted(outside)  # the loss
    assert kernels.metadata.get("ops") == "kernels" and "ops" not in dispatcher.metadata
    assert kernels.health["unbalanced_exits"] == 0 and kernels.health["timing_failures"] == 0


@pytest.mark.timing
def test_a_kernel_of_known_duration_is_timed_at_the_kernel(brick):
    spin = spin_cpu_op()  # a CPU kernel: on brick it runs through brick's fallback kernel
    x = torch.ones(4, device=brick)
    spin(x, 10)
    calls, us = 5, 2000
    with bp.profile(ops="kernels") as p:
        start = time.perf_counter_ns()
        for _ in range(calls):
            spin(x, us)
        wall = time.perf_counter_ns() - start
    figures = by_name(p.report.bricks)["brick_test_cpu::spin"]
    assert figures.count == calls
    # Each call busy-waits `us` at least; together they fit in the loop's wall time.
    assert figures.min_ns >= us * 1000, figures
    assert figures.total_ns <= wall, (figures, wall)


def test_the_setting_is_checked_and_lasts_one_profile(brick):
    with pytest.raises(ValueError, match=r"ops must be 'dispatcher' or 'kernels', got str \('kernel'\)"):
        bp.profile(ops="kernel")
    with pytest.raises(ValueError, match=r"ops='kernels' records no input shapes.*record_shapes"):
        bp.profile(ops="kernels", record_shapes=True)
    with pytest.raises(ValueError, match=r"drop roofline=True"):
        bp.profile(ops="kernels", roofline=True)
    with pytest.raises(ValueError, match=r"not 'both'"):
        _C._profiler.set_op_timing("both")
    linear = torch.nn.Linear(8, 4).to(brick)
    x = torch.ones(2, 8, device=brick)
    with bp.profile(ops="kernels") as p:
        linear(x)
    assert _C._profiler.op_timing() == "dispatcher"  # restored on exit
    assert "aten::linear" not in by_name(p.report.bricks)
    with bp.profile() as p:
        linear(x)
    assert by_name(p.report.bricks)["aten::linear"].count == 1
    # The setting cannot change under a running profile, nor combine with recorded shapes.
    with bp.profile():
        with pytest.raises(RuntimeError, match="cannot change while profiling"):
            _C._profiler.set_op_timing("kernels")
    _C._profiler.set_op_timing("kernels")
    try:
        with pytest.raises(RuntimeError, match="record_shapes needs ops timed at the dispatcher"):
            _C._profiler.set_record_shapes(True)
    finally:
        _C._profiler.set_op_timing("dispatcher")


def test_the_profile_command_times_a_scripts_kernels(tmp_path):
    script = tmp_path / "work.py"
    script.write_text("import torch\nx = torch.randn(16, 16, device='brick')\n"
                      "for _ in range(3):\n    with torch.profiler.record_function('Step'):\n"
                      "        x = torch.tanh(x @ x)\n")
    command = ["profile", "--no-trace", "--ops"]
    out = run_cli(*command, "kernels", "-o", str(tmp_path), str(script))
    assert out.returncode == 0, out.stderr
    report = json.loads((tmp_path / "report.json").read_text())
    paths = {b["path"]: b["count"] for b in report["paths"]}
    assert paths["Step/aten::mm"] == 3 and paths["Step/aten::tanh"] == 3, paths
    assert not any(path.endswith("aten::matmul") for path in paths), paths
    assert report["metadata"]["ops"] == "kernels"
    out = run_cli(*command, "kernels", "--record-shapes", str(script))
    assert out.returncode == 2 and "--ops kernels records no input shapes" in out.stderr


def test_transformers_generate_is_unchanged_and_its_kernels_are_in_its_modules(brick):
    """A real client: Qwen2's greedy generate under profile(ops="kernels", modules=True) gives
    the unprofiled tokens, and its matmuls are bricks inside the module bricks that ran them."""
    transformers = pytest.importorskip("transformers")
    config = transformers.Qwen2Config(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attn_implementation="sdpa")
    torch.manual_seed(0)
    model = transformers.Qwen2ForCausalLM(config).to(brick).eval()
    ids = torch.randint(3, 128, (1, 6), device=brick)

    def generate():
        with torch.no_grad():
            return model.generate(ids, max_new_tokens=5, min_new_tokens=5, do_sample=False,
                                  pad_token_id=0)

    expected = generate()
    with bp.profile(ops="kernels", modules=True) as p:
        tokens = generate()
    assert torch.equal(tokens.cpu(), expected.cpu())
    paths = {b.path: b for b in p.report.paths}
    # 5 forwards (the prompt, then one per new token but the last), each projection a kernel.
    q_proj = [b for path, b in paths.items()
              if path.endswith("self_attn.q_proj/aten::mm") or
              path.endswith("self_attn.q_proj/aten::addmm")]
    assert sum(b.count for b in q_proj) == 5 * config.num_hidden_layers, sorted(paths)
    assert not any(b.name in ("aten::linear", "aten::view") for b in p.report.bricks)
    assert p.report.health["unbalanced_exits"] == 0 and p.report.health["timing_failures"] == 0


def test_the_demo_takes_the_setting_and_refuses_what_it_cannot_compare(tmp_path):
    from torch_brickdev.tools import demo

    with pytest.raises(ValueError, match=r"ops must be 'dispatcher' or 'kernels', got int \(1\)"):
        demo.run_demo(ops=1, out_dir=tmp_path / "never")
    with pytest.raises(ValueError, match=r"legacy=True compares the registry's ops"):
        demo.run_demo(ops="kernels", legacy=True, out_dir=tmp_path / "never")
    assert not (tmp_path / "never").exists()  # refused before any work
    out = run_cli("demo", "--ops", "kernels", "--legacy")
    assert out.returncode == 2 and "drop --ops kernels" in out.stderr
