"""Every random op on brick draws from brick's generator, and seeded programs equal the CPU's.

The sweep runs each random op on brick twice: once to see that brick's default generator
advanced and the CPU's did not, once against the same op on the CPU from the same seed.
"""

import pytest
import torch
import torch.nn.functional as F

BRICK = torch.device("brick")


def _x(device, *size, dtype=torch.float32):
    return torch.linspace(-2, 2, steps=int(torch.tensor(size).prod()), dtype=dtype).reshape(
        size).to(device)


# (name, op on a device). Each draws random numbers without being given a generator.
RANDOM_OPS = [
    ("dropout", lambda d: F.dropout(_x(d, 64, 8), 0.3)),
    ("dropout_bf16", lambda d: F.dropout(_x(d, 64, 8, dtype=torch.bfloat16), 0.1)),
    ("dropout_inplace", lambda d: F.dropout(_x(d, 64, 8), 0.3, inplace=True)),
    ("native_dropout", lambda d: torch.native_dropout(_x(d, 64, 8), 0.25, True)),
    ("alpha_dropout", lambda d: F.alpha_dropout(_x(d, 64, 8), 0.2, training=True)),
    ("feature_alpha_dropout", lambda d: F.feature_alpha_dropout(_x(d, 4, 8, 3), 0.2, True)),
    ("dropout2d", lambda d: F.dropout2d(_x(d, 4, 8, 3, 3), 0.5)),
    ("nn.Dropout", lambda d: torch.nn.Dropout(0.4)(_x(d, 32, 4))),
    ("sdpa_dropout", lambda d: F.scaled_dot_product_attention(
        _x(d, 1, 2, 6, 8), _x(d, 1, 2, 6, 8), _x(d, 1, 2, 6, 8), dropout_p=0.3)),
    ("rand", lambda d: torch.rand(5, 3, device=d)),
    ("randn", lambda d: torch.randn(7, device=d)),
    ("randint", lambda d: torch.randint(0, 100, (9,), device=d)),
    ("randperm", lambda d: torch.randperm(20, device=d)),
    ("rand_like", lambda d: torch.rand_like(_x(d, 6))),
    ("randn_like", lambda d: torch.randn_like(_x(d, 6))),
    ("randint_like", lambda d: torch.randint_like(_x(d, 6), 10)),
    ("bernoulli", lambda d: torch.bernoulli(torch.full((12,), 0.4, device=d))),
    ("bernoulli_", lambda d: torch.empty(12, device=d).bernoulli_(0.3)),
    ("multinomial", lambda d: torch.multinomial(torch.ones(10, device=d), 4)),
    ("normal_", lambda d: torch.empty(8, device=d).normal_()),
    ("uniform_", lambda d: torch.empty(8, device=d).uniform_()),
    ("exponential_", lambda d: torch.empty(8, device=d).exponential_()),
    ("geometric_", lambda d: torch.empty(8, device=d).geometric_(0.3)),
    ("log_normal_", lambda d: torch.empty(8, device=d).log_normal_()),
    ("cauchy_", lambda d: torch.empty(8, device=d).cauchy_()),
    ("random_", lambda d: torch.empty(8, device=d).random_(0, 50)),
    ("poisson", lambda d: torch.poisson(torch.full((8,), 3.0, device=d))),
    ("rrelu", lambda d: F.rrelu(_x(d, 16), training=True)),
    ("gumbel_softmax", lambda d: F.gumbel_softmax(_x(d, 4, 5))),
    ("multihead_attention", lambda d: _mha(d)),
    ("transformer_layer", lambda d: _encoder_layer(d)),
    ("lstm_dropout", lambda d: _lstm(d)),
]


def _module(factory, device):
    """The same weights on both devices, drawn from seed 123 without touching the generators
    under test."""
    cpu_state, brick_states = torch.get_rng_state(), torch.brick.get_rng_state_all()
    torch.manual_seed(123)
    module = factory()
    torch.set_rng_state(cpu_state)
    torch.brick.set_rng_state_all(brick_states)
    return module.to(device).train()


def _mha(device):
    mha = _module(lambda: torch.nn.MultiheadAttention(8, 2, dropout=0.3, batch_first=True), device)
    x = _x(device, 2, 5, 8)
    return mha(x, x, x)[0]


def _encoder_layer(device):
    layer = _module(lambda: torch.nn.TransformerEncoderLayer(8, 2, 16, dropout=0.3,
                                                            batch_first=True), device)
    return layer(_x(device, 2, 5, 8))


def _lstm(device):
    lstm = _module(lambda: torch.nn.LSTM(4, 6, num_layers=3, dropout=0.5), device)
    return lstm(_x(device, 5, 2, 4))[0]


def _as_cpu(result):
    if isinstance(result, (tuple, list)):
        return [_as_cpu(r) for r in result]
    return result.detach().cpu()


def _run(op, device, seed):
    torch.manual_seed(seed)  # seeds the CPU and every brick device alike
    return _as_cpu(op(device))


@pytest.mark.parametrize("name,op", RANDOM_OPS, ids=[n for n, _ in RANDOM_OPS])
def test_a_random_op_on_brick_draws_from_brick_and_equals_the_cpu(name, op, one_thread):
    # brick's generator advances, the CPU's does not.
    torch.manual_seed(5)
    cpu_state = torch.get_rng_state()
    brick_state = torch.brick.get_rng_state()
    op(BRICK)
    assert torch.equal(torch.get_rng_state(), cpu_state), f"{name} drew from the CPU's generator"
    assert not torch.equal(torch.brick.get_rng_state(), brick_state), \
        f"{name} did not draw from brick's generator"
    # Seeded alike, brick draws what the CPU draws; and so does the next random op after it.
    for seed in (0, 17):
        on_cpu = _run(lambda d: (op(d), torch.randn(3, device=d)), "cpu", seed)
        on_brick = _run(lambda d: (op(d), torch.randn(3, device=d)), BRICK, seed)
        torch.testing.assert_close(on_brick, on_cpu, rtol=0, atol=0, equal_nan=True)


def test_dropout_gradients_equal_the_cpu(one_thread):
    grads = {}
    for device in ("cpu", BRICK):
        torch.manual_seed(3)
        x = _x(device, 32, 8, dtype=torch.bfloat16).requires_grad_(True)
        F.dropout(x, 0.3).mul(1.5).sum().backward()
        grads[str(device)] = x.grad.cpu()
    assert torch.equal(grads["brick"], grads["cpu"])


def test_brick_manual_seed_makes_dropout_reproducible():
    x = torch.ones(100, device=BRICK)
    torch.brick.manual_seed(4)
    first = F.dropout(x, 0.5).cpu()
    torch.brick.manual_seed(4)
    assert torch.equal(F.dropout(x, 0.5).cpu(), first)


def test_dropout_in_evaluation_and_of_nothing_draws_nothing():
    state = torch.brick.get_rng_state()
    x = torch.ones(5, device=BRICK)
    assert torch.equal(F.dropout(x, 0.5, training=False).cpu(), torch.ones(5))
    out, mask = torch.native_dropout(x, 0.5, False)
    assert torch.equal(out.cpu(), torch.ones(5)) and mask.dtype == torch.bool and mask.all()
    empty = torch.native_dropout(torch.ones(0, device=BRICK), 0.5, True)
    assert empty[0].numel() == 0 and empty[0].device.type == "brick"
    assert torch.equal(torch.brick.get_rng_state(), state)
    with pytest.raises(RuntimeError, match="dropout probability has to be between 0 and 1"):
        torch.dropout(x, 1.5, True)  # below F.dropout's own check


def test_a_generator_of_another_device_is_refused():
    g0 = torch.Generator("brick:0")
    with pytest.raises(RuntimeError, match="Generator device index 0 does not match"):
        torch.rand(2, device="brick:1", generator=g0)
    with pytest.raises(RuntimeError, match="Expected a 'brick' device type for generator but "
                                           "found 'cpu'"):
        torch.randn(3, device="brick", generator=torch.Generator())
    with pytest.raises(RuntimeError, match="Expected a 'brick' device type for generator"):
        torch.empty(3, device="brick").normal_(generator=torch.Generator())
    # The brick:1 generator on brick:1 is fine, and draws what a seeded CPU generator draws.
    g1 = torch.Generator("brick:1").manual_seed(9)
    drawn = torch.rand(4, device="brick:1", generator=g1).cpu()
    assert torch.equal(drawn, torch.rand(4, generator=torch.Generator().manual_seed(9)))


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_a_checkpointed_block_recomputes_the_dropout_of_its_forward(use_reentrant):
    """torch.utils.checkpoint stashes brick's random state (torch.brick._initialized) and
    restores it for the recompute: the gradient drops exactly what the forward dropped."""
    torch.manual_seed(2)
    x = torch.ones(256, device=BRICK, requires_grad=True)
    out = torch.utils.checkpoint.checkpoint(lambda t: F.dropout(t * 1.0, 0.5), x,
                                            use_reentrant=use_reentrant)
    out.sum().backward()
    assert torch.equal(x.grad.cpu(), out.detach().cpu())  # 2 where kept, 0 where dropped
