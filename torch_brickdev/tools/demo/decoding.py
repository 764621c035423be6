"""Token-by-token decoding with the demo's model: :func:`decode` prefills the prompt unprofiled,
then runs ``tokens`` decode steps (one token each, LmHead then Sampling) inside the region it is
given, timing each step (:class:`DecodeResult`)."""

from __future__ import annotations

import contextlib
import math
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Union

import torch
from torch.profiler import record_function

from torch_brickdev.argcheck import describe
from torch_brickdev.tools.demo.config import DecodeConfig, _check_config, _check_device
from torch_brickdev.tools.demo.model import QwenStyleDecoder


@dataclass
class DecodeResult:
    tokens: List[int]              # the `tokens` generated ids
    prompt: List[int]
    token_latencies_ns: List[int]  # wall ns per decode step, device synchronized

    @property
    def mean_token_ns(self) -> float:
        return sum(self.token_latencies_ns) / len(self.token_latencies_ns)

    @property
    def median_token_ns(self) -> float:
        """The run's figure for the stability check: a few tokens slowed by another process
        move the mean, not the median; a decode that really runs slower moves both."""
        return _percentile(self.token_latencies_ns, 50)


def prompt_ids(config: DecodeConfig) -> torch.Tensor:
    return _prompt_ids(_check_config(config, "prompt_ids()"))


def _prompt_ids(config: DecodeConfig) -> torch.Tensor:
    gen = torch.Generator(device="cpu").manual_seed(config.seed + 1)
    return torch.randint(0, config.vocab, (1, config.prompt_tokens), generator=gen)


def _synchronize(device: torch.device) -> None:
    if device.type == "brick":
        torch.brick.synchronize(device)
    elif device.type == "cuda":  # the plain-cuda baseline of benchmarks/bench_cuda.py
        torch.cuda.synchronize(device)


def decode(model: QwenStyleDecoder, config: DecodeConfig, device: Union[str, torch.device], *,
           region: Optional[contextlib.AbstractContextManager] = None,
           progress: Optional[Callable[[int, int, int], None]] = None) -> DecodeResult:
    """Prefills all prompt tokens but the last (unprofiled), then runs ``config.tokens`` decode
    steps inside ``region`` (e.g. a profiler; entered after the prefill). Step k feeds the
    current token at its position through Embedding … LmHead, then Sampling (greedy) picks the
    next. ``progress(step, total, latency_ns)`` is called after each step."""
    where = "decode()"
    if not callable(model):
        raise TypeError(f"decode demo: {where}: model must be a model from build_model(), "
                        f"got {describe(model)}")
    config = _check_config(config, where)
    device = _check_device(device, where)
    if region is not None and not (hasattr(region, "__enter__") and hasattr(region, "__exit__")):
        raise TypeError(f"decode demo: {where}: region must be a context manager (such as a "
                        f"profiler) or None, got {describe(region)}")
    if progress is not None and not callable(progress):
        raise TypeError(f"decode demo: {where}: progress must be a callable or None, "
                        f"got {describe(progress)}")
    return _decode(model, config, device, region, progress)


def _decode(model, config: DecodeConfig, device: torch.device,
            region: Optional[contextlib.AbstractContextManager] = None,
            progress: Optional[Callable[[int, int, int], None]] = None) -> DecodeResult:
    """:func:`decode` of validated arguments."""
    prompt = _prompt_ids(config)
    with torch.no_grad():
        ids = prompt.to(device)
        p = config.prompt_tokens
        if p > 1:
            model(ids[:, :p - 1], 0, logits=False)
        current = ids[:, p - 1:]
        generated, latencies = [], []
        _synchronize(device)
        with region if region is not None else contextlib.nullcontext():
            for step in range(config.tokens):
                start = time.perf_counter_ns()
                logits = model(current, p - 1 + step)
                with record_function("Sampling"):
                    current = logits.argmax(dim=-1, keepdim=True)
                generated.append(current)
                _synchronize(device)
                latencies.append(time.perf_counter_ns() - start)
                if progress is not None:
                    progress(step + 1, config.tokens, latencies[-1])
        tokens = torch.cat(generated, dim=1).cpu()[0].tolist()
    return DecodeResult(tokens=tokens, prompt=prompt[0].tolist(), token_latencies_ns=latencies)


def _percentile(values: List[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))
