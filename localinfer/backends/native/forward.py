"""The llama-family forward pass, in one file you can read in a sitting (after llama2.c).

Every step is a kernel call (C or Numba, the same protocol): products over the quantized
weights, and the small per-token operations (RMSNorm, RoPE, attention, SwiGLU), which
cost more than the products when numpy runs them as a dozen calls each. A batch may hold
tokens of several sequences at any positions: products run over all rows at once,
attention runs per sequence against that sequence's cache.
"""

from __future__ import annotations

import numpy as np
from gguf.quants import dequantize

from localinfer.backends.native.config import ModelConfig
from localinfer.backends.native.kvcache import KVCache
from localinfer.backends.native.weights import Weights
from localinfer_native import Kernels


class Rope:
    """Rotary position embedding: cos/sin tables per position, applied by the kernels."""

    def __init__(self, config: ModelConfig, n_ctx: int, freq_factors: np.ndarray | None) -> None:
        # The angles are built as ggml builds them, in float32: theta_i = p * base^(-2i/d),
        # one multiplication by base^(-2/d) per pair. In float64 they would be a hair more
        # exact, and a hair away from llama.cpp's.
        half = config.rope_dims // 2
        theta_scale = np.float32(config.rope_base) ** np.float32(-2.0 / config.rope_dims)
        steps = np.full((n_ctx, half), theta_scale, dtype=np.float32)
        steps[:, 0] = np.arange(n_ctx, dtype=np.float32) / np.float32(config.rope_linear_scale)
        angles = np.cumprod(steps, axis=1, dtype=np.float32)
        if freq_factors is not None:
            angles /= freq_factors.astype(np.float32)
        self.cos, self.sin = np.cos(angles), np.sin(angles)
        self.neox = config.rope_layout == "neox"


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
        seqs = np.unique(seq_ids)
        groups = [(int(seqs[0]), None)] if len(seqs) == 1 else [(int(s), np.flatnonzero(seq_ids == s)) for s in seqs]
        for seq, rows in groups:
            cache.reserve(seq, positions if rows is None else positions[rows])
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        self._note_activations(n, int(positions.max()) + 1, int(np.count_nonzero(want)))

        k_ops, rope, eps = self.kernels, self.rope, c.norm_eps
        x = self.embed(tokens)
        h = np.empty_like(x)
        for layer, lw in enumerate(self.weights.layers):
            # Attention block.
            k_ops.rms_norm(x, lw.attn_norm, eps, h)
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
            v3 = v.reshape(n, c.n_head_kv, c.head_dim)
            k_ops.rope(q3, positions, rope.cos, rope.sin, rope.neox)
            k_ops.rope(k3, positions, rope.cos, rope.sin, rope.neox)
            attn = np.empty((n, q_dim), np.float32)
            for seq, rows in groups:
                keys, values = cache.sequence(seq)
                if rows is None:  # the whole batch is one sequence
                    k_ops.attention(q3, k3, v3, keys[layer], values[layer], positions, attn, self.scale)
                else:
                    part = np.empty((len(rows), q_dim), np.float32)
                    k_ops.attention(q3[rows], k3[rows], v3[rows], keys[layer], values[layer], positions[rows], part, self.scale)
                    attn[rows] = part
            o = np.empty((n, c.n_embd), np.float32)
            self.attn_out[layer](attn, (o,))
            x += o

            # Feed-forward block.
            k_ops.rms_norm(x, lw.ffn_norm, eps, h)
            gate = np.empty((n, c.n_ff), np.float32)
            up = np.empty((n, c.n_ff), np.float32)
            self.gate_up[layer](h, (gate, up))
            k_ops.swiglu(gate, up)
            down = np.empty((n, c.n_embd), np.float32)
            self.down[layer](gate, (down,))
            x += down

        final = x if want.all() else np.ascontiguousarray(x[want])
        out = np.empty_like(final)
        k_ops.rms_norm(final, self.weights.output_norm, eps, out)
        logits = np.empty((len(out), self.weights.output.rows), np.float32)
        if len(out):
            self.lm_head(out, (logits,))
        return logits
