"""What brick runs on the backing device is the brick op's device work, never another call of it.

Brick's convolution, attention and RNN-cell kernels compute with ATen ops on the backing device;
through full dispatch those ops recorded again under the brick op, with the same names: a brick
Conv2d forward and backward ten times showed ``aten::convolution`` 20 times, and on resnet18 the
registry put ``aten::convolution_backward`` at 101 % of wall. Now every op the user called is
counted once, in brick's registry, the legacy profiler and torch.profiler, and nothing the
backing device ran appears as an op of its own.
"""

import collections

import pytest
import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile

import torch_brickdev  # noqa: F401
import torch_brickdev.profiler as bp

CALLS = 10


def _conv_work(device):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 8, 3).to(device)
    x = torch.randn(2, 3, 16, 16, device=device, requires_grad=True)

    def work():
        for _ in range(CALLS):
            conv(x).sum().backward()
    return work


def _sdpa_work(device):
    q = torch.randn(2, 4, 8, 16, device=device, requires_grad=True)

    def work():
        for _ in range(CALLS):
            F.scaled_dot_product_attention(q, q, q).sum().backward()
    return work


def _lstm_cell_work(device):
    # The fused cell op itself: nn.LSTMCell reaches it on CUDA backing; on the host runtime the
    # cell runs as the CPU runs it (backing_graph.cpp), without it.
    torch.manual_seed(0)
    gates = [torch.randn(2, 32, device=device, requires_grad=True) for _ in range(2)]
    cx = torch.randn(2, 8, device=device, requires_grad=True)

    def work():
        for _ in range(CALLS):
            hy, cy, _ = torch.ops.aten._thnn_fused_lstm_cell(gates[0], gates[1], cx)
            (hy.sum() + cy.sum()).backward()
    return work


def _kineto_counts(work, activities=(ProfilerActivity.CPU, ProfilerActivity.PrivateUse1)):
    with profile(activities=list(activities)) as prof:
        work()
    return collections.Counter({e.key: e.count for e in prof.key_averages()}), prof


def _legacy_counts(work):
    with torch.autograd.profiler.profile(use_device="brick") as prof:
        work()
    return collections.Counter({e.key: e.count for e in prof.key_averages()})


def _registry(work):
    with bp.profile() as session:
        work()
    return session.report


@pytest.mark.parametrize("counts_of", [_kineto_counts, _legacy_counts], ids=["kineto", "legacy"])
def test_convolution_ops_count_once_per_call(counts_of):
    counts = counts_of(_conv_work("brick"))
    counts = counts[0] if isinstance(counts, tuple) else counts
    for name in ("aten::conv2d", "aten::convolution", "aten::_convolution",
                 "aten::convolution_backward"):
        assert counts[name] == CALLS, (name, counts[name])
    # PyTorch's route to brick's kernels: the overrideable ops, or (where convolution_backward has
    # a CUDA kernel, torch 2.14 CUDA builds) brick's own kernel for convolution_backward.
    for name in ("aten::convolution_overrideable", "aten::convolution_backward_overrideable"):
        assert counts[name] in (0, CALLS), (name, counts[name])
    assert not [k for k in counts if "mkldnn" in k or "slow_conv" in k], counts


def test_registry_counts_equal_calls_and_no_brick_exceeds_wall():
    report = _registry(_conv_work("brick"))
    by_name = {b.name: b for b in report.bricks}
    for name in ("aten::convolution", "aten::_convolution", "aten::convolution_backward"):
        assert by_name[name].count == CALLS, (name, by_name[name].count)
    assert not [n for n in by_name if "mkldnn" in n], sorted(by_name)
    over = [(b.name, b.total_ns) for b in report.bricks
            if b.kind == "op" and b.total_ns > report.wall_ns]
    assert not over, f"bricks above the wall time ({report.wall_ns} ns): {over}"


def _nested_counts(prof, kernels):
    """What was recorded inside the ops named ``kernels``, by name."""
    nested = collections.Counter()
    for event in prof.events():
        parent = event.cpu_parent
        while parent is not None:
            if parent.name in kernels:
                nested[event.name] += 1
                break
            parent = parent.cpu_parent
    return nested


def test_nothing_is_recorded_inside_brick_lstm_cells():
    # Brick's own kernels (the fused cells: only CUDA has them) compute with ATen ops.
    kernels = {"aten::_thnn_fused_lstm_cell", "aten::_thnn_fused_lstm_cell_backward_impl"}
    counts, prof = _kineto_counts(_lstm_cell_work("brick"), [ProfilerActivity.CPU])
    assert counts["aten::_thnn_fused_lstm_cell"] == CALLS
    nested = _nested_counts(prof, kernels)
    assert not nested, f"ops recorded inside brick's LSTM cell: {dict(nested)}"


def test_attention_records_inside_what_the_cpu_records():
    # The backing kernel's own internals (allocations, transposes) are recorded as on the CPU,
    # once; nothing more.
    kernels = {"aten::_scaled_dot_product_flash_attention_for_cpu",
               "aten::_scaled_dot_product_flash_attention_for_cpu_backward"}
    nested = {}
    for device in ("cpu", "brick"):
        counts, prof = _kineto_counts(_sdpa_work(device), [ProfilerActivity.CPU])
        assert counts["aten::scaled_dot_product_attention"] == CALLS
        nested[device] = _nested_counts(prof, kernels)
    assert nested["brick"] == nested["cpu"]


def test_a_copy_records_one_copy():
    x = torch.randn(64)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        y = x.to("brick")
        y.mul_(y)
        y.cpu()
    counts = collections.Counter(e.name for e in prof.events())
    assert counts["aten::copy_"] == 2, counts  # the two transfers, not a copy inside each


class _BasicBlock(torch.nn.Module):
    """torchvision's ResNet BasicBlock (conv-bn-relu-conv-bn, plus a downsampling shortcut)."""

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(planes)
        self.relu = torch.nn.ReLU(inplace=True)
        self.conv2 = torch.nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(planes)
        self.downsample = None
        if stride != 1 or inplanes != planes:
            self.downsample = torch.nn.Sequential(
                torch.nn.Conv2d(inplanes, planes, 1, stride, bias=False),
                torch.nn.BatchNorm2d(planes))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        out = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(out)) + identity)


def _resnet():
    """A small ResNet (torchvision's layout, two stages) for a training step."""
    return torch.nn.Sequential(
        torch.nn.Conv2d(3, 16, 7, 2, 3, bias=False), torch.nn.BatchNorm2d(16),
        torch.nn.ReLU(inplace=True), torch.nn.MaxPool2d(3, 2, 1),
        _BasicBlock(16, 16), _BasicBlock(16, 32, stride=2),
        torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(32, 10))


def test_resnet_step_counts_match_the_cpu():
    counts = {}
    for device in ("cpu", "brick"):
        torch.manual_seed(0)
        model = _resnet().to(device)
        x = torch.randn(2, 3, 64, 64, device=device)

        def step():
            model(x).sum().backward()
        counts[device], _ = _kineto_counts(step, [ProfilerActivity.CPU])
    for name in ("aten::conv2d", "aten::convolution", "aten::_convolution",
                 "aten::convolution_backward", "aten::batch_norm", "aten::relu_"):
        assert counts["brick"][name] == counts["cpu"][name] > 0, (
            name, counts["brick"][name], counts["cpu"][name])
    report = _registry(lambda: [_resnet().to("brick")(torch.randn(2, 3, 64, 64, device="brick"))
                                .sum().backward()])
    over = [(b.name, b.total_ns) for b in report.bricks
            if b.kind == "op" and b.total_ns > report.wall_ns]
    assert not over, f"bricks above the wall time ({report.wall_ns} ns): {over}"
