"""Autograd, optimizers and nn modules on brick match the same computation on the CPU."""

import copy
import os

import pytest
import torch
import torch.nn as nn


class SmallNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 4, 3, padding=1, bias=False)  # BatchNorm follows
        self.norm = nn.BatchNorm2d(4)
        self.fc1 = nn.Linear(4 * 8 * 8, 32)
        self.ln = nn.LayerNorm(32)
        self.fc2 = nn.Linear(32, 10)

    def forward(self, x):
        x = torch.relu(self.norm(self.conv(x)))
        x = torch.nn.functional.max_pool2d(x, 2)
        x = torch.nn.functional.gelu(self.ln(self.fc1(x.flatten(1))))
        return self.fc2(x)


def train_steps(model, optimizer, data, targets, steps):
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(data), targets)
        loss.backward()
        optimizer.step()
        losses.append(loss.detach())
    return losses


def test_training_steps_match_cpu():
    torch.manual_seed(0)
    cpu_model = SmallNet()
    brick_model = copy.deepcopy(cpu_model).to("brick")
    data = torch.randn(8, 1, 16, 16)
    targets = torch.randint(0, 10, (8,))
    cpu_losses = train_steps(
        cpu_model, torch.optim.AdamW(cpu_model.parameters(), lr=1e-2), data, targets, 3
    )
    brick_losses = train_steps(
        brick_model,
        torch.optim.AdamW(brick_model.parameters(), lr=1e-2),
        data.to("brick"),
        targets.to("brick"),
        3,
    )
    for expected, actual in zip(cpu_losses, brick_losses):
        assert actual.device.type == "brick"
        torch.testing.assert_close(actual.cpu(), expected, rtol=1e-4, atol=1e-5)
    for (name, p_cpu), p_brick in zip(cpu_model.named_parameters(), brick_model.parameters()):
        assert p_brick.device.type == "brick", name
        torch.testing.assert_close(p_brick.detach().cpu(), p_cpu.detach(), rtol=1e-4, atol=1e-5)
    for b_cpu, b_brick in zip(cpu_model.buffers(), brick_model.buffers()):
        torch.testing.assert_close(b_brick.cpu(), b_cpu, rtol=1e-4, atol=1e-5)


def test_sgd_momentum_and_grad_accumulation():
    torch.manual_seed(1)
    w_cpu = torch.randn(5, 3, requires_grad=True)
    w_brick = w_cpu.detach().to("brick").requires_grad_()
    x = torch.randn(4, 5)
    for w, inp in ((w_cpu, x), (w_brick, x.to("brick"))):
        opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
        for _ in range(2):
            (inp @ w).pow(2).sum().backward()  # accumulates twice before the step
            (inp @ w).sum().backward()
            opt.step()
            opt.zero_grad()
    torch.testing.assert_close(w_brick.detach().cpu(), w_cpu.detach())


def test_gradients_of_views_and_in_place_ops():
    a_cpu = torch.randn(4, 4, requires_grad=True)
    a_brick = a_cpu.detach().to("brick").requires_grad_()
    grads = []
    for a in (a_cpu, a_brick):
        b = a * 2
        b[1:3].mul_(3)
        c = b.t().reshape(-1)[::2]
        c.sum().backward()
        grads.append(a.grad)
    assert grads[1].device.type == "brick"
    torch.testing.assert_close(grads[1].cpu(), grads[0])


def test_no_grad_and_inference_mode():
    m = nn.Linear(3, 3).to("brick")
    x = torch.randn(2, 3, device="brick")
    with torch.no_grad():
        assert not m(x).requires_grad
    with torch.inference_mode():
        y = m(x)
        assert y.device.type == "brick" and y.is_inference()


# ---- torch_openreg's test_rnn.py (spec: the RNN family on brick equals the CPU) --------------


RNN_MODULES = {
    "RNN": (nn.RNN, dict(num_layers=2, nonlinearity="tanh")),
    "LSTM": (nn.LSTM, dict(num_layers=2)),
    "LSTM_bidirectional": (nn.LSTM, dict(num_layers=2, bidirectional=True)),
    "LSTM_batch_first": (nn.LSTM, dict(batch_first=True)),
    "LSTM_proj": (nn.LSTM, dict(proj_size=3)),  # the CPU warns it cannot use oneDNN here
    "GRU": (nn.GRU, dict(num_layers=2)),
    "GRU_bidirectional_batch_first": (nn.GRU, dict(bidirectional=True, batch_first=True)),
}


def _pair(module_cpu):
    """An independent copy of the module on brick, with the same parameters."""
    return copy.deepcopy(module_cpu).to("brick")


def _assert_same_results(outs_cpu, outs_brick):
    flat_cpu, flat_brick = list(_flatten(outs_cpu)), list(_flatten(outs_brick))
    assert len(flat_cpu) == len(flat_brick)
    for expected, actual in zip(flat_cpu, flat_brick):
        assert actual.device.type == "brick"
        torch.testing.assert_close(actual.detach().cpu(), expected.detach())


def _flatten(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, nn.utils.rnn.PackedSequence):
        yield value.data
    else:
        for item in value:
            yield from _flatten(item)


def _assert_same_grads(module_cpu, module_brick):
    for (name, p_cpu), (_, p_brick) in zip(module_cpu.named_parameters(),
                                           module_brick.named_parameters()):
        assert p_brick.grad is not None and p_brick.grad.device.type == "brick", name
        torch.testing.assert_close(p_brick.grad.cpu(), p_cpu.grad, msg=name)


@pytest.mark.filterwarnings("ignore:LSTM with projections is not supported with oneDNN")
@pytest.mark.parametrize("name", RNN_MODULES, ids=list(RNN_MODULES))
def test_rnn_modules_match_cpu_forward_and_backward(name):
    cls, extra = RNN_MODULES[name]
    torch.manual_seed(0)
    module_cpu = cls(input_size=5, hidden_size=6, **extra)
    module_brick = _pair(module_cpu)
    batch_first = extra.get("batch_first", False)
    x = torch.randn((3, 4, 5) if batch_first else (4, 3, 5))
    layers = extra.get("num_layers", 1) * (2 if extra.get("bidirectional") else 1)
    out_size = extra.get("proj_size", 0) or 6
    h0 = torch.randn(layers, 3, out_size)
    state = (h0, torch.randn(layers, 3, 6)) if cls is nn.LSTM else h0
    x_cpu = x.clone().requires_grad_()
    x_brick = x.to("brick").requires_grad_()
    state_brick = tuple(s.to("brick") for s in state) if cls is nn.LSTM else state.to("brick")
    outs_cpu = module_cpu(x_cpu, state)
    outs_brick = module_brick(x_brick, state_brick)
    _assert_same_results(outs_cpu, outs_brick)
    loss_cpu = sum(t.pow(2).sum() for t in _flatten(outs_cpu))
    loss_brick = sum(t.pow(2).sum() for t in _flatten(outs_brick))
    loss_cpu.backward()
    loss_brick.backward()
    torch.testing.assert_close(x_brick.grad.cpu(), x_cpu.grad)
    _assert_same_grads(module_cpu, module_brick)
    # without an initial state too
    _assert_same_results(module_cpu(x), module_brick(x.to("brick")))


@pytest.mark.parametrize("cls", [nn.RNNCell, nn.LSTMCell, nn.GRUCell],
                         ids=["RNNCell", "LSTMCell", "GRUCell"])
def test_rnn_cells_match_cpu_forward_and_backward(cls):
    torch.manual_seed(1)
    cell_cpu = cls(5, 6)
    cell_brick = _pair(cell_cpu)
    x = torch.randn(3, 5)
    h = torch.randn(3, 6)
    state = (h, torch.randn(3, 6)) if cls is nn.LSTMCell else h
    state_brick = tuple(s.to("brick") for s in state) if cls is nn.LSTMCell else h.to("brick")
    x_cpu, x_brick = x.clone().requires_grad_(), x.to("brick").requires_grad_()
    out_cpu, out_brick = cell_cpu(x_cpu, state), cell_brick(x_brick, state_brick)
    _assert_same_results(out_cpu, out_brick)
    sum(t.sum() for t in _flatten(out_cpu)).backward()
    sum(t.sum() for t in _flatten(out_brick)).backward()
    torch.testing.assert_close(x_brick.grad.cpu(), x_cpu.grad)
    _assert_same_grads(cell_cpu, cell_brick)
    _assert_same_results(cell_cpu(x), cell_brick(x.to("brick")))  # zero initial state


def test_lstm_packed_sequence_matches_cpu():
    torch.manual_seed(2)
    lstm_cpu = nn.LSTM(input_size=5, hidden_size=6)
    lstm_brick = _pair(lstm_cpu)
    sequences = [torch.randn(5, 5), torch.randn(3, 5), torch.randn(1, 5)]
    packed = nn.utils.rnn.pack_sequence(sequences, enforce_sorted=True)
    out_cpu, (h_cpu, c_cpu) = lstm_cpu(packed)
    out_brick, (h_brick, c_brick) = lstm_brick(packed.to("brick"))
    assert out_brick.data.device.type == "brick"
    assert torch.equal(out_brick.batch_sizes, out_cpu.batch_sizes)
    _assert_same_results((out_cpu.data, h_cpu, c_cpu), (out_brick.data, h_brick, c_brick))


# ---- tied weights (spec) ---------------------------------------------------------------------


class _TiedLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(10, 4)
        self.head = nn.Linear(4, 10, bias=False)
        self.head.weight = self.embed.weight

    def forward(self, tokens):
        return self.head(self.embed(tokens))


def test_tied_weights_stay_tied_after_to_brick():
    model = _TiedLM()
    weight = model.embed.weight
    model.to("brick")
    assert model.embed.weight.device.type == "brick"
    assert model.head.weight is model.embed.weight
    assert model.embed.weight is weight  # Module.to() keeps the Parameter objects, as on CPU/CUDA
    assert len(list(model.parameters())) == 1
    state = model.state_dict()
    assert state["embed.weight"].data_ptr() == state["head.weight"].data_ptr()


def test_tied_weights_train_as_one_parameter_on_brick():
    torch.manual_seed(0)
    cpu_model = _TiedLM()
    brick_model = _TiedLM()
    brick_model.load_state_dict(cpu_model.state_dict())
    brick_optimizer = torch.optim.SGD(brick_model.parameters(), lr=0.1)
    brick_model.to("brick")  # after the optimizer was made: it must still hold the parameter
    tokens = torch.tensor([[1, 2, 3], [4, 5, 6]])
    for model, device, optimizer in (
        (cpu_model, "cpu", torch.optim.SGD(cpu_model.parameters(), lr=0.1)),
        (brick_model, "brick", brick_optimizer),
    ):
        for _ in range(2):
            optimizer.zero_grad()
            model(tokens.to(device)).logsumexp(-1).sum().backward()
            optimizer.step()
    assert brick_model.head.weight is brick_model.embed.weight
    torch.testing.assert_close(brick_model.embed.weight.detach().cpu(),
                               cpu_model.embed.weight.detach())


# ---- torch_openreg's test_autograd.py, for brick ---------------------------------------------


@pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="needs /proc thread names")
def test_autograd_has_one_worker_thread_per_device():
    torch.ones(2, requires_grad=True, device="brick").sum().backward()
    names = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/comm") as f:
                names.add(f.read().strip())
        except OSError:  # the thread ended meanwhile
            pass
    for index in range(torch.accelerator.device_count()):
        assert f"pt_autograd_{index}" in names
