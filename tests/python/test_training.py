"""Autograd, optimizers and nn modules on brick match the same computation on the CPU."""

import copy

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
