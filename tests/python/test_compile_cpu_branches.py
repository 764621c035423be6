"""Compiled brick code computes what compiled CPU code does, to the bit, where Inductor's
lowerings branch on ``device.type == "cpu"`` (torch_brickdev._compile.cpu_branches): LayerNorm,
var and std (two-pass on the CPU, Welford elsewhere), division by a constant, small matmuls'
decompositions, argmax over a non-contiguous input, and real models built from them."""

import ast
import copy as copy_module
import importlib
import inspect
import textwrap

import pytest
import torch
import torch.nn.functional as F

import torch_brickdev
from torch_brickdev._compile import cpu_branches

# Inductor's caches in a temporary folder of this module (an autouse fixture), as test_compile's.
from test_compile import _TinyViT, _fresh_inductor_cache  # noqa: F401,E402

pytestmark = pytest.mark.skipif(torch_brickdev.backing_device_type() != "cpu",
                                reason="Inductor compiles brick code on the host runtime only")


def _compiled_on(device, fn, *cpu_args):
    torch._dynamo.reset()
    args = [a.to(device) if isinstance(a, torch.Tensor) else a for a in cpu_args]
    out = torch.compile(fn, fullgraph=True)(*args)
    outputs = out if isinstance(out, (tuple, list)) else [out]
    return [o.cpu() for o in outputs], [o.device.type for o in outputs]


def _assert_bit_equal_to_compiled_cpu(fn, *args):
    on_cpu, _ = _compiled_on("cpu", fn, *args)
    on_brick, devices = _compiled_on("brick", fn, *args)
    assert set(devices) == {"brick"}, devices
    for index, (got, want) in enumerate(zip(on_brick, on_cpu)):
        assert got.dtype == want.dtype and got.shape == want.shape, index
        assert torch.equal(got, want), \
            (index, (got.double() - want.double()).abs().max().item())


def test_cpu_or_brick_equals_both_names_and_nothing_else():
    value = cpu_branches.CPU_OR_BRICK
    assert value == "cpu" and value == "brick" and "cpu" == value and "brick" == value
    assert value != "cuda" and not (value == "mps") and "cuda" != value
    assert "brick" in (value, "mps") and "cuda" not in (value, "mps")
    assert hash(value) == hash("cpu") and {"cpu": 1}[value] == 1


def test_every_rewritten_constant_is_a_device_type_test():
    """The listed functions use "cpu" only in comparisons (==, !=, in, not in) on this torch,
    and each one this torch has is rewritten."""
    rewritten = cpu_branches.take_the_cpus_branches()
    assert "torch._inductor.lowering.use_two_step_variance" in rewritten
    for module_name, name in cpu_branches.CPU_BRANCHES:
        function = getattr(importlib.import_module(module_name), name, None)
        if function is None:
            continue
        while hasattr(function, "__wrapped__"):
            function = function.__wrapped__
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
        compared = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.Compare):
                compared.update(id(n) for n in ast.walk(node))
        strays = [n.lineno for n in ast.walk(tree)
                  if isinstance(n, ast.Constant) and n.value == "cpu" and id(n) not in compared]
        assert not strays, (module_name, name, strays)


def _elementwise_and_reductions(x, w, b, m, v, k1):
    return (
        F.layer_norm(x, (768,), w, b),  # two-pass variance on the CPU
        x.var(-1), x.std(-1, keepdim=True), torch.var_mean(x, -1)[0],
        x / 3.0, x / 7,  # a division, not a multiplication by the reciprocal
        torch.softmax(x, -1), torch.log_softmax(x, -1),
        x.t().argmax(0), x.t().argmin(1),  # logical index of a non-contiguous input
        m @ v,  # [1, K] x [K, 1]: the CPU's reduction
        k1 @ k1.t(),  # K == 1: a pointwise product elsewhere
        torch.addmm(b[:8], v[:8].t(), m[:, :8].t().expand(8, 8).contiguous()),
        torch.bmm(m.unsqueeze(0), v.unsqueeze(0)),
    )


@pytest.mark.timeout(300)
def test_ops_with_device_type_branches_equal_compiled_cpu():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(6, 768, generator=g) * 3 + 1
    w, b = torch.randn(768, generator=g), torch.randn(768, generator=g)
    m, v = torch.randn(1, 16, generator=g), torch.randn(16, 1, generator=g)
    k1 = torch.randn(5, 1, generator=g)
    _assert_bit_equal_to_compiled_cpu(_elementwise_and_reductions, x, w, b, m, v, k1)


@pytest.mark.model
@pytest.mark.timeout(300)
def test_transformer_models_equal_compiled_cpu():
    """A ViT-style block and BERT (transformers): their LayerNorms and attention's scaling are
    where compiled brick and compiled CPU differed."""
    transformers = pytest.importorskip("transformers")

    torch.manual_seed(0)
    vit = _TinyViT().eval()
    config = transformers.BertConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                                     intermediate_size=128, vocab_size=100,
                                     max_position_embeddings=32)
    bert = transformers.BertModel(config).eval()
    images = torch.randn(2, 3, 32, 32)
    ids = torch.randint(0, 100, (2, 12))
    for model, inputs in ((vit, images), (bert, ids)):
        outputs = []
        for device in ("cpu", "brick"):
            torch._dynamo.reset()
            copy = copy_module.deepcopy(model).to(device)
            with torch.no_grad():
                out = torch.compile(copy)(inputs.to(device))
            out = out.last_hidden_state if hasattr(out, "last_hidden_state") else out
            assert out.device.type == device
            outputs.append(out.cpu())
        assert torch.equal(outputs[1], outputs[0]), \
            (type(model).__name__, (outputs[1] - outputs[0]).abs().max().item())
