"""BERT's forward pass (arch "bert"), as llama.cpp's llm_build_bert computes it, over a kernel set.

    x = LayerNorm(token_embd[t] + token_types[0] + position_embd[p])
    per layer:
        q, k, v = x W_q + b_q, x W_k + b_k, x W_v + b_v              (no RoPE)
        a = attention of each sequence over all of its own tokens  (not causal, no other sequence)
        x = LayerNorm(x + (a W_o + b_o))                           (post-norm, with a bias)
        x = LayerNorm(x + (gelu(x W_up + b_up) W_down + b_down))
    no final norm: the last layer's rows are the hidden states the runtime pools.
nomic-bert (nomic-embed-text) is the same pass with RoPE on q and k in place of the position
table, one fused q/k/v, a SwiGLU FFN (silu(gate) * up) and no biases but the LayerNorms'.

An encoder keeps nothing between forwards: a batch holds every sequence whole (positions
0..n-1), so attention's keys and values live in one scratch cache as long as the model's
position table, rewritten for each sequence of each layer, in f16 as llama.cpp casts them
for its flash attention. Every row's product, norm and activation depends on that row alone,
and a sequence's attention on that sequence alone, so a sequence's rows come out the same
whatever else shares its forward.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import dequantize

from localinfer.backends.native.config import ModelConfig
from localinfer.backends.native.forward import RopeTables
from localinfer.backends.native.weights import TensorReader
from localinfer.errors import BackendError, InvalidModelFile
from localinfer.modelfile import GGUFInfo
from localinfer_native import Kernels, QMatrix
from localinfer_native.types import KEY_TILE, kv_row_bytes


@dataclass(frozen=True)
class EncoderLayer:
    wq: QMatrix  # [n_head * hd, n_embd]
    wk: QMatrix  # [n_head_kv * hd, n_embd]
    wv: QMatrix
    q_bias: np.ndarray  # float32 [n_head * hd]; zeros where the file has none (x + 0 is x)
    k_bias: np.ndarray  # float32 [n_head_kv * hd]
    v_bias: np.ndarray
    wo: QMatrix  # [n_embd, n_head * hd]
    o_bias: np.ndarray  # float32 [n_embd]
    attn_norm: np.ndarray  # attn_output_norm: float32 [n_embd], weight and bias
    attn_norm_bias: np.ndarray
    w_gate: QMatrix | None  # [n_ff, n_embd]: a SwiGLU FFN's gate (nomic-bert); None: GELU of up alone
    w_up: QMatrix  # [n_ff, n_embd]
    up_bias: np.ndarray  # float32 [n_ff]
    w_down: QMatrix  # [n_embd, n_ff]
    down_bias: np.ndarray  # float32 [n_embd]
    out_norm: np.ndarray  # layer_output_norm: float32 [n_embd], weight and bias
    out_norm_bias: np.ndarray


@dataclass(frozen=True)
class ClassifierHead:
    """A cross-encoder's head over its first token's state h (RoBERTa's classifier, as
    llama.cpp's rank pooling applies it): out(tanh(dense(h))), either part absent where the
    file has none. Small (n_embd squared at most): widened to float32 once, done in numpy."""

    dense: np.ndarray | None  # cls.weight [n_hidden, n_embd]
    dense_bias: np.ndarray | None
    out: np.ndarray | None  # cls.output.weight [n_labels, n_hidden]
    out_bias: np.ndarray | None

    def scores(self, first: np.ndarray) -> np.ndarray:
        """The first label's logit for each row of `first` [n, n_embd]: [n] float32. A row at a
        time, and without BLAS: a score then does not depend on what else shares its batch
        (BLAS sums a matrix's rows in another order than a vector's), and no BLAS thread pool
        wakes to spin beside the kernels' threads (a 768-wide head cost 50 ms a forward so)."""
        return np.array([self._score(row) for row in first], dtype=np.float32)

    def _score(self, h: np.ndarray) -> float:
        if self.dense is not None:
            h = np.tanh((self.dense * h).sum(axis=1) + (0 if self.dense_bias is None else self.dense_bias))
        if self.out is not None:
            h = (self.out * h).sum(axis=1) + (0 if self.out_bias is None else self.out_bias)
        return float(h[0])


def classifier_head(read: TensorReader) -> ClassifierHead | None:
    """The file's classifier head (cls.*), each matrix's shape checked; None where it has none."""
    width = read.config.n_embd
    dense = widened(read, "cls.weight", width)
    hidden = width if dense is None else dense.shape[0]
    out = widened(read, "cls.output.weight", hidden)
    if dense is None and out is None:
        return None
    labels = 0 if out is None else out.shape[0]
    return ClassifierHead(dense, read.vector("cls.bias", hidden, required=False), out, read.vector("cls.output.bias", labels, required=False) if labels else None)


def widened(read: TensorReader, name: str, cols: int) -> np.ndarray | None:
    """A matrix of `cols`-long rows as float32 [rows, cols], whatever type the file keeps it in; None if absent."""
    t = read.tensors.get(name)
    if t is None:
        return None
    rows = t.shape[1] if len(t.shape) > 1 else 1  # llama.cpp's quantizer writes a one-row matrix 1-D
    data = read.raw(t, (cols, rows) if len(t.shape) > 1 else (cols,))
    return np.asarray(dequantize(data, GGMLQuantizationType(t.type)), np.float32).reshape(rows, cols)


@dataclass
class EncoderWeights:
    token_embd: QMatrix  # [n_vocab, n_embd]
    type_row: np.ndarray | None  # float32 [n_embd]: token_types' row 0 (every token is "sentence A")
    positions: np.ndarray | None  # float32 [n_ctx_train, n_embd]: position_embd, widened once; None with RoPE
    norm: np.ndarray  # token_embd_norm: float32 [n_embd], weight and bias
    norm_bias: np.ndarray
    layers: list[EncoderLayer]
    head: ClassifierHead | None  # a cross-encoder's (rank pooling); None: an embedder
    mapped_bytes: int
    _map: mmap.mmap

    @classmethod
    def open(cls, path: Path, info: GGUFInfo, config: ModelConfig, kernels: Kernels) -> EncoderWeights:
        """llama_model_bert's tensors, each shape checked against the config before a kernel
        reads it; a layer tensor the pass would not read is refused (weights.py)."""
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(mm) < info.file_size:
            raise InvalidModelFile(f"{path.name} changed while it was being loaded")
        c, read = config, TensorReader(path, mm, info, config, kernels)
        if c.n_ctx_train <= 0:
            raise InvalidModelFile(f"{path.name} has no {c.architecture}.context_length, the size of its position table")
        layers = [encoder_layer(read, i) for i in range(c.n_layer)]
        read.refuse_unread_layer_tensors()
        types = read.tensors.get("token_types.weight")
        return cls(
            token_embd=read.matrix("token_embd.weight", c.n_embd, c.n_vocab),
            type_row=None if types is None else table(read.matrix("token_types.weight", c.n_embd, max(1, types.shape[-1])))[0].copy(),
            positions=table(read.matrix("position_embd.weight", c.n_embd, c.n_ctx_train)) if c.kind.rope_layout == "none" else None,
            norm=read.vector("token_embd_norm.weight", c.n_embd),
            norm_bias=read.vector("token_embd_norm.bias", c.n_embd),
            layers=layers,
            head=classifier_head(read),
            mapped_bytes=len(mm),
            _map=mm,
        )

    def close(self) -> None:
        try:
            self._map.close()
        except BufferError:  # views outlive us; the map goes with the last (weights.py)
            pass


def table(m: QMatrix) -> np.ndarray:
    """An embedding table's rows as float32 [rows, cols], whatever type the file keeps them in."""
    return np.ascontiguousarray(dequantize(m.data, m.type).reshape(m.rows, m.cols), dtype=np.float32)


def bias(read: TensorReader, name: str, length: int) -> np.ndarray:
    """A product's bias, or zeros where llama.cpp lets the file leave it out."""
    found = read.vector(name, length, required=False)
    return np.zeros(length, np.float32) if found is None else found


def encoder_layer(read: TensorReader, i: int) -> EncoderLayer:
    """Layer i's tensors: q/k/v separate or fused (attn_qkv, split into row ranges)."""
    c, p, matrix, vector = read.config, f"blk.{i}.", read.matrix, read.vector
    q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
    if p + "attn_qkv.weight" in read.tensors:
        wq, wk, wv = read.split(p + "attn_qkv.weight", c.n_embd, (q_dim, kv_dim, kv_dim))
        b = bias(read, p + "attn_qkv.bias", q_dim + 2 * kv_dim)
        bq, bk, bv = b[:q_dim], b[q_dim : q_dim + kv_dim], b[q_dim + kv_dim :]
    else:
        wq, wk, wv = (matrix(p + f"attn_{x}.weight", c.n_embd, rows) for x, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
        bq, bk, bv = (bias(read, p + f"attn_{x}.bias", rows) for x, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
    return EncoderLayer(
        wq=wq, wk=wk, wv=wv, q_bias=bq, k_bias=bk, v_bias=bv,
        wo=matrix(p + "attn_output.weight", q_dim, c.n_embd), o_bias=bias(read, p + "attn_output.bias", c.n_embd),
        attn_norm=vector(p + "attn_output_norm.weight", c.n_embd), attn_norm_bias=vector(p + "attn_output_norm.bias", c.n_embd),
        w_gate=matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff) if c.kind.activation == "silu" else None,
        w_up=matrix(p + "ffn_up.weight", c.n_embd, c.n_ff), up_bias=bias(read, p + "ffn_up.bias", c.n_ff),
        w_down=matrix(p + "ffn_down.weight", c.n_ff, c.n_embd), down_bias=bias(read, p + "ffn_down.bias", c.n_embd),
        out_norm=vector(p + "layer_output_norm.weight", c.n_embd), out_norm_bias=vector(p + "layer_output_norm.bias", c.n_embd),
    )  # fmt: skip


def sequence_runs(positions: np.ndarray, seq_ids: np.ndarray) -> tuple[np.ndarray | None, list[tuple[int, int]]]:
    """The order that puts a batch's rows by sequence, each in position order (None where they
    already are), and each sequence's rows [start, end) in that order. A sequence must be whole
    (positions 0..n-1): an encoder's tokens see every other token of their sequence."""
    order = np.lexsort((positions, seq_ids))
    if (order == np.arange(len(order))).all():
        order = None
    pos, seq = (positions, seq_ids) if order is None else (positions[order], seq_ids[order])
    bounds = [0, *(np.flatnonzero(seq[1:] != seq[:-1]) + 1).tolist(), len(seq)]
    runs = list(zip(bounds[:-1], bounds[1:]))
    for a, b in runs:
        if not np.array_equal(pos[a:b], np.arange(b - a)):
            raise BackendError(f"an encoder takes each sequence whole in one forward: sequence {int(seq[a])} has positions other than 0..{b - a - 1}")
    return order, runs


class EncoderWorkspace:
    """The activation buffers of an n-row forward, kept between calls of the same size."""

    def __init__(self, config: ModelConfig, n: int) -> None:
        c, f32 = config, np.float32
        self.q = np.empty((n, c.n_head * c.head_dim), f32)
        self.k = np.empty((n, c.n_head_kv * c.head_dim), f32)
        self.v = np.empty((n, c.n_head_kv * c.head_dim), f32)
        self.q3, self.k3, self.v3 = (a.reshape(n, -1, c.head_dim) for a in (self.q, self.k, self.v))
        self.attn = np.empty((n, c.n_head * c.head_dim), f32)
        self.o = np.empty((n, c.n_embd), f32)
        self.up = np.empty((n, c.n_ff), f32)
        self.gate = np.empty((n, c.n_ff), f32) if c.kind.activation == "silu" else None
        self.qkv_out, self.o_out = (self.q, self.k, self.v), (self.o,)
        self.up_out = (self.up,) if self.gate is None else (self.gate, self.up)


class Encoder:
    """BERT over a kernel set: the products bound once, a scratch cache for attention."""

    def __init__(self, config: ModelConfig, weights: EncoderWeights, kernels: Kernels) -> None:
        self.config, self.weights, self.kernels = config, weights, kernels
        self.qkv = [kernels.matmul_op([lw.wq, lw.wk, lw.wv]) for lw in weights.layers]
        self.attn_out = [kernels.matmul_op([lw.wo]) for lw in weights.layers]
        self.up = [kernels.matmul_op([lw.w_up] if lw.w_gate is None else [lw.w_gate, lw.w_up]) for lw in weights.layers]
        self.rope = None if config.kind.rope_layout == "none" else RopeTables(config.rope, config.kind.rope_layout == "neox", config.n_ctx_train, None)
        self.down = [kernels.matmul_op([lw.w_down]) for lw in weights.layers]
        n_pos = -(-config.n_ctx_train // KEY_TILE) * KEY_TILE  # the longest sequence, in whole tiles
        shape = (config.n_head_kv, n_pos, kv_row_bytes("f16", config.head_dim))
        self.keys, self.values = np.zeros(shape, np.uint8), np.zeros(shape, np.uint8)  # [n_head_kv, n_pos, row bytes]
        self.peak_activation_bytes = 0
        self._workspaces: dict[int, EncoderWorkspace] = {}
        self._warm_up()

    def _warm_up(self) -> None:
        """Compile (Numba) or touch (C) the encoder's own ops now, not at the first request."""
        x, v = np.ones((1, 8), np.float32), np.ones(8, np.float32)
        self.kernels.layer_norm(x, v, v, 1e-5, x)
        self.kernels.add_layer_norm(x, x.copy(), v, v, v, 1e-5)
        self.kernels.gelu(x, v)

    def workspace(self, n: int) -> EncoderWorkspace:
        ws = self._workspaces.get(n)
        if ws is None:
            if len(self._workspaces) >= 8:  # batches come in many sizes; keep a few
                self._workspaces.clear()
            ws = self._workspaces[n] = EncoderWorkspace(self.config, n)
        c = self.config
        self.peak_activation_bytes = max(self.peak_activation_bytes, 4 * n * (2 * c.n_embd + 2 * c.n_head * c.head_dim + 2 * c.n_head_kv * c.head_dim + c.n_ff))
        return ws

    def embed(self, tokens: np.ndarray, positions: np.ndarray) -> np.ndarray:
        """token + token type 0 + position, in llama.cpp's order of adds: [n, n_embd]."""
        w = self.weights
        if int(positions.max()) >= self.config.n_ctx_train:
            raise BackendError(f"position {int(positions.max())} is past this encoder's {self.config.n_ctx_train} positions")
        emb = w.token_embd
        x = np.require(dequantize(emb.data[tokens], emb.type).reshape(len(tokens), emb.cols), np.float32, ["C", "W"])
        if w.type_row is not None:
            x += w.type_row
        if w.positions is not None:
            x += w.positions[positions]
        return x

    def forward(self, tokens: np.ndarray, positions: np.ndarray, seq_ids: np.ndarray, want: np.ndarray) -> np.ndarray:
        """The last layer's rows [n_wanted, n_embd] of a batch of whole sequences, in batch order."""
        order, runs = sequence_runs(positions, seq_ids)
        if order is not None:
            tokens, positions = tokens[order], positions[order]
        x = self._layers(tokens, np.ascontiguousarray(positions, dtype=np.int32), runs)
        if order is not None:
            x[order] = x.copy()
        return x if want.all() else np.ascontiguousarray(x[want])

    def _layers(self, tokens: np.ndarray, positions: np.ndarray, runs: list[tuple[int, int]]) -> np.ndarray:
        """Every layer over rows grouped by sequence (runs), one operation at a time."""
        k_ops, eps, n = self.kernels, self.config.norm_eps, len(tokens)
        ws = self.workspace(n)
        x = self.embed(tokens, positions)
        k_ops.layer_norm(x, self.weights.norm, self.weights.norm_bias, eps, x)
        for layer, lw in enumerate(self.weights.layers):
            # every row is one nobody samples from: all may take the products' fast path
            self.qkv[layer](x, ws.qkv_out, n)
            ws.q += lw.q_bias
            ws.k += lw.k_bias
            ws.v += lw.v_bias
            if self.rope is not None:
                k_ops.rope(ws.q3, positions, self.rope.cos, self.rope.sin, self.rope.neox)
                k_ops.rope(ws.k3, positions, self.rope.cos, self.rope.sin, self.rope.neox)
            for a, b in runs:  # each sequence sees itself whole and nothing else
                k_ops.attention(ws.q3[a:b], ws.k3[a:b], ws.v3[a:b], self.keys, self.values, positions[a:b], ws.attn[a:b],
                                self.config.attn_scale, causal=False)  # fmt: skip
            self.attn_out[layer](ws.attn, ws.o_out, n)
            k_ops.add_layer_norm(x, ws.o, lw.o_bias, lw.attn_norm, lw.attn_norm_bias, eps)
            self.up[layer](x, ws.up_out, n)
            if ws.gate is None:
                k_ops.gelu(ws.up, lw.up_bias)
            else:  # silu(gate) * up, into gate (nomic-bert's FFN has no biases)
                k_ops.swiglu(ws.gate, ws.up)
            self.down[layer](ws.up if ws.gate is None else ws.gate, ws.o_out, n)
            k_ops.add_layer_norm(x, ws.o, lw.down_bias, lw.out_norm, lw.out_norm_bias, eps)
        return x
