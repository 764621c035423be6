"""Token-by-token decoding of a small Qwen-style decoder on brick, profiled per block.

The model is plain PyTorch: token embedding, RMSNorm, rotary position embedding, grouped-query
attention with a preallocated KV cache, a SwiGLU MLP and an untied LM head, with random weights
from a fixed seed. Each block runs inside a ``record_function`` range, all of them siblings:

    Embedding, RmsNorm (2 per layer + 1 final), QkvProjection, RopeEmbedding, AttentionScore,
    AttentionSoftmax, AttentionOutput, OutputProjection, GateProjection, UpProjection,
    Activation, DownProjection, LmHead, Sampling

(the decode bricks of the contract, :data:`torch_brickdev.tools.contract.DECODE_BRICKS`)

:func:`decode` prefills the prompt unprofiled, then runs ``tokens`` decode steps (one token
each, LmHead then Sampling) inside the region it is given; :func:`run_demo` profiles repeated
decodes with the brick registry, writes ``report.json`` and a chrome ``trace.json`` from one
legacy-profiled decode, and :func:`format_summary` renders the result.
"""

from __future__ import annotations

import contextlib
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Callable, List, Optional, Union

import torch
import torch.nn.functional as F
from torch.profiler import record_function

import torch_brickdev  # noqa: F401  (registers brick)
from torch_brickdev import profiler as bp
from torch_brickdev.argcheck import check_bool, check_int, check_path, describe, describe_value
from torch_brickdev.tools.quiet_kineto import QuietProfile

FINAL_TOKEN_NOTE = (
    "each decode step's LmHead produces the logits its token is sampled from; the prompt's "
    "prefill is not profiled, so LmHead.count == tokens"
)


# ---- configuration ---------------------------------------------------------------------------

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


# ---- model -----------------------------------------------------------------------------------

def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Each brick's body is a function of tensors and ints alone, so that ``compile=True`` can hand
# each one to torch.compile while its record_function range stays in eager code around it:
# dynamo drops record_function ranges inside the graphs it captures, and a whole compiled
# forward would be one range with no bricks in it.

def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    # F.rms_norm, as transformers' and torchtune's Llama norms can: one fused kernel on CUDA
    # (and on CUDA-backed brick), its decomposition elsewhere.
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _qkv_projection(x, weight, bias, heads: int, kv_heads: int, head_dim: int):
    t, d = x.shape[1], head_dim
    qkv = F.linear(x, weight, bias)
    q, k, v = qkv.split([heads * d, kv_heads * d, kv_heads * d], dim=-1)
    return (q.view(1, t, heads, d).transpose(1, 2), k.view(1, t, kv_heads, d).transpose(1, 2),
            v.view(1, t, kv_heads, d).transpose(1, 2))


def _rope_embedding(q, k, rope_cos, rope_sin, pos: int):
    t = q.shape[2]
    cos, sin = rope_cos[pos:pos + t], rope_sin[pos:pos + t]
    return q * cos + _rotate_half(q) * sin, k * cos + _rotate_half(k) * sin


def _attention_score(q, k, v, k_cache, v_cache, pos: int):
    t, d = q.shape[2], q.shape[3]
    k_cache[:, :, pos:pos + t] = k  # written at the current position(s)
    v_cache[:, :, pos:pos + t] = v
    group = q.shape[1] // k_cache.shape[1]
    keys = k_cache[:, :, :pos + t].repeat_interleave(group, dim=1)
    scores = torch.matmul(q, keys.transpose(-1, -2)) * (d ** -0.5)
    if t > 1:  # prefill: causal mask over the prompt
        mask = torch.ones(t, pos + t, dtype=torch.bool, device=q.device).tril(pos)
        scores = scores.masked_fill(~mask, float("-inf"))
    return scores


def _attention_softmax(scores):
    return torch.softmax(scores, dim=-1)


def _attention_output(probs, v_cache, pos: int):
    t, heads, d = probs.shape[2], probs.shape[1], v_cache.shape[3]
    values = v_cache[:, :, :pos + t].repeat_interleave(heads // v_cache.shape[1], dim=1)
    return torch.matmul(probs, values).transpose(1, 2).reshape(1, t, heads * d)


def _residual_projection(residual, x, weight):
    return residual + F.linear(x, weight)


def _linear(x, weight):
    return F.linear(x, weight)


def _activation(gate, up):
    return F.silu(gate) * up


_BLOCK_BODIES = {
    "RmsNorm": _rms_norm, "QkvProjection": _qkv_projection, "RopeEmbedding": _rope_embedding,
    "AttentionScore": _attention_score, "AttentionSoftmax": _attention_softmax,
    "AttentionOutput": _attention_output, "OutputProjection": _residual_projection,
    "GateProjection": _linear, "UpProjection": _linear, "Activation": _activation,
    "DownProjection": _residual_projection, "Embedding": F.embedding, "LmHead": _linear,
}


class QwenStyleDecoder(torch.nn.Module):
    """A decoder-only transformer; inference only (weights do not require grad).

    ``compile=True`` runs each brick's body through ``torch.compile`` (Inductor, dynamic
    shapes): the bricks stay, each holding the compiled graph call and its generated kernels.
    Inductor then fuses within a brick but not across bricks."""

    def __init__(self, config: DecodeConfig, device: Union[str, torch.device] = "cpu",
                 compile: bool = False):
        super().__init__()
        c = _check_config(config, "QwenStyleDecoder()")
        device = _check_device(device, "QwenStyleDecoder()")
        check_bool(compile, "compile", "decode demo: QwenStyleDecoder()")
        self.config = c
        self.compiled = compile
        gen = torch.Generator(device="cpu").manual_seed(c.seed)
        h, d, ffn = c.hidden, c.head_dim, c.intermediate_size
        qkv_out = (c.heads + 2 * c.kv_heads) * d

        def param(*shape, std=None, fill=None):
            if fill is not None:
                t = torch.full(shape, float(fill))
            else:
                t = torch.randn(*shape, generator=gen) * (std if std is not None else shape[-1] ** -0.5)
            return torch.nn.Parameter(t.to(device), requires_grad=False)

        self.embed = param(c.vocab, h, std=1.0)
        self.layers = torch.nn.ModuleList()
        for _ in range(c.layers):
            layer = torch.nn.Module()
            layer.input_norm = param(h, fill=1.0)
            layer.qkv_weight = param(qkv_out, h)
            layer.qkv_bias = param(qkv_out, std=0.02)
            layer.o_weight = param(h, c.heads * d)
            layer.post_norm = param(h, fill=1.0)
            layer.gate_weight = param(ffn, h)
            layer.up_weight = param(ffn, h)
            layer.down_weight = param(h, ffn)
            self.layers.append(layer)
        self.final_norm = param(h, fill=1.0)
        self.lm_head = param(c.vocab, h)  # untied from the embedding

        # Rotary tables for every position a decode can reach, and the per-layer KV caches.
        self.max_len = c.prompt_tokens + c.tokens
        inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d))
        angles = torch.outer(torch.arange(self.max_len, dtype=torch.float32), inv_freq)
        angles = torch.cat((angles, angles), dim=-1)
        self.register_buffer("rope_cos", angles.cos().to(device), persistent=False)
        self.register_buffer("rope_sin", angles.sin().to(device), persistent=False)
        self.k_cache = [torch.zeros(1, c.kv_heads, self.max_len, d, device=device) for _ in range(c.layers)]
        self.v_cache = [torch.zeros(1, c.kv_heads, self.max_len, d, device=device) for _ in range(c.layers)]
        # One compiled function per body, shared by the bricks and layers that run it: weights
        # and caches are arguments, so a layer change is no recompile.
        self._bodies = {name: torch.compile(body, dynamic=True) if compile else body
                        for name, body in _BLOCK_BODIES.items()}

    def _brick(self, name: str, *args):
        with record_function(name):
            return self._bodies[name](*args)

    def _attention(self, layer, i: int, residual: torch.Tensor, pos: int) -> torch.Tensor:
        c = self.config
        x = self._brick("RmsNorm", residual, layer.input_norm, c.eps)
        q, k, v = self._brick("QkvProjection", x, layer.qkv_weight, layer.qkv_bias, c.heads,
                              c.kv_heads, c.head_dim)
        q, k = self._brick("RopeEmbedding", q, k, self.rope_cos, self.rope_sin, pos)
        scores = self._brick("AttentionScore", q, k, v, self.k_cache[i], self.v_cache[i], pos)
        probs = self._brick("AttentionSoftmax", scores)
        out = self._brick("AttentionOutput", probs, self.v_cache[i], pos)
        return self._brick("OutputProjection", residual, out, layer.o_weight)

    def _check_inputs(self, ids, pos) -> None:
        # Cheap next to a forward pass; without it a position past the rotary tables fails deep
        # inside as a reshape of an empty slice.
        where = "decode demo: QwenStyleDecoder.forward()"
        if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.shape[0] != 1 \
                or ids.dtype not in (torch.int64, torch.int32):
            shape = f"{ids.dtype} tensor of shape {tuple(ids.shape)}" \
                if isinstance(ids, torch.Tensor) else describe(ids)
            raise TypeError(f"{where}: ids must be an integer tensor of shape [1, T], got {shape}")
        pos = check_int(pos, "pos", where, low=0)
        if pos + ids.shape[1] > self.max_len:
            raise ValueError(
                f"{where}: pos + T must be <= {self.max_len} (prompt_tokens + tokens), got "
                f"pos={pos}, T={ids.shape[1]}")

    def _mlp(self, layer, residual: torch.Tensor) -> torch.Tensor:
        x = self._brick("RmsNorm", residual, layer.post_norm, self.config.eps)
        gate = self._brick("GateProjection", x, layer.gate_weight)
        up = self._brick("UpProjection", x, layer.up_weight)
        act = self._brick("Activation", gate, up)
        return self._brick("DownProjection", residual, act, layer.down_weight)

    def forward(self, ids: torch.Tensor, pos: int, logits: bool = True) -> Optional[torch.Tensor]:
        """``ids`` [1, T] at positions pos..pos+T-1 -> logits [1, vocab] of the last position
        (None with ``logits=False``, as the prefill needs none)."""
        self._check_inputs(ids, pos)
        x = self._brick("Embedding", ids, self.embed)
        for i, layer in enumerate(self.layers):
            x = self._mlp(layer, self._attention(layer, i, x, pos))
        if not logits:
            return None
        x = self._brick("RmsNorm", x[:, -1], self.final_norm, self.config.eps)
        return self._brick("LmHead", x, self.lm_head)


def build_model(config: DecodeConfig, device: Union[str, torch.device] = "brick:0",
                compile: bool = False) -> QwenStyleDecoder:
    """``QwenStyleDecoder(config, device, compile)`` in eval mode."""
    return QwenStyleDecoder(config, device, compile).eval()


# ---- decoding --------------------------------------------------------------------------------

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


# ---- the demo --------------------------------------------------------------------------------

def default_threads() -> int:
    """Kernel threads for a timed decode: half the CPUs this process may run on, at least 1 and
    at most torch's default. An intra-op parallel region waits for its slowest thread, so with a
    thread on every core one core taken by another process stalls every op (run-to-run times
    then swing with the machine's load); with half of them the decode keeps its pace."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # no affinity API (macOS, Windows)
        cpus = os.cpu_count() or 1
    return max(1, min(torch.get_num_threads(), cpus // 2))


def _percentile(values: List[int], q: float) -> float:
    """Linear interpolation between closest ranks (numpy's default)."""
    s = sorted(values)
    k = (len(s) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return float(s[lo] + (s[hi] - s[lo]) * (k - lo))


class _ProgressBar:
    """A one-line bar redrawn with ``\\r``: only where stderr is a terminal (in a log or CI output
    its frames would pile up)."""

    def __init__(self, enabled: bool, phases: int, width: int = 30):
        enabled = enabled and _is_terminal(sys.stderr)
        self.enabled, self.phases, self.width, self.phase, self.label = enabled, phases, width, 0, ""

    def start(self, label: str) -> None:
        self.phase += 1
        self.label = label

    def __call__(self, step: int, total: int, latency_ns: int) -> None:
        if not self.enabled:
            return
        filled = self.width * step // total
        sys.stderr.write(f"\r[{self.phase}/{self.phases}] {self.label:<14} "
                         f"[{'#' * filled}{'.' * (self.width - filled)}] {step}/{total} tokens "
                         f"{latency_ns / 1e6:7.3f} ms/token")
        sys.stderr.flush()

    def close(self) -> None:
        if self.enabled:
            sys.stderr.write("\n")
            sys.stderr.flush()


def _is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):  # replaced by an object without it, or closed
        return False


def run_demo(config: Optional[DecodeConfig] = None, device: Union[str, torch.device] = "brick:0",
             sync_mode: str = "event", runs: int = 5, out_dir: Union[str, os.PathLike] = ".",
             legacy: bool = False, progress: bool = True, legacy_rows: int = 15,
             compile: bool = False) -> dict:
    """Builds the model on ``device``, warms up, profiles ``runs`` decodes with the brick
    registry (the last run's report is kept and written to ``out_dir/report.json``), then runs
    one decode under the legacy autograd profiler for ``out_dir/trace.json`` and its
    ``key_averages()`` table. ``legacy=True`` adds the registry-vs-key_averages comparison.
    ``compile=True`` compiles each brick's body with torch.compile (see
    :class:`QwenStyleDecoder`); the warm-up decode compiles, so no profiled run does."""
    # Every argument is checked before any work (no model built, no folder created).
    where = "run_demo()"
    config = _check_config(DecodeConfig() if config is None else config, where)
    if isinstance(runs, bool) or not isinstance(runs, int):
        raise TypeError(f"decode demo: {where}: runs must be a positive integer, got {describe(runs)}")
    if runs < 1:
        raise ValueError(f"decode demo: {where}: runs must be a positive integer, got {runs!r}")
    mode = bp.SyncMode.parse(sync_mode, arg="sync_mode", where=f"decode demo: {where}")
    device = _check_device(device, where)
    if device.type != "brick":
        raise ValueError(
            f"decode demo: {where}: device must be a brick device such as brick:0, got {device}")
    if device.index is None:
        device = torch.device("brick", torch.brick.current_device())
    out_dir = check_path(out_dir, "out_dir", f"decode demo: {where}")
    check_bool(legacy, "legacy", f"decode demo: {where}")
    check_bool(progress, "progress", f"decode demo: {where}")
    check_bool(compile, "compile", f"decode demo: {where}")
    # As key_averages().table(row_limit=...): a positive count, or <= 0 for every row.
    check_int(legacy_rows, "legacy_rows", f"decode demo: {where}")
    os.makedirs(out_dir, exist_ok=True)

    bar = _ProgressBar(progress, phases=runs + 2)
    try:
        model = build_model(config, device, compile)
        bar.start("warm-up (compiles)" if compile else "warm-up")
        _decode(model, config, device, progress=bar)
        run_means, run_medians, run_denied, prof, result = [], [], [], None, None
        for r in range(runs):
            bar.start(f"run {r + 1}/{runs}")
            prof = bp.profile(sync_mode=mode)
            result = _decode(model, config, device, region=prof, progress=bar)
            run_means.append(result.mean_token_ns)
            run_medians.append(result.median_token_ns)
            run_denied.append(prof.report.machine["denied_share"])
        bar.start("legacy trace")
        legacy_prof = torch.autograd.profiler.profile(use_device="brick")
        legacy_result = _decode(model, config, device, region=QuietProfile(legacy_prof),
                                progress=bar)
    finally:
        bar.close()

    lat = result.token_latencies_ns
    figures = {
        "token_latencies_ns": list(lat),
        "run_mean_token_ns": run_means,
        "run_median_token_ns": run_medians,  # what the stability check compares
        # the share of each run its thread waited for a CPU: a busy machine, not a slow decode
        "run_denied_share": run_denied,
        "tokens_per_s": 1e9 * len(lat) / sum(lat),
        "p50_token_ns": _percentile(lat, 50),
        "p99_token_ns": _percentile(lat, 99),
        "threads": torch.get_num_threads(),  # the kernels' (see default_threads)
    }
    report = prof.report.with_metadata(decode={
        "model": "qwen-style", "layers": config.layers, "hidden": config.hidden,
        "heads": config.heads, "kv_heads": config.kv_heads, "vocab": config.vocab,
        "intermediate": config.intermediate_size, "prompt_tokens": config.prompt_tokens,
        "tokens": config.tokens, "runs": runs, "device": str(device), "compiled": compile,
        **figures,
        "final_token": FINAL_TOKEN_NOTE,
    })
    report_path = report.write_json(os.path.join(out_dir, "report.json"))
    trace_path = bp.export_chrome_trace(legacy_prof, os.path.join(out_dir, "trace.json"))
    bp.clear_timeline()
    key_averages = legacy_prof.key_averages().table(sort_by="self_device_time_total",
                                                    row_limit=legacy_rows)
    return {
        "config": config, "device": str(device), "sync_mode": mode.value, "runs": runs,
        "compiled": compile, "report": report, "report_path": report_path, "trace_path": trace_path,
        "brick_table": report.table(),
        "key_averages_table": key_averages,
        "comparison_table": bp.compare_with_key_averages(legacy_prof, report) if legacy else None,
        "tokens": result.tokens, "legacy_tokens": legacy_result.tokens, "prompt": result.prompt,
        **figures,
    }


_SUMMARY_KEYS = ("config", "device", "runs", "sync_mode", "brick_table", "key_averages_table",
                 "run_mean_token_ns", "tokens_per_s", "p50_token_ns", "p99_token_ns",
                 "report_path", "trace_path")


def format_summary(result: dict) -> str:
    """The text summary of a :func:`run_demo` result."""
    where = "decode demo: format_summary()"
    if not isinstance(result, dict):
        raise TypeError(f"{where}: result must be the dict run_demo() returns, got {describe(result)}")
    missing = [key for key in _SUMMARY_KEYS if key not in result]
    if missing:
        raise ValueError(f"{where}: result must be the dict run_demo() returns; it lacks "
                         f"{', '.join(missing)} (got keys: {', '.join(map(str, result)) or 'none'})")
    if not isinstance(result["config"], DecodeConfig):
        raise TypeError(f"{where}: result['config'] must be a DecodeConfig, "
                        f"got {describe(result['config'])}")
    c = result["config"]
    lines = [
        f"Qwen-style decoder on {result['device']}: {c.layers} layers, hidden {c.hidden}, "
        f"{c.heads} heads / {c.kv_heads} KV heads, vocab {c.vocab}, intermediate {c.intermediate_size}; "
        f"prompt {c.prompt_tokens} tokens (prefill not profiled), {c.tokens} decode steps x "
        f"{result['runs']} profiled runs, sync mode {result['sync_mode']}"
        + (", each brick's body compiled (torch.compile, Inductor)" if result.get("compiled") else "")
        + (f", {result['threads']} kernel thread(s)" if "threads" in result else ""),
        "",
        "brick registry (last run):",
        result["brick_table"],
        "",
        "legacy profiler key_averages() (one decode, top rows):",
        result["key_averages_table"],
    ]
    if result.get("comparison_table"):
        lines += ["", "legacy key_averages vs brick registry:", result["comparison_table"]]
    means = ", ".join(f"{m / 1e6:.3f}" for m in result["run_mean_token_ns"])
    if result.get("run_median_token_ns"):
        means += "; median per run (ms): " + ", ".join(
            f"{m / 1e6:.3f}" for m in result["run_median_token_ns"])
    lines += [
        "",
        f"tokens/s: {result['tokens_per_s']:.1f}; per-token latency p50 {result['p50_token_ns'] / 1e6:.3f} ms, "
        f"p99 {result['p99_token_ns'] / 1e6:.3f} ms; mean per run (ms): {means}",
        f"report: {result['report_path']}",
        f"trace:  {result['trace_path']}",
    ]
    return "\n".join(lines)
