"""torch.autocast("brick") casts as its backing device's autocast does, and GradScaler("brick")
trains.

Every check runs the same code under the backing device's autocast (``torch.autocast("cpu")`` on
the host runtime, ``torch.autocast("cuda")`` on CUDA backing) on that device's tensors and under
``torch.autocast("brick")`` on brick copies, and compares dtypes and values.
"""

import copy
import re

import pytest
import torch
import torch.nn.functional as F

import torch_brickdev

LOWER = [torch.bfloat16, torch.float16]


def _ops_with_kernel(key: str) -> set:
    return {name for name in torch._C._dispatch_get_all_op_names()
            if name.startswith("aten::") and torch._C._dispatch_has_kernel_for_dispatch_key(name, key)}


def _names(ops) -> set:
    return {name[:-len(".default")] if name.endswith(".default") else name for name in ops}


def test_brick_autocasts_exactly_the_ops_its_backing_device_autocasts():
    # The policy is registered when the backing is decided (the first brick tensor): the CPU's
    # on the host runtime, CUDA's on CUDA backing. A release that changes it fails here.
    torch.ones(1, device="brick")
    backing = "AutocastCUDA" if torch_brickdev.backing_device_type() == "cuda" else "AutocastCPU"
    # cuDNN's RNN entry point: brick never reaches it (its RNN cells run as GEMMs).
    expected = _ops_with_kernel(backing) - {"aten::_cudnn_rnn"}
    brick = _ops_with_kernel("AutocastPrivateUse1")
    assert len(expected) > 100
    assert brick == expected, {"backing only": sorted(expected - brick),
                               "brick only": sorted(brick - expected)}


@pytest.mark.parametrize("cuda_backing, key", [(False, "AutocastCPU"), (True, "AutocastCUDA")])
def test_each_backings_policy_lists_exactly_the_ops_its_autocast_registers(cuda_backing, key):
    """Both policies are checked on every machine (PyTorch registers AutocastCUDA's kernels in
    CPU builds too), so CUDA's list is known right before a GPU ever runs it."""
    listed = _names(torch_brickdev._C._autocast_policy_ops(cuda_backing))
    # CUDA builds also register cuDNN's RNN entry point (its weights are cast and re-flattened
    # by a kernel of its own); brick never reaches it: its RNN cells run as GEMMs on brick.
    registered = _ops_with_kernel(key) - {"aten::_cudnn_rnn"}
    assert listed == registered, {"registered only": sorted(registered - listed),
                                  "listed only": sorted(listed - registered)}


def test_device_module_answers_for_autocast():
    assert torch.amp.is_autocast_available("brick")
    assert torch.brick.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
    # PyTorch's default for a PrivateUse1 device (the CPU's is bfloat16): pass dtype= for bf16.
    assert torch.get_autocast_dtype("brick") == torch.float16


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    return {
        "a": torch.randn(8, 16, generator=g), "b": torch.randn(16, 8, generator=g),
        "x": torch.randn(2, 3, 10, 10, generator=g), "w": torch.randn(4, 3, 3, 3, generator=g),
        "q": torch.randn(2, 2, 6, 8, generator=g), "t": torch.randn(8, 8, generator=g),
        "d": torch.randn(8, 8, generator=g, dtype=torch.float64),
        "idx": torch.tensor([0, 2, 4]), "src": torch.randn(3, 8, generator=g),
    }


CASES = {
    # lower-precision ops
    "mm": lambda i: torch.mm(i["a"], i["b"]),
    "matmul": lambda i: i["a"] @ i["b"],
    "linear": lambda i: F.linear(i["a"], i["b"].T),
    "addmm": lambda i: torch.addmm(i["t"], i["a"], i["b"]),
    "bmm": lambda i: torch.bmm(i["q"][0], i["q"][1].transpose(-1, -2)),
    "conv2d": lambda i: F.conv2d(i["x"], i["w"], padding=1),
    "sdpa": lambda i: F.scaled_dot_product_attention(i["q"], i["q"], i["q"]),
    # float32 ops, on a lower-precision input
    "mse_loss": lambda i: F.mse_loss((i["a"] @ i["b"]), i["t"]),
    "cross_entropy": lambda i: F.cross_entropy(i["a"] @ i["b"], i["idx"].repeat(3)[:8]),
    "prod": lambda i: torch.prod(i["a"] @ i["b"], dim=1),
    "fft": lambda i: torch.fft.fft(i["a"] @ i["b"]),
    # promote: the widest type among the inputs
    "cat": lambda i: torch.cat([i["a"] @ i["b"], i["t"]]),
    "cat_double": lambda i: torch.cat([i["a"] @ i["b"], i["d"]]),
    "stack": lambda i: torch.stack([i["a"] @ i["b"], i["t"]]),
    "index_copy": lambda i: i["t"].index_copy(0, i["idx"], (i["src"] @ i["t"])),
    # not listed: run in their inputs' types
    "add": lambda i: (i["a"] @ i["b"]) + i["t"],
    "softmax": lambda i: torch.softmax(i["a"] @ i["b"], dim=-1),
    "double_mm": lambda i: i["d"] @ i["d"],  # float64 is never lowered
    "dot": lambda i: torch.dot(i["a"][0], i["b"][:, 0]),
}


@pytest.mark.parametrize("dtype", LOWER, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_each_policy_casts_and_computes_as_the_backing_devices_autocast(case, dtype):
    torch.ones(1, device="brick")  # the backing is decided with the first brick tensor
    backing = torch_brickdev.backing_device_type()
    inputs = _inputs()
    on_backing = {k: v.to(backing) for k, v in inputs.items()}
    on_brick = {k: v.to("brick") for k, v in inputs.items()}
    try:
        with torch.autocast(backing, dtype=dtype):
            expected = CASES[case](on_backing)
    except RuntimeError as error:  # e.g. cuFFT has no bfloat16: brick refuses it the same way
        with pytest.raises(RuntimeError, match=re.escape(str(error).split("\n")[0][:60])):
            with torch.autocast("brick", dtype=dtype):
                CASES[case](on_brick)
        return
    with torch.autocast("brick", dtype=dtype):
        actual = CASES[case](on_brick)
    assert actual.device.type == "brick"
    assert actual.dtype == expected.dtype, (case, actual.dtype, expected.dtype)
    # The host runs brick's ops with the CPU's kernels: equal bits. On CUDA backing, as
    # test_cuda_backing.py's autocast test (the GPU's library may pick another algorithm).
    tolerance = 0 if backing == "cpu" else 1e-3
    torch.testing.assert_close(actual.cpu(), expected.cpu(), rtol=tolerance, atol=tolerance)


def test_outside_autocast_and_disabled_regions_nothing_is_cast():
    a = torch.randn(4, 4, device="brick")
    assert (a @ a).dtype == torch.float32
    with torch.autocast("brick", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.bfloat16
        with torch.autocast("brick", enabled=False):
            assert (a @ a).dtype == torch.float32
            with torch.autocast("brick", dtype=torch.float16):
                assert (a @ a).dtype == torch.float16  # nested: the innermost region rules
            assert (a @ a).dtype == torch.float32
        assert (a @ a).dtype == torch.bfloat16
    assert (a @ a).dtype == torch.float32
    # CPU autocast does not touch brick tensors, brick's does not touch CPU tensors.
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert (a @ a).dtype == torch.float32
    c = torch.randn(4, 4)
    with torch.autocast("brick", dtype=torch.bfloat16):
        assert (c @ c).dtype == torch.float32


def test_unsupported_dtype_warns_and_disables_as_for_any_device():
    a = torch.randn(4, 4, device="brick")
    with pytest.warns(UserWarning, match="not supported"):
        with torch.autocast("brick", dtype=torch.float64):
            assert (a @ a).dtype == torch.float32


def _mlp(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.GELU(), torch.nn.LayerNorm(32),
                               torch.nn.Linear(32, 1))


@pytest.mark.parametrize("dtype", LOWER, ids=str)
def test_gradients_through_autocast_equal_cpu_autocast(dtype):
    torch.ones(1, device="brick")
    if torch_brickdev.backing_device_type() != "cpu":
        # A plain-cuda backward cannot run beside brick in one process (pytorch/pytorch#161129).
        pytest.skip("compares with CPU autocast: brick follows CUDA's policy on CUDA backing")
    cpu_model = _mlp()
    brick_model = copy.deepcopy(cpu_model).to("brick")
    x, y = torch.randn(16, 8), torch.randn(16, 1)
    with torch.autocast("cpu", dtype=dtype):
        cpu_loss = F.mse_loss(cpu_model(x), y)
    with torch.autocast("brick", dtype=dtype):
        brick_loss = F.mse_loss(brick_model(x.to("brick")), y.to("brick"))
    assert brick_loss.dtype == cpu_loss.dtype == torch.float32
    cpu_loss.backward()
    brick_loss.backward()
    torch.testing.assert_close(brick_loss.cpu(), cpu_loss, rtol=0, atol=0)
    for p_cpu, p_brick in zip(cpu_model.parameters(), brick_model.parameters()):
        assert p_brick.grad.dtype == torch.float32  # master weights keep their type
        # Brick's backward runs on PyTorch's autograd thread for brick, whose intra-op thread
        # count is the one in force when that thread started: a different split of the
        # low-precision GEMMs rounds differently (seen: 3% on a small bf16 gradient entry).
        scale = p_cpu.grad.abs().max().item()
        torch.testing.assert_close(p_brick.grad.cpu(), p_cpu.grad, rtol=2e-2, atol=1e-2 * scale)


def _scaled_training(device, steps=5, inf_at=2):
    model = _mlp().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    scaler = torch.amp.GradScaler(device, init_scale=2.0 ** 16, growth_interval=2)
    torch.manual_seed(1)
    x, y = torch.randn(32, 8).to(device), torch.randn(32, 1).to(device)
    history = []
    for step in range(steps):
        optimizer.zero_grad()
        with torch.autocast(device, dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        if step == inf_at:
            loss = loss * float("inf")  # an overflow: the step must be skipped
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        history.append((loss.item(), scaler.get_scale()))
    return history, [p.detach().cpu() for p in model.parameters()]


def test_grad_scaler_training_loop_equals_cpu_and_skips_overflowing_steps():
    cpu_history, cpu_params = _scaled_training("cpu")
    brick_history, brick_params = _scaled_training("brick")
    # The same scale decisions (skips, halvings, growth) at every step; losses and weights as
    # close as fp16 GEMMs split differently allow (see the gradient test above).
    assert [s for _, s in brick_history] == [s for _, s in cpu_history]
    torch.testing.assert_close([loss for loss, _ in brick_history], [loss for loss, _ in cpu_history],
                               rtol=1e-3, atol=0)
    scales = [scale for _, scale in brick_history]
    assert scales[2] == scales[1] / 2, "the inf step halves the scale"
    assert brick_history[2][0] == float("inf")
    for a, b in zip(brick_params, cpu_params):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=1e-4)
    assert torch.isfinite(torch.cat([p.flatten() for p in brick_params])).all()


def test_autocast_is_profiled_as_the_ops_it_runs():
    # The casts autocast inserts are real ops on brick: the registry sees them.
    import torch_brickdev.profiler as bp

    a = torch.randn(16, 16, device="brick")
    with bp.profile(sync_mode="event") as p:
        with torch.autocast("brick", dtype=torch.bfloat16):
            (a @ a).sum()
    names = {b.name for b in p.report.bricks}
    assert {"aten::matmul", "aten::_to_copy", "aten::mm"} <= names, names
    mm = next(b for b in p.report.bricks if b.name == "aten::mm")
    assert mm.count == 1 and mm.total_ns > 0


# ---- autocast's device-module contract ------------------------------------------------------


def test_checkpointing_cpu_and_brick_work_with_brick_loaded():
    # PyTorch opens torch.amp.autocast(<current accelerator>, enabled=False) when it recomputes
    # a checkpointed region, also for CPU tensors: brick (the accelerator once loaded) must
    # answer for it, or checkpointing breaks everywhere brick is installed.
    from torch.utils.checkpoint import checkpoint

    for device in ("cpu", "brick"):
        x = torch.linspace(-1, 1, 16, device=device).reshape(4, 4).requires_grad_()
        for reentrant in (False, True):
            x.grad = None
            checkpoint(torch.sin, x, use_reentrant=reentrant).sum().backward()
            torch.testing.assert_close(x.grad.cpu(), torch.cos(x.detach().cpu()))
    assert torch.brick.get_amp_supported_dtype() == [torch.float16, torch.bfloat16]
