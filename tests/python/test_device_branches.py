"""Brick takes its backing device's path where PyTorch branches on the device type.

PyTorch's autograd formulas and composite ops sometimes test the device type (``is_cpu()``),
and a PrivateUse1 device then takes another path than the CPU: results differ in the last bits,
silently, and the differences grow with every optimiser step. Brick runs on the CPU's memory with
the CPU's kernels, so on the host runtime every result here must be bit-equal to the CPU's at the
same thread count. (The module sweep, test_module_db.py, proves it for every module; these are
the cases users met, small enough to read.)
"""

import json
import textwrap

import pytest
import torch
import torch.nn.functional as F

import torch_brickdev
from helpers import run_python

pytestmark = [pytest.mark.skipif(torch_brickdev.backing_device_type() != "cpu",
                                 reason="bit-equality with the CPU holds on the host runtime"),
              pytest.mark.usefixtures("one_thread")]


def _leaves(tensors, device):
    return [t.detach().to(device).clone(memory_format=torch.preserve_format).requires_grad_()
            for t in tensors]


def _assert_bit_equal(actual, expected, what):
    assert actual.device.type == "brick", f"{what}: on {actual.device}"
    assert actual.stride() == expected.stride(), \
        f"{what}: strides {actual.stride()}, CPU {expected.stride()}"
    torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0,
                               msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("shape, memory_format", [
    ((2, 64, 16, 16), torch.channels_last),
    ((2, 32, 4, 6, 6), torch.channels_last_3d),
    ((2, 64, 16, 16), torch.contiguous_format),
])
def test_group_norm_backward_takes_the_cpu_layout(shape, memory_format):
    # PyTorch's formula hands non-CPU devices a contiguous input; the CPU keeps channels-last
    # (seen: dweight off by 2.3e-5 on a diffusers UNet). Brick restores the CPU's layout.
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(shape, generator=generator).contiguous(memory_format=memory_format)
    weight, bias = torch.randn(shape[1], generator=generator), torch.randn(shape[1],
                                                                          generator=generator)
    grad = torch.randn(shape, generator=generator).contiguous(memory_format=memory_format)
    results = {}
    for device in ("cpu", "brick"):
        leaves = _leaves((x, weight, bias), device)
        out = F.group_norm(leaves[0], 8, leaves[1], leaves[2])
        out.backward(grad.to(device))
        results[device] = [out] + [leaf.grad for leaf in leaves]
    for name, actual, expected in zip(("out", "dx", "dweight", "dbias"), results["brick"],
                                      results["cpu"]):
        _assert_bit_equal(actual, expected, name)


def test_group_norm_double_backward_matches_the_cpu():
    # With create_graph the formula takes its differentiable path on every device.
    generator = torch.Generator().manual_seed(1)
    x = torch.randn(2, 16, 5, 5, generator=generator).contiguous(memory_format=torch.channels_last)
    weight = torch.randn(16, generator=generator)
    results = {}
    for device in ("cpu", "brick"):
        xx, ww = _leaves((x, weight), device)
        (dx,) = torch.autograd.grad(F.group_norm(xx, 4, ww).square().sum(), xx, create_graph=True)
        dx.sum().backward()
        results[device] = (dx, xx.grad, ww.grad)
    for name, actual, expected in zip(("dx", "d2x", "dweight"), results["brick"], results["cpu"]):
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0,
                                   msg=lambda m, name=name: f"{name}: {m}")


def _group_norm_case(seed, memory_format=torch.channels_last):
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 32, 6, 6, generator=generator).contiguous(memory_format=memory_format)
    return x, torch.randn(32, generator=generator), torch.randn(32, generator=generator)


@pytest.mark.skipif(not torch.__version__.startswith("2.13."),
                    reason="brick's own group-norm node holds torch 2.13's formula; other releases "
                           "take PyTorch's node, with its copies")
def test_channels_last_group_norm_backward_runs_the_cpus_ops():
    # The CPU's backward hands its kernel the channels-last tensors as they are; brick's node does
    # the same (PyTorch's formula would copy both to contiguous for a non-CPU device, and brick
    # would copy them back). The profiles hold the same ops, no copies.
    x, weight, bias = _group_norm_case(6)
    counts = {}
    for device in ("cpu", "brick"):
        leaves = _leaves((x, weight, bias), device)
        grad = x.to(device)
        with torch.autograd.profiler.profile() as prof:
            F.group_norm(leaves[0], 8, leaves[1], leaves[2]).backward(grad)
        names = [event.name for event in prof.function_events if event.name.startswith("aten::")]
        counts[device] = {name: names.count(name) for name in names}
    assert counts["brick"] == counts["cpu"]
    assert "aten::clone" not in counts["brick"]


def test_group_norm_mean_and_rstd_gradients_match_the_cpu():
    # Gradients through native_group_norm's mean and rstd take the formula's differentiable path.
    x, weight, bias = _group_norm_case(7)
    results = {}
    for device in ("cpu", "brick"):
        leaves = _leaves((x, weight, bias), device)
        out, mean, rstd = torch.native_group_norm(*leaves, 2, 32, 36, 8, 1e-5)
        (out.square().sum() + mean.sum() * 3 + rstd.sum()).backward()
        results[device] = [leaf.grad for leaf in leaves]
    for name, actual, expected in zip(("dx", "dweight", "dbias"), results["brick"],
                                      results["cpu"]):
        _assert_bit_equal(actual, expected, name)


def test_group_norm_input_changed_in_place_is_refused_as_on_the_cpu():
    x, weight, bias = _group_norm_case(8)
    for device in ("cpu", "brick"):
        leaves = _leaves((x, weight, bias), device)
        source = leaves[0] * 1  # a non-leaf, so it can change in place
        out = F.group_norm(source, 8, leaves[1], leaves[2])
        source.add_(1)
        with pytest.raises(RuntimeError, match="modified by an inplace operation"):
            out.sum().backward()


def test_group_norm_retain_graph_matches_the_cpu():
    x, weight, bias = _group_norm_case(9)
    results = {}
    for device in ("cpu", "brick"):
        leaves = _leaves((x, weight, bias), device)
        out = F.group_norm(leaves[0], 8, leaves[1], leaves[2])
        out.sum().backward(retain_graph=True)
        out.square().sum().backward()
        results[device] = [leaf.grad for leaf in leaves]
    for name, actual, expected in zip(("dx", "dweight", "dbias"), results["brick"],
                                      results["cpu"]):
        _assert_bit_equal(actual, expected, name)


@pytest.mark.parametrize("memory_format", [torch.channels_last, torch.contiguous_format])
def test_group_norm_forward_ad_is_the_cpus(memory_format):
    # Forward AD takes PyTorch's own autograd kernel on brick too: the same tangent, or the same
    # error (torch 2.13's formula cannot view a channels-last input).
    import torch.autograd.forward_ad as forward_ad
    x, weight, _ = _group_norm_case(10, memory_format)
    tangent = torch.randn(x.shape, generator=torch.Generator().manual_seed(11))
    tangent = tangent.contiguous(memory_format=memory_format)
    outcomes = {}
    for device in ("cpu", "brick"):
        try:
            with forward_ad.dual_level():
                dual = forward_ad.make_dual(x.to(device), tangent.to(device))
                out = F.group_norm(dual, 8, weight.to(device).requires_grad_())
                outcomes[device] = forward_ad.unpack_dual(out).tangent.cpu()
        except RuntimeError as error:
            outcomes[device] = str(error)
    if isinstance(outcomes["cpu"], str):
        assert outcomes["brick"] == outcomes["cpu"]
    else:
        torch.testing.assert_close(outcomes["brick"], outcomes["cpu"], rtol=0, atol=0)


@pytest.mark.parametrize("activation", [F.silu, F.mish])
def test_activation_backward_runs_the_cpu_kernel(activation):
    # silu_backward and mish_backward have a CPU kernel and a math formula for other devices.
    x = torch.randn(4, 1000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    grads = {}
    for device in ("cpu", "brick"):
        (xx,) = _leaves((x,), device)
        activation(xx).backward(torch.ones_like(xx))
        grads[device] = xx.grad
    _assert_bit_equal(grads["brick"], grads["cpu"], f"{activation.__name__} grad")


def test_channels_last_unet_block_trains_bit_equal():
    # A diffusers-style ResNet block in channels-last, three AdamW steps: no drift.
    def block():
        torch.manual_seed(3)
        return torch.nn.Sequential(
            torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.GroupNorm(8, 32), torch.nn.SiLU(),
            torch.nn.Conv2d(32, 32, 3, padding=1), torch.nn.GroupNorm(8, 32), torch.nn.Mish(),
        ).to(memory_format=torch.channels_last)

    x = torch.randn(2, 32, 12, 12, generator=torch.Generator().manual_seed(4))
    x = x.contiguous(memory_format=torch.channels_last)
    params = {}
    for device in ("cpu", "brick"):
        model = block().to(device)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        for _ in range(3):
            optimizer.zero_grad()
            model(x.to(device)).square().mean().backward()
            optimizer.step()
        params[device] = dict(model.named_parameters())
    for name, expected in params["cpu"].items():
        _assert_bit_equal(params["brick"][name].detach(), expected.detach(), name)


def test_group_norm_without_input_gradient_runs():
    # The CPU's channels-last backward kernel crashes (segfault, torch 2.13) when the input needs
    # no gradient: brick keeps the contiguous kernel there (after the channels-last forward, so
    # equal to the CPU's contiguous run within rounding, not bit for bit).
    generator = torch.Generator().manual_seed(5)
    x = torch.randn(2, 32, 12, 12, generator=generator)
    weight, bias = torch.randn(32, generator=generator), torch.randn(32, generator=generator)
    grads = {}
    for device, memory_format in (("brick", torch.channels_last), ("cpu", torch.contiguous_format)):
        ww, bb = _leaves((weight, bias), device)
        out = F.group_norm(x.to(device).contiguous(memory_format=memory_format), 8, ww, bb)
        out.sum().backward()
        grads[device] = (ww.grad, bb.grad)
    for name, actual, expected in zip(("dweight", "dbias"), grads["brick"], grads["cpu"]):
        torch.testing.assert_close(actual.cpu(), expected, msg=lambda m, name=name: f"{name}: {m}")


_THREAD_COUNT_SCRIPT = """
import json, torch, torch_brickdev
cl = torch.channels_last

def weight_grad(device):
    torch.manual_seed(0)
    conv = torch.nn.Conv2d(3, 4, 3).to(memory_format=cl).to(device)
    x = torch.randn(5, 3, 6, 6).contiguous(memory_format=cl).to(device)
    conv(x).backward(torch.randn(5, 4, 4, 4).to(device))
    return conv.weight.grad.cpu()

torch.set_num_threads(1)
one_thread = weight_grad("cpu")  # the autograd engine starts its device threads here
torch.set_num_threads(2)
cpu, brick = weight_grad("cpu"), weight_grad("brick")
print(json.dumps({"cpu_vs_one_thread": (cpu - one_thread).abs().max().item(),
                  "brick_vs_cpu": (brick - cpu).abs().max().item()}), flush=True)
# At once: PyTorch's autograd device thread may still release its last graph task while the
# interpreter finalizes, which aborts ("terminate called without an active exception"), brick
# or not; the results above are what is tested.
import os
os._exit(0)
"""


def test_backward_follows_set_num_threads():
    # PyTorch's autograd engine runs brick's backward on a thread whose intra-op count is the one
    # the process had when the engine started: brick re-applies the current count per backward.
    done = run_python("-c", textwrap.dedent(_THREAD_COUNT_SCRIPT))
    assert done.returncode == 0, done.stderr[-2000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["brick_vs_cpu"] == 0.0, (
        f"brick's backward differs from the CPU's at 2 threads by {result['brick_vs_cpu']} (the "
        f"CPU's 2- and 1-thread results differ by {result['cpu_vs_one_thread']})")


RECURRENT = {
    "LSTM": lambda: torch.nn.LSTM(8, 16, num_layers=2),
    "LSTM bidirectional batch_first": lambda: torch.nn.LSTM(8, 16, bidirectional=True,
                                                            batch_first=True),
    "LSTM proj_size": lambda: torch.nn.LSTM(8, 16, proj_size=4),
    "GRU bidirectional": lambda: torch.nn.GRU(8, 16, num_layers=2, bidirectional=True),
    "RNN relu": lambda: torch.nn.RNN(8, 16, num_layers=2, nonlinearity="relu"),
    "LSTMCell": lambda: torch.nn.LSTMCell(8, 16),
    "GRUCell": lambda: torch.nn.GRUCell(8, 16),
    "RNNCell": lambda: torch.nn.RNNCell(8, 16),
}


def _run_recurrent(make, device, x, threads):
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    module = make().to(device)
    leaf = x.detach().to(device).requires_grad_()
    out = module(leaf)
    out = out[0] if isinstance(out, tuple) else out
    out.backward(torch.linspace(-1, 1, out.numel()).reshape(out.shape).to(device))
    return [out.detach(), leaf.grad] + [p.grad for p in module.parameters()]


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("name", list(RECURRENT))
def test_recurrent_layers_run_as_the_cpu_runs_them(name, threads):
    """RNN.cpp takes CPU-only paths (mkldnn's LSTM, the whole sequence's input projection in one
    matmul, unfused cells): brick runs the CPU's composite on its memory, its autograd graph
    included, so outputs, input and parameter gradients are the CPU's bit for bit (were ~1e-7
    off), at one thread and at two (mkldnn's backward reduces across threads)."""
    x = torch.randn(3, 8) if name.endswith("Cell") else torch.randn(5, 3, 8)
    cpu = _run_recurrent(RECURRENT[name], "cpu", x, threads)
    brick = _run_recurrent(RECURRENT[name], "brick", x, threads)
    for index, (got, want) in enumerate(zip(brick, cpu)):
        _assert_bit_equal(got, want, f"{name}: result {index}")


def test_packed_sequences_and_no_grad_run_as_the_cpu():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 6)
    brick_lstm = torch.nn.LSTM(4, 6).to("brick")
    brick_lstm.load_state_dict(lstm.state_dict())
    x = torch.randn(5, 3, 4)
    lengths = [5, 3, 2]
    packed = torch.nn.utils.rnn.pack_padded_sequence(x, lengths)
    brick_packed = torch.nn.utils.rnn.pack_padded_sequence(x.to("brick"), lengths)
    with torch.no_grad():
        (out, (h, c)), (bout, (bh, bc)) = lstm(packed), brick_lstm(brick_packed)
    for got, want, what in ((bout.data, out.data, "output"), (bh, h, "h"), (bc, c, "c")):
        _assert_bit_equal(got, want, f"packed LSTM {what}")
    assert not bh.requires_grad


def test_no_grad_recurrent_layers_take_the_cpus_path_for_parameters_requiring_grad():
    """Under no_grad a module's parameters still require grad, and the CPU's composites read the
    flag: matmul folds a batch-first sequence's input projection into one mm when the weight
    requires grad, else runs a bmm, whose float32 results differ in the last bits on some CPUs
    (AVX-512). Brick's CPU aliases carry the flag, so brick runs the very ops the CPU runs."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpNames(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.names = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func not in (torch.ops.aten._to_copy.default,):  # brick's copy of its input
                self.names.append(str(func))
            return func(*args, **(kwargs or {}))

    torch.manual_seed(0)
    lstm = torch.nn.LSTM(4, 4, proj_size=2, batch_first=True).eval()
    x = torch.randn(3, 2, 4)
    runs = {}
    for device in ("cpu", "brick"):
        module, inp = lstm.to(device), x.to(device)
        with torch.no_grad(), OpNames() as names:
            out, _ = module(inp)
        runs[device] = (names.names, out.cpu())
    assert runs["brick"][0] == runs["cpu"][0]
    assert "aten.bmm.default" not in runs["cpu"][0]
    torch.testing.assert_close(runs["brick"][1], runs["cpu"][1], rtol=0, atol=0)


def test_backing_graph_refuses_what_autograd_refuses():
    """An argument changed in place between forward and backward, and double backward (the CPU
    graph is differentiated once): clear errors, not wrong gradients."""
    lstm = torch.nn.LSTM(4, 6).to("brick")
    x = torch.randn(5, 3, 4, device="brick", requires_grad=True)
    h0 = torch.zeros(1, 3, 6, device="brick")
    out, _ = lstm(x, (h0, h0.clone()))
    h0.add_(1)
    with pytest.raises(RuntimeError, match="modified by an inplace operation"):
        out.sum().backward()
    out, _ = lstm(x)
    (grad,) = torch.autograd.grad(out.sum(), x, create_graph=False)
    assert grad.device.type == "brick"
    out, _ = lstm(x)
    with pytest.raises(RuntimeError, match="double backward"):
        torch.autograd.grad(out.sum(), x, create_graph=True)


def test_a_recurrent_op_is_one_brick_op_in_every_profiler():
    """The CPU's ops inside are aten::lstm's device work: no nested CPU aten::lstm or mkldnn op
    in brick's registry or in torch.profiler, and the backward is one node."""
    import torch_brickdev.profiler as bp

    lstm = torch.nn.LSTM(4, 6).to("brick")
    x = torch.randn(5, 3, 4, device="brick", requires_grad=True)
    with bp.profile(sync_mode="event"):
        out, _ = lstm(x)
        out.sum().backward()
    names = [s.path for s in bp.stats(by="path")]
    assert "aten::lstm" in names
    assert not [n for n in names if n.startswith("aten::lstm/")], names
    assert [n for n in names if "BrickBackingGraphBackward(aten::lstm)" in n], names
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        lstm(x)
    counts = {}
    for event in prof.events():
        counts[event.name] = counts.get(event.name, 0) + 1
    assert counts.get("aten::lstm") == 1, counts
    assert not [n for n in counts if "mkldnn" in n], counts


OPTIMIZERS = ["SGD", "Adam", "AdamW", "NAdam", "RAdam", "ASGD", "Adagrad", "Adadelta", "Adamax",
              "RMSprop", "Rprop"]


def _optimizer_steps(name, device, steps=5):
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    model.to(device)
    kwargs = {"lr": 0.01, "momentum": 0.9} if name == "SGD" else {}
    optimizer = getattr(torch.optim, name)(model.parameters(), **kwargs)  # default implementation
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    x = torch.randn(8, 16).to(device)
    for _ in range(steps):
        optimizer.zero_grad()
        model(x).square().mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        schedule.step()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("name", OPTIMIZERS)
def test_an_optimizer_with_default_arguments_runs_as_on_the_cpu(name):
    """The default implementation (foreach or per-parameter loop) is the CPU's on the host
    runtime: NAdam, RAdam and ASGD drifted from the CPU by 1e-10..1e-7 in five steps with brick's
    foreach default."""
    expected = _optimizer_steps(name, "cpu")
    for i, (actual, cpu) in enumerate(zip(_optimizer_steps(name, "brick"), expected)):
        _assert_bit_equal(actual, cpu, f"{name}, parameter {i}")


def test_the_optimizer_default_is_the_backing_devices():
    from torch.optim.optimizer import _default_to_fused_or_foreach

    params = [torch.zeros(2, device="brick")]
    assert _default_to_fused_or_foreach(params, differentiable=False) == (False, False)
    # foreach asked for explicitly still runs as asked, bit-equal to the CPU's foreach.
    results = {}
    for device in ("cpu", "brick"):
        torch.manual_seed(0)
        p = torch.randn(5, device=device, requires_grad=True)
        opt = torch.optim.NAdam([p], foreach=True)
        for _ in range(3):
            opt.zero_grad()
            p.square().sum().backward()
            opt.step()
        results[device] = p.detach()
    _assert_bit_equal(results["brick"], results["cpu"], "NAdam(foreach=True)")
