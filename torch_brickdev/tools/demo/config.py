"""The decode demo's configuration (:class:`DecodeConfig`, validated field by field) and the checks
of the config and device arguments the demo's functions share."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

from torch_brickdev.argcheck import describe, describe_value


class DecodeConfigTypeError(TypeError, ValueError):
    """A :class:`DecodeConfig` field of the wrong type. A TypeError, and also a ValueError so that
    code catching the ValueError that :meth:`DecodeConfig.validate` raises for bad values (the
    command line does) catches it too."""


def _check_field(name: str, value, expected: str, kind, *, minimum, exclusive: bool = False):
    """Raises when a config field is not a finite ``kind`` (never a bool) above ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, kind):
        raise DecodeConfigTypeError(
            f"decode config: {name} must be {expected}, got {describe_value(value)}")
    too_small = value <= minimum if exclusive else value < minimum
    if not math.isfinite(value) or too_small:
        raise ValueError(f"decode config: {name} must be {expected}, got {value!r}")


@dataclass
class DecodeConfig:
    layers: int = 2
    hidden: int = 512
    heads: int = 8
    kv_heads: int = 2
    vocab: int = 32000
    prompt_tokens: int = 16
    tokens: int = 32
    seed: int = 0
    intermediate: Optional[int] = None  # None: ~2.75 * hidden rounded to a multiple of 64
    max_positions: int = 4096
    rope_theta: float = 10000.0
    eps: float = 1e-6

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    @property
    def intermediate_size(self) -> int:
        if self.intermediate is not None:
            return self.intermediate
        return max(64, int(round(2.75 * self.hidden / 64)) * 64)

    def validate(self) -> "DecodeConfig":
        """Raises naming the field; creates nothing. A field of the wrong type raises
        :class:`DecodeConfigTypeError` (a TypeError that is also a ValueError), a bad value
        ValueError."""
        for name in ("layers", "hidden", "heads", "kv_heads", "vocab", "prompt_tokens", "tokens",
                     "max_positions"):
            _check_field(name, getattr(self, name), "a positive integer", int, minimum=1)
        _check_field("seed", self.seed, "a non-negative integer", int, minimum=0)
        if self.intermediate is not None:
            _check_field("intermediate", self.intermediate, "a positive integer or None", int,
                         minimum=1)
        for name in ("rope_theta", "eps"):
            _check_field(name, getattr(self, name), "a positive number", (int, float),
                         minimum=0, exclusive=True)
        if self.hidden % self.heads:
            raise ValueError(f"decode config: heads ({self.heads}) must divide hidden size ({self.hidden})")
        if self.heads % self.kv_heads:
            raise ValueError(f"decode config: kv_heads ({self.kv_heads}) must divide heads ({self.heads})")
        if self.head_dim % 2:
            raise ValueError(
                f"decode config: head_dim = hidden / heads = {self.head_dim} must be even "
                "(rotary embedding rotates pairs)")
        if self.prompt_tokens + self.tokens > self.max_positions:
            raise ValueError(
                f"decode config: prompt_tokens + tokens ({self.prompt_tokens} + {self.tokens}) must not "
                f"exceed max_positions ({self.max_positions})")
        return self


def _check_config(config, where: str) -> "DecodeConfig":
    """``config`` validated; it must be a :class:`DecodeConfig`."""
    if not isinstance(config, DecodeConfig):
        raise TypeError(f"decode demo: {where}: config must be a DecodeConfig, got {describe(config)}")
    return config.validate()


def _check_device(device, where: str) -> torch.device:
    """``device`` (a str or a torch.device) as a torch.device; a brick device must exist."""
    import torch  # here: the command line reads the demo's defaults without torch

    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"decode demo: {where}: device must be a str or a torch.device such as 'brick:0', "
            f"got {describe(device)}")
    try:
        device = torch.device(device)
    except RuntimeError as error:
        raise ValueError(
            f"decode demo: {where}: device={device!r} is not a device; expected e.g. 'brick:0' "
            f"or 'cpu' ({error})") from None
    count = torch.brick.device_count()
    if device.type == "brick" and device.index is not None and device.index >= count:
        raise RuntimeError(
            f"decode demo: {where}: device={str(device)!r} is out of range: there are {count} "
            f"brick device(s), valid device indices are 0..{count - 1} (BRICK_HOST_DEVICES sets "
            "the count for the host runtime)")
    return device


#: Why the decode demo's legacy comparison needs ``ops="dispatcher"``: it compares the registry's
#: ops with ``key_averages()``, which names ops at the dispatcher.
LEGACY_NEEDS_DISPATCHER = ("compares the registry's ops with key_averages(), which names them at "
                           "the dispatcher")


def legacy_refused(ops: str, legacy: bool) -> bool:
    """Whether the demo must refuse ``legacy`` with these ``ops`` (see LEGACY_NEEDS_DISPATCHER)."""
    return bool(legacy) and ops == "kernels"
