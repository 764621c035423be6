"""The decode demo's model (:class:`QwenStyleDecoder`, :func:`build_model`): one brick per block.

The model is plain PyTorch: token embedding, RMSNorm, rotary position embedding, grouped-query
attention with a preallocated KV cache, a SwiGLU MLP and an untied LM head, with random weights
from a fixed seed. Each block runs inside a ``record_function`` range, all of them siblings:

    Embedding, RmsNorm (2 per layer + 1 final), QkvProjection, RopeEmbedding, AttentionScore,
    AttentionSoftmax, AttentionOutput, OutputProjection, GateProjection, UpProjection,
    Activation, DownProjection, LmHead, Sampling

(the decode bricks of the contract, :data:`torch_brickdev.tools.contract.DECODE_BRICKS`)
"""

from __future__ import annotations

from typing import Optional, Union

import torch
import torch.nn.functional as F
from torch.profiler import record_function

from torch_brickdev import _compile
from torch_brickdev.argcheck import check_bool, check_int, describe
from torch_brickdev.tools.demo.config import DecodeConfig, _check_config, _check_device


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


# Each brick's body is a function of tensors and ints alone, so that where the whole forward
# cannot be compiled with its ranges kept (a torch before capture_profiler_record_function),
# ``compile=True`` can hand each one to torch.compile while its range stays in eager code.

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

    ``compile=True`` compiles the forward with ``torch.compile`` (Inductor, dynamic shapes) as
    one graph whose ``record_function`` ranges stay bricks, each holding its own generated
    kernels: Inductor fuses within a brick but not across bricks (see ``torch_brickdev._compile``).
    On a torch that cannot keep ranges in compiled code, each brick's body is compiled alone."""

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
        # Compiled, the whole forward is one graph whose record_function ranges stay bricks
        # (torch._dynamo.config.capture_profiler_record_function; brick's Inductor backend
        # keeps each range around its own kernels): one guard check and one graph call per
        # step. A torch that cannot keep them compiles each brick's body on its own instead.
        self._whole_graph = compile and _compile.keeps_ranges()
        self._compiled_forward = torch.compile(self._forward, dynamic=True) \
            if self._whole_graph else None
        # One compiled function per body, shared by the bricks and layers that run it: weights
        # and caches are arguments, so a layer change is no recompile.
        self._bodies = {name: torch.compile(body, dynamic=True)
                        if compile and not self._whole_graph else body
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
        if self._compiled_forward is None:
            return self._forward(ids, pos, logits)
        with torch._dynamo.config.patch(capture_profiler_record_function=True):
            return self._compiled_forward(ids, pos, logits)

    def _forward(self, ids: torch.Tensor, pos: int, logits: bool) -> Optional[torch.Tensor]:
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
