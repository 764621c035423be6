"""Random numbers on brick: seeding, RNG state and generators per device."""

import torch


def test_rng_manual_seed_is_reproducible_and_matches_cpu():
    torch.manual_seed(1234)
    a = torch.randn(16, device="brick")
    torch.manual_seed(1234)
    b = torch.randn(16, device="brick")
    torch.manual_seed(1234)
    c = torch.randn(16)
    assert torch.equal(a.cpu(), b.cpu())
    assert torch.equal(a.cpu(), c)  # brick draws from a generator of the backing device


def test_rng_state_round_trip_and_per_device_generators():
    torch.brick.manual_seed_all(7)
    state = torch.brick.get_rng_state()
    assert state.dtype == torch.uint8 and state.device.type == "cpu"
    x = torch.rand(8, device="brick")
    torch.brick.set_rng_state(state)
    y = torch.rand(8, device="brick")
    assert torch.equal(x.cpu(), y.cpu())
    torch.brick.manual_seed(1)  # only device 0
    assert torch.brick.default_generators[0].initial_seed() == 1
    assert torch.brick.default_generators[1].initial_seed() == 7
    assert len(torch.brick.get_rng_state_all()) == 2
    assert torch.brick.initial_seed() == 1


def test_explicit_generator_on_brick():
    g = torch.Generator(device="brick")
    assert g.device.type == "brick"
    g.manual_seed(3)
    a = torch.rand(4, device="brick", generator=g)
    g.manual_seed(3)
    b = torch.rand(4, device="brick", generator=g)
    assert torch.equal(a.cpu(), b.cpu())


# ---- torch_openreg's test_rng.py, for brick --------------------------------------------------


def test_generators_and_seeds():
    g = torch.Generator(device="brick:1")
    assert g.device == torch.device("brick:1")
    g.manual_seed(42)
    assert g.initial_seed() == 42
    a = torch.rand(4, device="brick:1", generator=g)
    g.manual_seed(42)
    assert torch.equal(torch.rand(4, device="brick:1", generator=g).cpu(), a.cpu())
    state = torch.brick.get_rng_state(0)
    first = torch.rand(4, device="brick")
    torch.brick.set_rng_state(state, 0)
    assert torch.equal(torch.rand(4, device="brick").cpu(), first.cpu())
    states = torch.brick.get_rng_state_all()
    torch.brick.set_rng_state_all(states)
    torch.brick.manual_seed_all(42)
    assert torch.brick.initial_seed() == 42
    assert [gen.initial_seed() for gen in torch.brick.default_generators] == [42, 42]
    torch.brick.seed_all()
    seed1 = torch.brick.initial_seed()
    torch.brick.seed_all()
    assert torch.brick.initial_seed() != seed1
