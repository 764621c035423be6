from typing import List

import torch

from .. import _C
from ._utils import check_int, describe, device_index
from .device import device_count

# The seeds torch.manual_seed documents: negative ones are remapped (0xffff_ffff_ffff_ffff + seed).
# torch.manual_seed(s) calls torch.brick.manual_seed_all(s), so brick accepts the same range.
_SEED_MIN = -0x8000_0000_0000_0000
_SEED_MAX = 0xFFFF_FFFF_FFFF_FFFF


class _DefaultGenerators:
    """``torch.brick.default_generators[i]``: the default generator of brick device ``i``.

    Indexed like ``torch.cuda.default_generators`` (a tuple): ``[-1]`` is the last device and
    slices work; a device (``"brick:1"``) is accepted too.
    """

    _WHERE = "torch.brick.default_generators[]"

    def __getitem__(self, index):
        if isinstance(index, slice):
            return tuple(self)[index]
        if isinstance(index, int) and not isinstance(index, bool):
            count = len(self)
            if not -count <= index < count:
                raise IndexError(
                    f"{self._WHERE}: index {index} is out of range: there are {count} brick "
                    f"device(s), valid indices are {-count}..{count - 1}"
                )
            return _C._default_generator(index % count)
        return _C._default_generator(device_index(index, optional=False, arg="index",
                                                  where=self._WHERE))

    def __len__(self) -> int:
        return device_count()

    def __iter__(self):
        return (_C._default_generator(i) for i in range(len(self)))


default_generators = _DefaultGenerators()


def _generator(device, where: str) -> torch.Generator:
    return _C._default_generator(device_index(device, where=where))


def _check_seed(seed, where: str) -> int:
    return check_int(seed, "seed", where, low=_SEED_MIN, high=_SEED_MAX)


def manual_seed(seed: int) -> None:
    """Seeds the current brick device's default generator."""
    where = "torch.brick.manual_seed()"
    _generator(None, where).manual_seed(_check_seed(seed, where))


def manual_seed_all(seed: int) -> None:
    """Seeds every brick device's default generator."""
    seed = _check_seed(seed, "torch.brick.manual_seed_all()")
    for generator in default_generators:
        generator.manual_seed(seed)


def seed() -> None:
    """Seeds the current brick device's generator with a non-deterministic number."""
    _generator(None, "torch.brick.seed()").seed()


def seed_all() -> None:
    """Seeds every brick device with one non-deterministic number."""
    generators = list(default_generators)
    value = generators[0].seed()
    for generator in generators[1:]:
        generator.manual_seed(value)


def initial_seed() -> int:
    """Initial seed of the current brick device's default generator."""
    return _generator(None, "torch.brick.initial_seed()").initial_seed()


def get_rng_state(device="brick") -> torch.Tensor:
    """RNG state of a brick device as a CPU ``torch.ByteTensor``."""
    return _generator(device, "torch.brick.get_rng_state()").get_state()


def _check_state(new_state, generator: torch.Generator, where: str,
                 arg: str = "new_state") -> torch.Tensor:
    """``new_state`` on the CPU, checked against what ``generator`` would accept, so that a
    wrong tensor is refused with a message naming the argument (not the generator's own)."""
    if not isinstance(new_state, torch.Tensor):
        raise TypeError(
            f"{where}: {arg} must be a torch.ByteTensor (from get_rng_state()), "
            f"got {describe(new_state)}"
        )
    if new_state.dtype != torch.uint8:
        raise TypeError(f"{where}: {arg} must have dtype torch.uint8, got {new_state.dtype}")
    expected = generator.get_state().numel()
    if new_state.dim() != 1 or new_state.numel() != expected:
        raise ValueError(
            f"{where}: {arg} must be a 1-D state of {expected} bytes as get_rng_state() "
            f"returns, got shape {tuple(new_state.shape)}"
        )
    return new_state.cpu()


def set_rng_state(new_state: torch.Tensor, device="brick") -> None:
    """Restores a state returned by :func:`get_rng_state`."""
    where = "torch.brick.set_rng_state()"
    generator = _generator(device, where)
    generator.set_state(_check_state(new_state, generator, where))


def get_rng_state_all() -> List[torch.Tensor]:
    return [generator.get_state() for generator in default_generators]


def set_rng_state_all(new_states) -> None:
    """Restores the states of :func:`get_rng_state_all`, one per device from device 0 (fewer
    than the devices is allowed, as for ``torch.cuda``). Every state is checked before any is
    set, so a bad one leaves all generators as they were."""
    where = "torch.brick.set_rng_state_all()"
    if isinstance(new_states, torch.Tensor) or not isinstance(new_states, (list, tuple)):
        raise TypeError(
            f"{where}: new_states must be a list or tuple of torch.ByteTensor (from "
            f"get_rng_state_all()), got {describe(new_states)}"
        )
    generators = list(default_generators)
    if len(new_states) > len(generators):
        raise ValueError(
            f"{where}: new_states must hold at most one state per brick device "
            f"({len(generators)}), got {len(new_states)}"
        )
    checked = [_check_state(state, generators[i], where, f"new_states[{i}]")
               for i, state in enumerate(new_states)]
    for generator, state in zip(generators, checked):
        generator.set_state(state)
