"""The llama-family forward pass, in one file you can read in a sitting (after llama2.c).

Every step is a kernel call (C or Numba, the same protocol): products over the quantized
weights, and the small per-token operations (RMSNorm, RoPE, attention, SwiGLU), which
cost more than the products when numpy runs them as a dozen calls each. A batch may hold
tokens of several sequences at any positions: products run over all rows at once,
attention runs per sequence against that sequence's cache. A few rows of one sequence (a
decode token, a speculative verify, a draft's catch-up) run through the kernel set's fused
decode step where it has one: the same operations in the same order, every layer in one call.
A mixture of experts' layer (qwen3moe) calls its kernel set's moe_op in place of gate/up and down.
"""

from __future__ import annotations

import math

import numpy as np
from gguf.quants import dequantize

from localinfer.backends.native.config import ModelConfig, Rope
from localinfer.backends.native.kvcache import KVCache
from localinfer.backends.native.weights import Weights
from localinfer_native import Kernels
from localinfer_native.types import DecodeLayer, DecodePlan


class RopeTables:
    """Rotary position embedding: cos/sin tables per position, applied by the kernels."""

    def __init__(self, rope: Rope, neox: bool, n_ctx: int, freq_factors: np.ndarray | None) -> None:
        # The angles are built as ggml builds them, in float32: theta_i = p * base^(-2i/d),
        # one multiplication by base^(-2/d) per pair. In float64 they would be a hair more
        # exact, and a hair away from llama.cpp's.
        half = rope.dims // 2
        theta_scale = np.float32(rope.base) ** np.float32(-2.0 / rope.dims)
        steps = np.full((n_ctx, half), theta_scale, dtype=np.float32)
        steps[:, 0] = np.arange(n_ctx, dtype=np.float32) / np.float32(rope.linear_scale)
        angles = np.cumprod(steps, axis=1, dtype=np.float32)
        if freq_factors is not None:
            angles /= freq_factors.astype(np.float32)
        if rope.yarn_factor:
            angles = yarn_angles(angles, rope)
        mscale = np.float32(rope.attn_factor)
        self.cos, self.sin = np.cos(angles) * mscale, np.sin(angles) * mscale
        self.neox = neox


def yarn_angles(extrap: np.ndarray, rope: Rope) -> np.ndarray:
    """YaRN's angles from the plain ones [n_ctx, dims/2], as ggml's rope_yarn: pair i keeps
    its angle below the correction range (short wavelengths), takes it divided by the
    factor above it (long ones), and a linear ramp between (ext_factor 1, beta_fast 32,
    beta_slow 1, ggml_rope_yarn_corr_dims), in float32."""
    f32, d = np.float32, rope.dims

    def corr_dim(beta: float) -> np.float32:
        return f32(d) * np.log(f32(rope.yarn_orig_ctx) / (f32(beta) * f32(2) * f32(math.pi))) / (f32(2) * np.log(f32(rope.base)))

    low, high = max(f32(0), np.floor(corr_dim(32.0))), min(f32(d - 1), np.ceil(corr_dim(1.0)))
    pair = np.arange(d // 2, dtype=np.float32)  # ggml's i0 / 2
    ramp = f32(1) - np.clip((pair - low) / max(f32(0.001), high - low), f32(0), f32(1))
    interp = f32(1.0 / rope.yarn_factor) * extrap
    return interp * (f32(1) - ramp) + extrap * ramp


def rope_factors(config: ModelConfig, weights: Weights, n_ctx: int) -> np.ndarray | None:
    """The frequency divisors for a context of n_ctx: phi3's long ones where the context,
    padded to 256 as llama.cpp pads it, passes the original one; else the file's others."""
    if weights.rope_factors_long is not None and -(-n_ctx // 256) * 256 > config.n_ctx_orig:
        return weights.rope_factors_long
    return weights.rope_freq_factors


class Workspace:
    """The activation buffers of an n-row forward, kept between calls: decode runs n = 1
    thousands of times, and the same arrays mean no allocation and (in the C set) no new
    ctypes pointers per call."""

    def __init__(self, config: ModelConfig, n: int) -> None:
        c = config
        f32 = np.float32
        self.h = np.empty((n, c.n_embd), f32)
        self.q = np.empty((n, c.n_head * c.head_dim), f32)
        self.k = np.empty((n, c.n_head_kv * c.head_dim), f32)
        self.v = np.empty((n, c.n_head_kv * c.head_dim), f32)
        self.q3 = self.q.reshape(n, c.n_head, c.head_dim)
        self.k3 = self.k.reshape(n, c.n_head_kv, c.head_dim)
        self.q_heads = self.q.reshape(n * c.n_head, c.head_dim)  # one row a head, for per-head norms
        self.k_heads = self.k.reshape(n * c.n_head_kv, c.head_dim)
        self.v3 = self.v.reshape(n, c.n_head_kv, c.head_dim)
        self.attn = np.empty((n, c.n_head * c.head_dim), f32)
        self.o = np.empty((n, c.n_embd), f32)
        n_ff = 0 if c.n_expert else c.n_ff  # a mixture of experts keeps its own (moe_op)
        self.gate = np.empty((n, n_ff), f32)
        self.up = np.empty((n, n_ff), f32)
        self.qkv_out = (self.q, self.k, self.v)
        self.o_out = (self.o,)
        self.gate_up_out = (self.gate, self.up)


# The most rows of one sequence the fused decode step takes: a speculative verify's K + 1;
# more rows are a prefill chunk, whose products gain from the kernels' fast path.
FUSED_ROWS = 16


class Transformer:
    def __init__(self, config: ModelConfig, weights: Weights, kernels: Kernels, cache: KVCache) -> None:
        self.config, self.weights, self.kernels, self.cache = config, weights, kernels, cache
        neox = config.kind.rope_layout == "neox"
        self.rope = RopeTables(config.rope, neox, cache.n_ctx, rope_factors(config, weights, cache.n_ctx))
        self.rope_local = RopeTables(config.rope_local, neox, cache.n_ctx, None) if config.window else self.rope
        self.windows = [config.window if local else 0 for local in config.local_layers]  # per layer; 0: global
        # Bind every product once: q/k/v and gate/up each run as one fused kernel call.
        self.qkv = [kernels.matmul_op([lw.wq, lw.wk, lw.wv]) for lw in weights.layers]
        self.attn_out = [kernels.matmul_op([lw.wo]) for lw in weights.layers]
        # A mixture of experts' layer binds each expert's products in its place (None here).
        self.gate_up = [kernels.matmul_op([lw.w_gate, lw.w_up]) if lw.moe is None else None for lw in weights.layers]
        self.down = [kernels.matmul_op([lw.w_down]) if lw.moe is None else None for lw in weights.layers]
        self.experts = [kernels.moe_op(lw.moe) if lw.moe is not None else None for lw in weights.layers]
        self.lm_head = kernels.matmul_op([weights.output])
        self.scale = config.attn_scale
        self.peak_activation_bytes = 0  # the largest working set of one forward call so far
        self._workspaces: dict[int, Workspace] = {}
        self.decode_step = kernels.decode_step(self._decode_plan())  # None: the operations one by one

    def _decode_plan(self) -> DecodePlan:
        """Every layer and shape a fused decode step binds, with buffers of its own."""
        c, rope, ws = self.config, self.rope, Workspace(self.config, FUSED_ROWS)
        layers = [
            DecodeLayer(self.qkv[i], self.attn_out[i], self.gate_up[i], self.down[i], lw.attn_norm, lw.ffn_norm, lw.q_bias, lw.k_bias, lw.v_bias,
                        lw.q_norm, lw.k_norm, lw.post_attn_norm, lw.post_ffn_norm, self.windows[i], self.experts[i], lw.o_bias, lw.sinks)
            for i, lw in enumerate(self.weights.layers)
        ]  # fmt: skip
        buffers = {name: getattr(ws, name) for name in ("h", "q", "k", "v", "attn", "o", "gate", "up")}
        return DecodePlan(layers, c.n_head, c.n_head_kv, c.head_dim, c.norm_eps, self.scale, rope.cos, rope.sin, rope.neox, self.cache.types, self.cache.capacity, buffers,
                          self.rope_local.cos, self.rope_local.sin, c.kind.activation == "gelu")  # fmt: skip

    def workspace(self, n: int) -> Workspace:
        ws = self._workspaces.get(n)
        if ws is None:
            if len(self._workspaces) >= 8:  # prefill chunks come in many sizes; keep a few
                self._workspaces.clear()
            ws = self._workspaces[n] = Workspace(self.config, n)
        return ws

    def _note_activations(self, n: int, longest: int, n_wanted: int) -> None:
        c = self.config
        # a mixture of experts: router logits, an expert's gate/up and its rows in and out, each slot's output
        ffn = 2 * c.n_ff_exp + c.n_expert + (c.n_expert_used + 2) * c.n_embd if c.n_expert else 2 * c.n_ff
        per_row = 4 * c.n_embd + 2 * c.n_head * c.head_dim + 2 * c.n_head_kv * c.head_dim + ffn
        scores = c.n_head * n * longest
        self.peak_activation_bytes = max(self.peak_activation_bytes, 4 * (n * per_row + scores + n_wanted * c.n_vocab))

    def embed(self, tokens: np.ndarray) -> np.ndarray:
        emb = self.weights.token_embd
        x = dequantize(emb.data[tokens], emb.type).reshape(len(tokens), emb.cols).astype(np.float32, copy=False)
        if self.config.kind.embed_scale:
            x *= np.float32(np.sqrt(np.float32(self.config.n_embd)))  # gemma: ggml_scale by sqrtf(n_embd)
        return x

    def forward(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, want: np.ndarray, hidden: bool = False) -> np.ndarray:
        """Run n tokens through every layer; returns logits [n_wanted, n_vocab], or with
        `hidden` the final-norm hidden states [n_wanted, n_embd] (for embeddings)."""
        if self.decode_step is not None and len(tokens) <= FUSED_ROWS and (seq_ids == seq_ids[0]).all():
            x = self._decode(tokens, positions, int(seq_ids[0]), want)
        else:
            x = self._layers(tokens, positions, seq_ids, want)
        out = np.empty_like(x)
        self.kernels.rms_norm(x, self.weights.output_norm, self.config.norm_eps, out)
        if hidden:
            return out
        logits = np.empty((len(out), self.weights.output.rows), np.float32)
        if len(out):
            self.lm_head(out, (logits,))
        cap = np.float32(self.config.logit_softcap)
        if cap:
            np.multiply(np.tanh(logits * (np.float32(1) / cap)), cap, out=logits)  # as ggml: scale, tanh, scale
        return logits

    def _decode(self, tokens: np.ndarray, positions: np.ndarray, seq: int, want: np.ndarray) -> np.ndarray:
        """A few tokens of one sequence through the fused step, all layers in one call; the
        last layer's output for the rows that want logits."""
        cache = self.cache
        cache.reserve(seq, positions)
        self._note_activations(len(tokens), int(positions.max()) + 1, int(np.count_nonzero(want)))
        x = self.embed(tokens)
        keys, values = cache.sequence(seq)
        self.decode_step(x, np.ascontiguousarray(positions, dtype=np.int32), keys, values)
        return x if want.all() else np.ascontiguousarray(x[want])

    def _layers(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, want: np.ndarray) -> np.ndarray:
        """Every layer, one operation at a time; returns the last layer's output for the rows
        that want logits [n_wanted, n_embd], in their order."""
        # Rows whose logits nobody reads (prompt rows) go first and may take the kernels'
        # fast path (n_fast), which rounds differently; every row that makes logits takes
        # the row-by-row path, so a speculative verify still equals decoding bit for bit.
        # The order within each sequence, and of the wanted rows, stays as it was.
        n_fast = len(want) - int(np.count_nonzero(want))
        if n_fast and want[:n_fast].any():
            order = np.argsort(want, kind="stable")
            tokens, positions, seq_ids, want = tokens[order], positions[order], seq_ids[order], want[order]
        c, cache = self.config, self.cache
        n = len(tokens)
        seqs = np.unique(seq_ids)
        groups = [(int(seqs[0]), None)] if len(seqs) == 1 else [(int(s), np.flatnonzero(seq_ids == s)) for s in seqs]
        for seq, rows in groups:
            cache.reserve(seq, positions if rows is None else positions[rows])
        q_dim = c.n_head * c.head_dim
        self._note_activations(n, int(positions.max()) + 1, int(np.count_nonzero(want)))

        k_ops, eps = self.kernels, c.norm_eps
        activation = k_ops.geglu if c.kind.activation == "gelu" else k_ops.swiglu
        ws = self.workspace(n)
        h, q3, k3, v3, attn = ws.h, ws.q3, ws.k3, ws.v3, ws.attn
        x = self.embed(tokens)
        for layer, lw in enumerate(self.weights.layers):
            # Attention block.
            k_ops.rms_norm(x, lw.attn_norm, eps, h)
            self.qkv[layer](h, ws.qkv_out, n_fast)
            if lw.q_bias is not None:
                ws.q += lw.q_bias
                ws.k += lw.k_bias
                ws.v += lw.v_bias
            if lw.q_norm is not None:
                k_ops.rms_norm(ws.q_heads, lw.q_norm, eps, ws.q_heads)
                k_ops.rms_norm(ws.k_heads, lw.k_norm, eps, ws.k_heads)
            window = self.windows[layer]
            rope = self.rope_local if window else self.rope
            k_ops.rope(q3, positions, rope.cos, rope.sin, rope.neox)
            k_ops.rope(k3, positions, rope.cos, rope.sin, rope.neox)
            for seq, rows in groups:
                keys, values = cache.layers(seq)
                if rows is None:  # the whole batch is one sequence
                    k_ops.attention(q3, k3, v3, keys[layer], values[layer], positions, attn, self.scale, cache.types, window, lw.sinks)
                else:
                    part = np.empty((len(rows), q_dim), np.float32)
                    k_ops.attention(q3[rows], k3[rows], v3[rows], keys[layer], values[layer], positions[rows], part, self.scale, cache.types, window, lw.sinks)
                    attn[rows] = part
            self.attn_out[layer](attn, ws.o_out, n_fast)
            if lw.o_bias is not None:
                ws.o += lw.o_bias
            if lw.post_attn_norm is not None:
                k_ops.rms_norm(ws.o, lw.post_attn_norm, eps, ws.o)
            x += ws.o

            # Feed-forward block.
            k_ops.rms_norm(x, lw.ffn_norm, eps, h)
            if self.experts[layer] is not None:
                self.experts[layer](h, ws.o, n_fast)
            else:
                self.gate_up[layer](h, ws.gate_up_out, n_fast)
                activation(ws.gate, ws.up)
                self.down[layer](ws.gate, ws.o_out, n_fast)
            if lw.post_ffn_norm is not None:
                k_ops.rms_norm(ws.o, lw.post_ffn_norm, eps, ws.o)
            x += ws.o
        return x if want.all() else np.ascontiguousarray(x[want])
