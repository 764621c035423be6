from typing import List

import torch

from .. import _C
from ._utils import device_index
from .device import device_count


class _DefaultGenerators:
    """``torch.brick.default_generators[i]``: the default generator of brick device ``i``."""

    def __getitem__(self, index: int) -> torch.Generator:
        return _C._default_generator(device_index(index, optional=False, arg="index"))

    def __len__(self) -> int:
        return device_count()

    def __iter__(self):
        return (self[i] for i in range(len(self)))


default_generators = _DefaultGenerators()


def _generator(device) -> torch.Generator:
    return _C._default_generator(device_index(device))


def _check_seed(seed) -> int:
    if isinstance(seed, bool) or not isinstance(seed, int):
        try:
            seed = int(seed)
        except (TypeError, ValueError):
            raise TypeError(f"torch.brick: seed must be an int, got {type(seed).__name__}") from None
    return seed


def manual_seed(seed: int) -> None:
    """Seeds the current brick device's default generator."""
    _generator(None).manual_seed(_check_seed(seed))


def manual_seed_all(seed: int) -> None:
    """Seeds every brick device's default generator."""
    seed = _check_seed(seed)
    for generator in default_generators:
        generator.manual_seed(seed)


def seed() -> None:
    """Seeds the current brick device's generator with a non-deterministic number."""
    _generator(None).seed()


def seed_all() -> None:
    """Seeds every brick device with one non-deterministic number."""
    generators = list(default_generators)
    value = generators[0].seed()
    for generator in generators[1:]:
        generator.manual_seed(value)


def initial_seed() -> int:
    """Initial seed of the current brick device's default generator."""
    return _generator(None).initial_seed()


def get_rng_state(device="brick") -> torch.Tensor:
    """RNG state of a brick device as a CPU ``torch.ByteTensor``."""
    return _generator(device).get_state()


def set_rng_state(new_state: torch.Tensor, device="brick") -> None:
    """Restores a state returned by :func:`get_rng_state`."""
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(
            f"torch.brick: new_state must be a torch.ByteTensor, got {type(new_state).__name__}"
        )
    if new_state.dtype != torch.uint8:
        raise TypeError(f"torch.brick: new_state must have dtype torch.uint8, got {new_state.dtype}")
    _generator(device).set_state(new_state.cpu())


def get_rng_state_all() -> List[torch.Tensor]:
    return [generator.get_state() for generator in default_generators]


def set_rng_state_all(new_states) -> None:
    for index, state in enumerate(new_states):
        set_rng_state(state, index)
