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
