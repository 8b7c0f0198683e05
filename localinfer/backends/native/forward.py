"""The llama-family forward pass, in one file you can read in a sitting (after llama2.c).

Big products go to a kernel set (C or Numba) over the quantized weights; the small
per-token work (norms, RoPE, attention, SwiGLU) is numpy. A batch may hold tokens of
several sequences at any positions: products run over all rows at once, attention runs
per sequence against that sequence's cache.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from localinfer.backends.native.config import ModelConfig
from localinfer.backends.native.kvcache import KVCache
from localinfer.backends.native.weights import Weights
from localinfer_native import Kernels


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    scale = 1.0 / np.sqrt(np.mean(np.square(x), axis=-1, keepdims=True, dtype=np.float32) + eps)
    return (x * scale) * weight


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    """silu(gate) * up, in place in `gate`."""
    denom = np.exp(np.negative(gate))
    denom += 1.0
    np.divide(gate, denom, out=gate)
    gate *= up
    return gate


class Rope:
    """Rotary position embedding: a cos/sin table per position, applied in place."""

    def __init__(self, config: ModelConfig, n_ctx: int, freq_factors: np.ndarray | None) -> None:
        dims = config.rope_dims
        inv_freq = config.rope_base ** (-np.arange(0, dims, 2, dtype=np.float64) / dims)
        if freq_factors is not None:
            inv_freq = inv_freq / freq_factors.astype(np.float64)
        angles = np.outer(np.arange(n_ctx, dtype=np.float64) / config.rope_linear_scale, inv_freq)
        self.cos, self.sin = np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)
        self.dims, self.neox = dims, config.rope_layout == "neox"

    def apply(self, x: np.ndarray, positions: np.ndarray) -> None:
        """x: [n, heads, head_dim], rotated in place by each row's position."""
        cos, sin = self.cos[positions][:, None, :], self.sin[positions][:, None, :]
        if self.neox:
            half = self.dims // 2
            a, b = x[..., :half], x[..., half : self.dims]
        else:
            a, b = x[..., 0 : self.dims : 2], x[..., 1 : self.dims : 2]
        a_cos = a * cos
        a_sin = a * sin
        a[...] = a_cos - b * sin
        b *= cos
        b += a_sin


class Transformer:
    def __init__(self, config: ModelConfig, weights: Weights, kernels: Kernels, n_ctx: int) -> None:
        self.config, self.weights, self.kernels = config, weights, kernels
        self.rope = Rope(config, n_ctx, weights.rope_freq_factors)
        # Bind every product once: q/k/v and gate/up each run as one fused kernel call.
        self.qkv = [kernels.matmul_op([lw.wq, lw.wk, lw.wv]) for lw in weights.layers]
        self.attn_out = [kernels.matmul_op([lw.wo]) for lw in weights.layers]
        self.gate_up = [kernels.matmul_op([lw.w_gate, lw.w_up]) for lw in weights.layers]
        self.down = [kernels.matmul_op([lw.w_down]) for lw in weights.layers]
        self.lm_head = kernels.matmul_op([weights.output])
        self.scale = 1.0 / np.sqrt(config.head_dim)
        self.peak_activation_bytes = 0

    def activation_bytes(self) -> int:
        """The largest working set of one forward call so far (hidden states, scores, logits)."""
        return self.peak_activation_bytes

    def _note_activations(self, n: int, longest: int, n_wanted: int) -> None:
        c = self.config
        per_row = 4 * c.n_embd + 2 * c.n_head * c.head_dim + 2 * c.n_head_kv * c.head_dim + 2 * c.n_ff
        scores = c.n_head * n * longest
        self.peak_activation_bytes = max(self.peak_activation_bytes, 4 * (n * per_row + scores + n_wanted * c.n_vocab))

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        emb = self.weights.token_embd
        return dequantize(emb.data[tokens], emb.type).reshape(len(tokens), emb.cols).astype(np.float32, copy=False)

    def forward(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, want: np.ndarray, cache: KVCache) -> np.ndarray:
        """Run n tokens through every layer; returns logits [n_wanted, n_vocab]."""
        c = self.config
        n = len(tokens)
        groups = [(int(s), np.flatnonzero(seq_ids == s)) for s in np.unique(seq_ids)]
        for seq, rows in groups:
            cache.reserve(seq, positions[rows])
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self._note_activations(n, int(positions.max()) + 1, int(np.count_nonzero(want)))

        x = self.embed(tokens)
        for layer, lw in enumerate(self.weights.layers):
            # Attention block.
            h = rms_norm(x, lw.attn_norm, c.norm_eps)
            q = np.empty((n, q_dim), np.float32)
            k = np.empty((n, kv_dim), np.float32)
            v = np.empty((n, kv_dim), np.float32)
            self.qkv[layer](h, (q, k, v))
            if lw.q_bias is not None:
                q += lw.q_bias
                k += lw.k_bias
                v += lw.v_bias
            q3 = q.reshape(n, c.n_head, c.head_dim)
            k3 = k.reshape(n, c.n_head_kv, c.head_dim)
            self.rope.apply(q3, positions)
            self.rope.apply(k3, positions)
            attn = np.empty((n, q_dim), np.float32)
            for seq, rows in groups:
                keys, values = cache.sequence(seq)
                pos = positions[rows]
                # Round through float16 as llama.cpp's F16 cache does.
                keys[layer][:, pos] = k3[rows].astype(np.float16).transpose(1, 0, 2)
                values[layer][:, pos] = v.reshape(n, c.n_head_kv, c.head_dim)[rows].astype(np.float16).transpose(1, 0, 2)
                attn[rows] = self.attention(q3[rows], keys[layer], values[layer], pos)
            o = np.empty((n, c.n_embd), np.float32)
            self.attn_out[layer](attn, (o,))
            x += o

            # Feed-forward block.
            h = rms_norm(x, lw.ffn_norm, c.norm_eps)
            gate = np.empty((n, c.n_ff), np.float32)
            up = np.empty((n, c.n_ff), np.float32)
            self.gate_up[layer](h, (gate, up))
            down = np.empty((n, c.n_embd), np.float32)
            self.down[layer](swiglu(gate, up), (down,))
            x += down

        out = rms_norm(x[want], self.weights.output_norm, c.norm_eps)
        logits = np.empty((len(out), self.weights.output.rows), np.float32)
        if len(out):
            self.lm_head(np.ascontiguousarray(out), (logits,))
        return logits

    def attention(self, q: np.ndarray, keys: np.ndarray, values: np.ndarray, pos: np.ndarray) -> np.ndarray:
        """Causal grouped-query attention of m query rows over one sequence's cache.

        q: [m, n_head, head_dim]; keys/values: [n_head_kv, n_ctx, head_dim]. Query head h
        reads kv head h // (n_head / n_head_kv), as llama.cpp broadcasts them.
        """
        c = self.config
        m, group = len(q), c.n_head // c.n_head_kv
        t = int(pos.max()) + 1
        qg = q.astype(np.float16).astype(np.float32).reshape(m, c.n_head_kv, group, c.head_dim).transpose(1, 0, 2, 3)
        qg = qg.reshape(c.n_head_kv, m * group, c.head_dim)
        scores = qg @ keys[:, :t].transpose(0, 2, 1)  # [kv_heads, m*group, t]
        scores *= self.scale
        if m > 1 or pos[0] != t - 1:
            future = np.where(np.arange(t)[None, :] > pos[:, None], -np.inf, 0.0).astype(np.float32)  # [m, t]
            scores.reshape(c.n_head_kv, m, group, t)[...] += future[None, :, None, :]
        scores -= scores.max(axis=-1, keepdims=True)
        np.exp(scores, out=scores)
        scores /= scores.sum(axis=-1, keepdims=True)
        out = scores @ values[:, :t]  # [kv_heads, m*group, head_dim]
        return out.reshape(c.n_head_kv, m, group, c.head_dim).transpose(1, 0, 2, 3).reshape(m, c.n_head * c.head_dim)
