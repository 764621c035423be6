"""torchvision's own models on brick, as a user runs them: ``model.to("brick")``.

torchvision's wheels are built for one torch release each, against CUDA: the test command
installs the matching one in the torch 2.14 lane (scripts/run.sh); elsewhere these tests skip.
On the host runtime a training step is bit-equal to the CPU's at the same thread count (brick runs
the CPU's kernels on the CPU's memory), and ``torch.compile`` of the model on brick equals the
compiled model on the CPU.
"""

import pytest
import torch

import torch_brickdev

torchvision = pytest.importorskip("torchvision", reason="torchvision is installed in the 2.14 "
                                                        "lane only (its wheels pin a torch)")
pytestmark = [pytest.mark.skipif(torch_brickdev.backing_device_type() != "cpu",
                                 reason="bit-equality with the CPU holds on the host runtime"),
              pytest.mark.usefixtures("one_thread")]


def _resnet18(device, memory_format=torch.contiguous_format):
    torch.manual_seed(0)
    model = torchvision.models.resnet18(weights=None, num_classes=10)
    return model.to(device=device, memory_format=memory_format)


def _training_step(device, memory_format):
    model = _resnet18(device, memory_format)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    torch.manual_seed(1)
    images = torch.randn(4, 3, 64, 64).to(device=device, memory_format=memory_format)
    labels = torch.randint(0, 10, (4,)).to(device)
    losses = []
    for _ in range(2):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses, dict(model.state_dict())


@pytest.mark.parametrize("memory_format", [torch.contiguous_format, torch.channels_last],
                         ids=["contiguous", "channels_last"])
def test_resnet18_trains_bit_equal_to_the_cpu(memory_format):
    cpu_losses, cpu_state = _training_step("cpu", memory_format)
    brick_losses, brick_state = _training_step("brick", memory_format)
    for step, (got, want) in enumerate(zip(brick_losses, cpu_losses)):
        assert got.device.type == "brick"
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=f"loss of step {step}")
    for name, want in cpu_state.items():  # parameters and batch-norm statistics
        got = brick_state[name]
        assert got.device.type == "brick", name
        torch.testing.assert_close(got.cpu(), want, rtol=0, atol=0, msg=name)


def test_compiled_resnet18_on_brick_equals_the_compiled_cpu_model():
    torch._dynamo.reset()
    images = torch.randn(2, 3, 64, 64)
    results = {}
    for device in ("cpu", "brick"):
        model = _resnet18(device).eval()
        compiled = torch.compile(model)
        with torch.no_grad():
            eager = model(images.to(device))
            results[device] = (compiled(images.to(device)), eager)
    (brick_compiled, brick_eager), (cpu_compiled, cpu_eager) = results["brick"], results["cpu"]
    assert brick_compiled.device.type == "brick"
    torch.testing.assert_close(brick_eager.cpu(), cpu_eager, rtol=0, atol=0)
    torch.testing.assert_close(brick_compiled.cpu(), cpu_compiled, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(brick_compiled.cpu(), cpu_eager, rtol=1e-4, atol=1e-4)


def test_resnet18_module_bricks_find_the_slowest_layer():
    """profile(modules=True) on an unedited resnet18 training step: every layer a brick under its
    qualified name, ReLU(inplace=True) after each convolution untouched, and the module tree's
    self times adding up to the model's time."""
    from torch_brickdev import profiler as bp

    model = _resnet18("brick")
    images = torch.randn(4, 3, 64, 64, device="brick")
    model(images)
    with bp.profile(modules=True) as p:
        loss = model(images).sum()
        loss.backward()
    rows = {r["name"]: r for r in p.report.module_times()}
    for name in ("ResNet", "conv1", "layer1.0.conv2", "layer4.1.bn2", "layer2.0.downsample.0",
                 "fc", "avgpool"):
        assert rows[name]["calls"] == 1, name
    assert rows["layer1.0.relu"]["calls"] == 2  # BasicBlock calls its one ReLU twice
    root = p.report.brick("ResNet")
    assert sum(r["self_ns"] for r in rows.values()) == root.total_ns
    first = p.report.table(by="module").splitlines()[3].split()[0]
    assert first == max(rows.values(), key=lambda r: r["self_ns"])["name"]


def test_resnet18_shapes_and_roofline(tmp_path, monkeypatch):
    """profile(roofline=True) on an unedited resnet18 forward and backward: the rows per op and
    input shapes add up to each op's calls, and each convolution's FLOPs are torch's
    flop_counter's for the same model (FlopCounterMode on the CPU)."""
    from torch.utils.flop_counter import FlopCounterMode

    from torch_brickdev import profiler as bp

    monkeypatch.setenv("BRICK_ROOFLINE_CACHE", str(tmp_path / "roofline.json"))
    model = _resnet18("brick")
    images = torch.randn(4, 3, 64, 64, device="brick")
    model(images)
    with torch.no_grad(), bp.profile(roofline=True, modules=True) as p:
        model(images)
    calls = {}
    for row in p.report.shape_stats():
        calls[row.name] = calls.get(row.name, 0) + row.calls
    for brick in p.report.bricks:
        if brick.kind == "op":
            assert calls[brick.name] == brick.count, brick.name
    with torch.no_grad(), FlopCounterMode(display=False) as counter:
        _resnet18("cpu")(images.cpu())
    rows = {r.path: r for r in p.report.roofline(by="name")}
    assert rows["ResNet"].flops == counter.get_total_flops()
    assert rows["aten::conv2d"].bound in ("compute", "memory")
    assert 0 < rows["ResNet"].flops_fraction <= 1.05
