"""Module bricks: ``profile(modules=True)`` makes every nn.Module call a brick named by its
qualified path, nested as the modules nest, on models nobody edited: a CNN (repeated, shared and
in-place modules, the model's own hooks, a replaced forward, a forward that raises, a compiled
submodule) and transformers' Qwen2, whose module tree adds up to the step."""

from __future__ import annotations

import time

import pytest
import torch
from torch import nn

import torch_brickdev  # noqa: F401
from torch_brickdev import profiler as bp

from profiler_helpers import load_benchmark

pytestmark = pytest.mark.timing


class Block(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.conv = nn.Conv2d(channels, channels, 3, padding=1)
        self.act = nn.ReLU(inplace=True)  # modifies the conv's output in place

    def forward(self, x):
        return x + self.act(self.conv(x))


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.stem = nn.Conv2d(3, 8, 3, padding=1)
        self.layers = nn.ModuleList([Block(8), Block(8)])
        self.shared = self.layers[0]  # the same block under a second name
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(8, 10))

    def forward(self, x):
        x = self.stem(x)
        for layer in self.layers:
            x = layer(x)
        x = self.shared(x)  # layers.0 runs twice per forward
        return self.head(x)


@pytest.fixture
def net():
    torch.manual_seed(0)
    return Net().to("brick"), torch.randn(2, 3, 16, 16, device="brick")


def _counts(report):
    return {r["name"]: r["calls"] for r in report.module_times()}


def test_every_module_call_is_a_brick_named_by_its_path(net, one_thread):
    model, x = net
    with bp.profile(modules=True) as p:
        for _ in range(3):
            model(x)
    counts = _counts(p.report)
    assert counts == {"Net": 3, "stem": 3, "layers.0": 6, "layers.0.conv": 6, "layers.0.act": 6,
                      "layers.1": 3, "layers.1.conv": 3, "layers.1.act": 3, "head": 3,
                      "head.0": 3, "head.1": 3, "head.2": 3}
    paths = {b.path for b in p.report.paths}
    assert "Net/layers.0/layers.0.conv/aten::conv2d" in paths  # nested as the modules nest
    assert p.report.metadata["modules"][0] == "Net"
    # Self times add up to the outermost module's total: nothing counted twice.
    rows = p.report.module_times()
    root = p.report.brick("Net")
    assert sum(r["self_ns"] for r in rows) == root.total_ns
    assert all(0 <= r["self_ns"] <= r["total_ns"] for r in rows)
    assert rows == sorted(rows, key=lambda r: -r["self_ns"])
    table = p.report.table(by="module").splitlines()
    assert table[1].split() == ["Module", "Calls", "Self", "ms", "Total", "ms", "Self",
                                "us/call", "%", "span"]  # of the bricks' span
    assert table[3].split()[0] == rows[0]["name"]  # the slowest module first
    assert p.report.health.get("unbalanced_exits", 0) == 0


def test_results_and_gradients_are_those_without_module_bricks(net, one_thread):
    model, x = net
    expected = model(x)
    expected.sum().backward()
    grads = [q.grad.clone() for q in model.parameters()]
    model.zero_grad()
    with bp.profile(modules=True):
        out = model(x)
        out.sum().backward()
    assert torch.equal(out, expected)
    assert all(torch.equal(q.grad, g) for q, g in zip(model.parameters(), grads))


def test_off_by_default_and_nothing_left_installed(net, one_thread):
    model, x = net
    hooks = torch.nn.modules.module
    before = (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks))
    with bp.profile() as p:
        model(x)
    assert "modules" not in p.report.metadata and "Net" not in p.report
    with bp.profile(modules=True):
        assert len(hooks._global_forward_hooks) == before[1] + 1
    assert (len(hooks._global_forward_pre_hooks), len(hooks._global_forward_hooks)) == before
    with pytest.raises(ValueError, match="no module bricks; profile with modules=True"):
        p.report.table(by="module")
    with pytest.raises(TypeError, match=r"modules must be a bool \(True or False\), got str"):
        bp.profile(modules="yes")


def test_the_models_own_hooks_and_a_replaced_forward_still_work(net, one_thread):
    model, x = net
    seen = []
    handle = model.stem.register_forward_hook(lambda m, i, o: seen.append(o.shape) or o * 1)
    original = model.head.forward
    model.head.forward = lambda t: original(t) + 0  # a patched forward, as some libraries do
    try:
        with bp.profile(modules=True) as p:
            model(x)
    finally:
        handle.remove()
        del model.head.forward
    assert seen == [torch.Size([2, 8, 16, 16])]
    assert _counts(p.report)["head"] == 1 and _counts(p.report)["stem"] == 1


def test_a_forward_that_raises_closes_its_bricks(net, one_thread):
    model, x = net
    with bp.profile(modules=True) as p:
        with pytest.raises(RuntimeError):
            model(torch.randn(2, 5, 16, 16, device="brick"))  # 5 channels: the stem refuses
        model(x)
    assert _counts(p.report)["Net"] == 2 and _counts(p.report)["stem"] == 2
    assert p.report.health.get("unbalanced_exits", 0) == 0
    assert "Net/stem/Net" not in {b.path for b in p.report.paths}  # the failed call ended


def test_the_legacy_profiler_sees_the_module_bricks(net, one_thread):
    model, x = net
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        with bp.profile(modules=True):
            model(x)
    keys = {e.key for e in prof.key_averages()}
    assert {"Net", "layers.0.conv", "head.2"} <= keys


@pytest.mark.timeout(240)
def test_a_compiled_submodule_is_one_brick(net, one_thread):
    model, x = net
    expected = model(x)
    model.layers[1] = torch.compile(model.layers[1])
    model(x)  # compiles
    with bp.profile(modules=True) as p:
        out = model(x)
    torch.testing.assert_close(out, expected)
    counts = _counts(p.report)
    assert counts["layers.1"] == 1  # the compiled module's call
    assert "layers.1._orig_mod.conv" not in counts and "layers.1.conv" not in counts
    assert counts["layers.0.conv"] == 2  # eager modules around it keep theirs


@pytest.mark.timeout(240)
def test_qwen2_module_tree_adds_up_to_the_forward(one_thread):
    pytest.importorskip("transformers")
    model, ids = load_benchmark("bench_profile_options").qwen2()  # Qwen2, tiny config, on brick
    with torch.no_grad():
        model(ids)
        calls_ns = []
        with bp.profile(modules=True) as p:
            for _ in range(4):
                start = time.perf_counter_ns()
                model(ids)
                calls_ns.append(time.perf_counter_ns() - start)
    counts = _counts(p.report)
    for name in ("Qwen2ForCausalLM", "model", "model.layers.0", "model.layers.0.self_attn",
                 "model.layers.1.self_attn.q_proj", "model.layers.1.mlp.down_proj", "lm_head",
                 "model.norm"):
        assert counts[name] == 4, (name, sorted(counts))
    rows = p.report.module_times()
    root = p.report.brick("Qwen2ForCausalLM")
    assert sum(r["self_ns"] for r in rows) == root.total_ns
    # The root module's total is its calls' time, less nn.Module's call machinery around its
    # forward (measured beside it, so that a preemption counts on both sides or on neither; the
    # registry reads the TSC, calibrated against perf_counter's clock: 0.1 % for its rate).
    assert 0.95 * sum(calls_ns) <= root.total_ns <= 1.001 * sum(calls_ns), \
        (root.total_ns, calls_ns)
    assert root.total_ns <= p.report.wall_ns


def test_a_ddp_wrapped_model_is_named_as_named_modules_names_it(net, tmp_path, one_thread):
    import torch.distributed as dist

    model, x = net
    dist.init_process_group("brick", init_method=f"file://{tmp_path / 'store'}", rank=0,
                            world_size=1)
    try:
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        with bp.profile(modules=True) as p:
            ddp(x).sum().backward()
    finally:
        dist.destroy_process_group()
    counts = _counts(p.report)
    assert counts["DistributedDataParallel"] == 1
    assert counts["module"] == 1 and counts["module.layers.0.conv"] == 2
    assert {n for n, _ in ddp.named_modules() if n} >= set(counts) - {"DistributedDataParallel"}

