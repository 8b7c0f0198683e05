"""What a kernel set is: products of GGUF weight blocks, read in place, with float activations.

Both sets (C and Numba) implement the same small protocol, so the forward pass in
`localinfer.backends.native` never knows which one runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

# Block types every kernel set runs. Q5_0/Q5_1 are here because llama.cpp's Q4_K_M
# falls back to them for rows whose length is not a multiple of 256 (SmolLM2's 576).
# Each set names what it runs in its `supported_types`; the engine checks a model's
# tensors against the chosen set's.
SUPPORTED_TYPES: frozenset[Q] = frozenset({Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K})

# The C set's: also the low-bit types people download (llama.cpp's Q2_K, Q3_K_M and IQ4_XS
# files; IQ4_NL is where IQ4_XS falls back for rows not a multiple of 256), BF16 and MXFP4
# (gpt-oss's experts, llama.cpp's MXFP4_MOE).
C_TYPES: frozenset[Q] = SUPPORTED_TYPES | {Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.BF16, Q.MXFP4}


# The KV-cache types the attention kernels read, by ggml's names; ids and block sizes are
# gguf's (the runtime's table of every type is localinfer/kvtypes.py).
KV_TYPES: dict[str, Q] = {name: Q[name.upper()] for name in ("f16", "q8_0", "q4_0")}


# A cache whose keys a kernel set keeps tiled (its `tiled_keys`) holds them KEY_TILE
# positions to a tile, so that scores are vector products over positions (native/c/kvcache.c):
#   f16   [head_dim][KEY_TILE] halves, element by element
#   q8_0  per block of 32 values: the KEY_TILE scales (halves), then [8][KEY_TILE][4] int8,
#         four values of a position together (the packed Q8_0 panels' layout, for vpdpbusd)
# A tile is the bytes of KEY_TILE rows, and the cache's n_ctx a multiple of KEY_TILE.
KEY_TILE = 16


def _tile_axes(cache: np.ndarray) -> tuple[tuple[int, ...], int, int]:
    *lead, n_ctx, row = cache.shape
    return tuple(lead), n_ctx // KEY_TILE, row


def kv_rows_of(cache: np.ndarray, kv_type: str, tiled: bool) -> np.ndarray:
    """cache (uint8 [..., n_ctx, row bytes], n_ctx a multiple of KEY_TILE) as rows, one
    position each: the array itself where it is not tiled, else a copy."""
    if not tiled:
        return cache
    lead, n_tiles, row = _tile_axes(cache)
    if kv_type == "f16":
        halves = cache.view(np.uint16).reshape(*lead, n_tiles, row // 2, KEY_TILE)
        return np.ascontiguousarray(np.swapaxes(halves, -1, -2)).view(np.uint8).reshape(cache.shape)
    nb = row // 34
    blocks = cache.reshape(*lead, n_tiles, nb, 544)
    d = np.swapaxes(blocks[..., :32].reshape(*lead, n_tiles, nb, KEY_TILE, 2), -3, -2)  # [.., T, lane, nb, 2]
    q = np.moveaxis(blocks[..., 32:].reshape(*lead, n_tiles, nb, 8, KEY_TILE, 4), -2, -4)  # [.., T, lane, nb, 8, 4]
    rows = np.empty((*lead, n_tiles, KEY_TILE, nb, 34), np.uint8)
    rows[..., :2], rows[..., 2:] = d, q.reshape(*lead, n_tiles, KEY_TILE, nb, 32)
    return rows.reshape(cache.shape)


def kv_tiles_of(rows: np.ndarray, kv_type: str, tiled: bool) -> np.ndarray:
    """The cache's bytes for rows (uint8 [..., n, row bytes], n a multiple of KEY_TILE): the
    inverse of kv_rows_of."""
    if not tiled:
        return rows
    lead, n_tiles, row = _tile_axes(rows)
    if kv_type == "f16":
        halves = rows.view(np.uint16).reshape(*lead, n_tiles, KEY_TILE, row // 2)
        return np.ascontiguousarray(np.swapaxes(halves, -1, -2)).view(np.uint8).reshape(rows.shape)
    nb = row // 34
    blocks = rows.reshape(*lead, n_tiles, KEY_TILE, nb, 34)
    tiles = np.empty((*lead, n_tiles, nb, 544), np.uint8)
    tiles[..., :32] = np.swapaxes(blocks[..., :2], -3, -2).reshape(*lead, n_tiles, nb, 32)
    q = blocks[..., 2:].reshape(*lead, n_tiles, KEY_TILE, nb, 8, 4)
    tiles[..., 32:] = np.moveaxis(q, -4, -2).reshape(*lead, n_tiles, nb, 512)
    return tiles.reshape(rows.shape)


def kv_row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one cached position of one kv head: f16 halves, or ggml's 32-value blocks."""
    block, size = GGML_QUANT_SIZES[KV_TYPES[kv_type]]
    if head_dim % block:
        raise ValueError(f"a {kv_type} KV cache needs a head size that is a multiple of {block}, not {head_dim}")
    return head_dim // block * size


def kv_rotation(kv_type: str, head_dim: int, keys: bool) -> int:
    """The chunk size of the Walsh-Hadamard rotation a cache of this type stores its rows
    in, as llama.cpp chooses it (0: none): quantized types only, head sizes that are a
    multiple of 64; keys in the largest power-of-two chunk dividing the head, values in 64."""
    if kv_type == "f16" or head_dim % 64:
        return 0
    n = 64
    while keys and head_dim % (2 * n) == 0:
        n *= 2
    return n


@dataclass(frozen=True)
class QMatrix:
    """A [rows, cols] weight matrix as GGUF stores it: each row a run of blocks.

    `data` is uint8 [rows, row_bytes], C-contiguous, normally a view into the model's mmap.
    """

    type: Q
    data: np.ndarray
    rows: int
    cols: int

    @classmethod
    def from_array(cls, qtype: Q, data: np.ndarray, cols: int) -> QMatrix:
        """Wrap any array holding `qtype` blocks (gguf's tensor.data, or quantize() output)."""
        block, size = GGML_QUANT_SIZES[qtype]
        if cols % block:
            raise ValueError(f"{qtype.name} rows must be a multiple of {block} values, got {cols}")
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1, cols // block * size)
        return cls(qtype, raw, raw.shape[0], cols)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


@dataclass(frozen=True)
class MoeFFN:
    """A mixture of experts' FFN, as llama.cpp's build_moe_ffn reads it: a router with one
    row per expert, and every expert's gate, up and down matrices stacked in one tensor each
    (the file's [n_expert, rows, cols], so expert e owns rows [e * rows_e, (e + 1) * rows_e):
    views, nothing copied). Each token runs `n_used` experts, chosen by `gating`:
    "softmax_norm" is a softmax over every expert's logit, the n_used largest, their
    weights divided by their sum (qwen3moe); "topk_softmax" takes the n_used largest logits
    and a softmax over those alone (gpt-oss). The biases (gpt-oss's) are float32 [n_expert]
    for the router and [n_expert, rows_e] for the experts."""

    router: QMatrix  # [n_expert, n_embd]
    gate: QMatrix  # [n_expert * n_ff_exp, n_embd]
    up: QMatrix  # [n_expert * n_ff_exp, n_embd]
    down: QMatrix  # [n_expert * n_embd, n_ff_exp]
    n_expert: int
    n_used: int
    gating: str
    activation: str = "swiglu"  # or "geglu", "swiglu_oai" (gpt-oss's clamped SwiGLU)
    router_bias: np.ndarray | None = None
    gate_bias: np.ndarray | None = None
    up_bias: np.ndarray | None = None
    down_bias: np.ndarray | None = None

    def expert(self, m: QMatrix, e: int) -> QMatrix:
        """Expert e's rows of one of the stacked matrices (a view)."""
        rows = m.rows // self.n_expert
        return QMatrix(m.type, m.data[e * rows : (e + 1) * rows], rows, m.cols)


# moe(x, out, n_fast=0): out [n, n_embd] = the experts' FFN of the normed rows x [n, n_embd]
# (float32, C-contiguous), under the matmul contract: every row's result depends on that
# row alone, except that the first n_fast rows may take the products' faster path.
MoeOp = Callable[..., None]


# op(x, outs, n_fast=0): for every matrix i and activation row j, outs[i][j] = mats[i] @ x[j].
# x is float32 [n, cols] C-contiguous; outs[i] is float32 [n, mats[i].rows] C-contiguous,
# written in place. n = 1 is decode; n > 1 is prefill or speculative verification.
# Every row's result depends on that row alone, bit for bit, except that the first n_fast
# rows may take a faster path that rounds differently (AMX tiles for the K-quants in the C
# set; the forward gives it the prompt rows whose logits nobody reads). A set without one
# ignores n_fast.
MatmulOp = Callable[..., None]


@dataclass(frozen=True)
class DecodeLayer:
    """One layer as a fused decode step reads it: its bound products (made by the same
    kernel set's matmul_op), its norms, and what some architectures add (None or 0 where
    the model has none): qwen2's q/k/v biases, per-head q/k norms, gemma3's norms of the
    attention's and the FFN's outputs, and a local layer's sliding window."""

    qkv: MatmulOp
    o: MatmulOp
    gate_up: MatmulOp | None  # None in a mixture of experts' layer, which has `moe`
    down: MatmulOp | None
    attn_norm: np.ndarray
    ffn_norm: np.ndarray
    q_bias: np.ndarray | None
    k_bias: np.ndarray | None
    v_bias: np.ndarray | None
    q_norm: np.ndarray | None = None
    k_norm: np.ndarray | None = None
    post_attn_norm: np.ndarray | None = None
    post_ffn_norm: np.ndarray | None = None
    window: int = 0  # a local layer: attention over the last `window` positions, RoPE from the local tables
    moe: MoeOp | None = None  # a mixture of experts' FFN (moe_op), in place of gate_up and down
    o_bias: np.ndarray | None = None  # the attention output's bias (gpt-oss)
    sinks: np.ndarray | None = None  # each head's attention sink logit (gpt-oss)


@dataclass(frozen=True)
class DecodePlan:
    """What a decode step binds once: the layers, the shapes, the RoPE tables (as `rope`
    takes them; the local layers' apart), the KV cache's types and positions, the FFN's
    activation, and float32 buffers of up to max_rows rows that the step writes (h [rows,
    n_embd], q [rows, n_head * hd], k and v [rows, n_head_kv * hd], attn, o [rows, n_embd],
    gate and up [rows, n_ff])."""

    layers: Sequence[DecodeLayer]
    n_head: int
    n_head_kv: int
    head_dim: int
    eps: float
    scale: float
    cos: np.ndarray
    sin: np.ndarray
    neox: bool
    kv_types: tuple[str, str]
    n_ctx: int
    buffers: dict[str, np.ndarray]
    cos_local: np.ndarray | None = None  # None: the local layers' tables are cos/sin
    sin_local: np.ndarray | None = None
    gelu: bool = False  # GeGLU (gelu's tanh approximation) instead of SwiGLU

    @property
    def max_rows(self) -> int:
        return len(self.buffers["h"])


# step(x, positions, keys, values): n tokens of one sequence (n <= plan.max_rows) through
# every layer, in place on x (float32 [n, n_embd]: their embeddings in, the last layer's
# outputs out), storing their keys and values at `positions` (int32 [n], in order) of that
# sequence's cache (uint8 [n_layer, n_head_kv, n_ctx, row bytes]). The result equals the
# per-operation calls' bit for bit (rms_norm, the products with n_fast = 0, bias adds, norms,
# rope, attention, swiglu or geglu, residual adds, in the forward's order).
DecodeStep = Callable[[np.ndarray, np.ndarray, np.ndarray, np.ndarray], None]


class Kernels(Protocol):
    """A kernel set: products over quantized weights, and the small per-token operations
    of a layer. `matmul_op` binds matrices once, so the per-token call stays cheap.
    All arrays are C-contiguous float32 (positions int32, the KV cache bytes) and owned
    by the caller."""

    name: str  # "c" or "numba"
    tiled_keys: frozenset[str]  # the key cache types it stores in tiles (KEY_TILE)
    supported_types: frozenset[Q]  # the block types matmul_op takes

    def set_threads(self, n: int) -> None: ...

    def matmul_op(self, mats: Sequence[QMatrix]) -> MatmulOp:
        """One call over 1-3 matrices sharing `cols` (q/k/v, gate/up); the C set runs them in one parallel region."""
        ...

    def describe(self) -> str:
        """One line for --verbose and doctor, e.g. 'c (avx2 fma f16c, openmp, 2 threads)'."""
        ...

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        """out[i] = x[i] / sqrt(mean(x[i]^2) + eps) * weight, for x [n, d]."""
        ...

    def rope(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> None:
        """Rotate x [n, heads, head_dim] in place by each row's position; cos/sin are
        [n_ctx, rope_dims/2] tables. neox pairs dim j with j + rope_dims/2, else 2j with 2j+1."""
        ...

    def attention(
        self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, keys: np.ndarray, values: np.ndarray,
        positions: np.ndarray, out: np.ndarray, scale: float, kv_types: tuple[str, str] = ("f16", "f16"), window: int = 0,
        sinks: np.ndarray | None = None, causal: bool = True,
    ) -> None:  # fmt: skip
        """Store k_new/v_new [m, n_head_kv, hd] at `positions` of one sequence's layer cache
        keys/values (uint8 [n_head_kv, n_ctx, kv_row_bytes]: rows of kv_types, KV_TYPES, the
        keys in tiles where the set's `tiled_keys` has their type); then
        causal grouped-query attention of q [m, n_head, hd] over positions [0, pos] (with a
        `window`, over (pos - window, pos] only) into out [m, n_head * hd]. Against f16 keys q is rounded to float16, as llama.cpp's flash
        attention takes it; against quantized keys each head is quantized to q8_0 and the
        scores are integer dot products, as ggml's vec_dot. A quantized cache holds its rows
        rotated as llama.cpp's does (kv_rotation), and the rotation is undone in `out`.
        Query head h reads kv head h // (n_head / n_head_kv). With `sinks` (float32 [n_head],
        gpt-oss), head h's softmax also meets the logit sinks[h], unscaled and with no value
        row, as ggml's flash attention adds it after every position. Not `causal` (an
        encoder's whole sequence in one call; no window): every row attends over positions
        [0, the largest of `positions`], so all of the call's rows see each other."""
        ...

    def layer_norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float, out: np.ndarray) -> None:
        """out[i] = (x[i] - mean) / sqrt(variance + eps) * weight + bias, for x [n, d] (out may
        be x), as ggml_norm, ggml_mul and ggml_add: the mean's sum and the variance's in double."""
        ...

    def add_layer_norm(self, x: np.ndarray, y: np.ndarray, y_bias: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> None:
        """x = layer_norm(x + (y + y_bias)) in place: a post-norm residual (BERT's), y a
        product's output [n, d] and y_bias its bias."""
        ...

    def gelu(self, x: np.ndarray, bias: np.ndarray | None = None) -> None:
        """x = gelu(x + bias) in place, x [n, d], bias [d] or None: GELU's tanh
        approximation as ggml's CPU build evaluates it for floats (geglu's, ungated)."""
        ...

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> None:
        """gate = silu(gate) * up, in place."""
        ...

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> None:
        """gate = gelu(gate) * up, in place: GELU's tanh approximation as ggml's CPU build
        evaluates it (input and result rounded to float16; 0 at or below -10, the input
        itself from 10 up)."""
        ...

    def moe_op(self, ffn: MoeFFN) -> MoeOp:
        """A layer's experts bound once: routing, each chosen expert's products over the rows
        that chose it, and the weighted sum in slot order (llama.cpp's build_moe_ffn)."""
        ...

    def decode_step(self, plan: DecodePlan) -> DecodeStep | None:
        """A step that runs a decode token through every layer in one call, or None where
        this set has none (the forward then calls the operations one by one)."""
        ...
