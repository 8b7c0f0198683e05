"""The per-token layer operations of the Numba set: RMSNorm, RoPE, attention over the
KV cache, SwiGLU, and an encoder's LayerNorm and GELU. The same loops as native/c/ops.c
and encoder.c, compiled by Numba (cached on disk)."""

from __future__ import annotations

import functools
import math

import numpy as np
from numba import njit, prange

from localinfer_native.numba_ir import attention_f16_parallel, attention_f16_serial, exp_scores
from localinfer_native.types import KV_TYPES, kv_rotation


@njit(cache=True)
def _rms_norm(x, w, eps, out):
    n, d = x.shape
    for i in range(n):
        ss = 0.0
        for j in range(d):
            ss += np.float64(x[i, j]) * x[i, j]
        scale = np.float32(1.0 / math.sqrt(ss / d + eps))
        for j in range(d):
            out[i, j] = x[i, j] * scale * w[j]


@njit(cache=True, inline="always")
def _layer_norm_row(x, w, b, out, eps):
    """ggml_norm, then times w and plus b (native/c/encoder.c's layer_norm_row); out may be x."""
    d = x.shape[0]
    s = 0.0
    for j in range(d):
        s += np.float64(x[j])
    mean = np.float32(s) / np.float32(d)
    v = 0.0
    for j in range(d):
        c = x[j] - mean
        out[j] = c
        v += np.float64(c * c)
    scale = np.float32(1.0) / np.sqrt(np.float32(v / d) + eps)
    for j in range(d):
        out[j] = out[j] * scale * w[j] + b[j]


@njit(cache=True, parallel=True)
def _layer_norm(x, w, b, eps, out):
    for i in prange(x.shape[0]):
        _layer_norm_row(x[i], w, b, out[i], eps)


@njit(cache=True, parallel=True)
def _add_layer_norm(x, y, y_bias, w, b, eps):
    for i in prange(x.shape[0]):
        for j in range(x.shape[1]):
            x[i, j] += y[i, j] + y_bias[j]
        _layer_norm_row(x[i], w, b, x[i], eps)


@njit(cache=True)
def _rope(x, pos, cos_t, sin_t, neox):
    n, heads, _ = x.shape
    half = cos_t.shape[1]
    for i in range(n):
        p = pos[i]
        for h in range(heads):
            for j in range(half):
                a = j if neox else 2 * j
                b = j + half if neox else 2 * j + 1
                x0, x1 = x[i, h, a], x[i, h, b]
                x[i, h, a] = x0 * cos_t[p, j] - x1 * sin_t[p, j]
                x[i, h, b] = x0 * sin_t[p, j] + x1 * cos_t[p, j]


@njit(cache=True)
def _swiglu(gate, up):
    g, u = gate.ravel(), up.ravel()
    for i in range(g.size):
        g[i] = g[i] / (np.float32(1.0) + np.exp(-g[i])) * u[i]


@njit(cache=True)
def _store(k_new, v_new, keys, values, pos):
    m, n_head_kv, hd = k_new.shape
    for i in range(m):
        for h in range(n_head_kv):
            for e in range(hd):
                keys[h, pos[i], e] = k_new[i, h, e]
                values[h, pos[i], e] = v_new[i, h, e]


# ---- quantized KV rows (ggml's block_q8_0 and block_q4_0; see native/c/kvcache.c) ------
_F16, _Q8_0 = int(KV_TYPES["f16"]), int(KV_TYPES["q8_0"])  # ggml's type ids, as attention() passes them


@njit(cache=True, inline="always")
def _round_away(v):
    """ggml's roundf: half away from zero."""
    a = abs(v)
    t = np.float32(np.int32(a))
    if a - t >= np.float32(0.5):
        t += np.float32(1.0)
    return -t if v < 0 else t


@njit(cache=True)
def _quantize_q8_0(x, qs, d):
    """x [rows, k] -> qs int8 [rows, k] and d [rows, k/32] = amax/127 (before fp16 rounding)."""
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            amax = np.float32(0.0)
            for e in range(32):
                amax = max(amax, abs(x[r, b * 32 + e]))
            db = amax / np.float32(127.0)
            inv = np.float32(1.0) / db if db != 0 else np.float32(0.0)
            d[r, b] = db
            for e in range(32):
                qs[r, b * 32 + e] = np.int8(_round_away(x[r, b * 32 + e] * inv))


@njit(cache=True)
def _quantize_q4_0(x, nib, d):
    """x [rows, k] -> nibbles uint8 [rows, k/2] (block b's byte i: element i low, i+16 high)
    and d [rows, k/32] = the value of largest magnitude / -8, as ggml's quantize_row_q4_0_ref."""
    for r in range(x.shape[0]):
        for b in range(x.shape[1] // 32):
            amax, mx = np.float32(0.0), np.float32(0.0)
            for e in range(32):
                v = x[r, b * 32 + e]
                if abs(v) > amax:
                    amax, mx = abs(v), v
            db = mx / np.float32(-8.0)
            inv = np.float32(1.0) / db if db != 0 else np.float32(0.0)
            d[r, b] = db
            for e in range(16):
                lo = min(15, np.int32(x[r, b * 32 + e] * inv + np.float32(8.5)))
                hi = min(15, np.int32(x[r, b * 32 + e + 16] * inv + np.float32(8.5)))
                nib[r, b * 16 + e] = np.uint8(lo | (hi << 4))


@functools.lru_cache(maxsize=4)
def no_sinks(n_head: int) -> np.ndarray:
    """Sink logits of -inf (no sinks), made once per head count rather than per attention
    call; read-only, like a model's mapped ones, so both run one compiled kernel."""
    a = np.full(n_head, -np.inf, np.float32)
    a.flags.writeable = False
    return a


@functools.lru_cache(maxsize=4)
def hadamard(n: int) -> np.ndarray:
    """The orthonormal Walsh-Hadamard matrix of size n (a power of two), by Sylvester's doubling."""
    h = np.ones((1, 1), np.float32)
    while len(h) < n:
        h = np.block([[h, h], [h, -h]])
    return h / np.float32(np.sqrt(n))


def _rotated(x: np.ndarray, n: int) -> np.ndarray:
    """x times the Walsh-Hadamard matrix, chunk by chunk of n values along its last axis."""
    return (np.ascontiguousarray(x, np.float32).reshape(-1, n) @ hadamard(n)).reshape(x.shape)


def kv_rows(x: np.ndarray, kv_type: str) -> np.ndarray:
    """Rows [..., hd] float32 as the cache stores them: uint8 [..., kv_row_bytes]."""
    hd = x.shape[-1]
    flat = np.ascontiguousarray(x, np.float32).reshape(-1, hd)
    if kv_type == "f16":
        return flat.astype(np.float16).view(np.uint8).reshape(*x.shape[:-1], 2 * hd)
    nb = hd // 32
    d = np.empty((len(flat), nb), np.float32)
    if kv_type == "q8_0":
        q = np.empty((len(flat), hd), np.int8)
        _quantize_q8_0(flat, q, d)
    else:
        q = np.empty((len(flat), hd // 2), np.uint8)
        _quantize_q4_0(flat, q, d)
    blocks = np.concatenate([d.astype(np.float16).view(np.uint8).reshape(-1, nb, 2), q.view(np.uint8).reshape(len(flat), nb, -1)], axis=2)
    return blocks.reshape(*x.shape[:-1], -1)


@njit(cache=True, inline="always")
def _byte_i8(b):
    v = np.int32(b)
    return v - 256 if v > 127 else v


@njit(cache=True, inline="always")
def _half_at(row, off, half):
    return half[np.int32(row[off]) | (np.int32(row[off + 1]) << 8)]


@njit(cache=True, inline="always")
def _score(row, kt, qf, qs, qd, half):
    """One cached key row (bytes) against one query head: floats for f16, q8_0 otherwise."""
    hd = qf.shape[0]
    s = np.float32(0.0)
    if kt == _F16:
        for e in range(hd):
            s += qf[e] * _half_at(row, 2 * e, half)
        return s
    size = 34 if kt == _Q8_0 else 18
    for b in range(hd // 32):
        off = b * size
        isum = 0
        if kt == _Q8_0:
            for e in range(32):
                isum += _byte_i8(row[off + 2 + e]) * np.int32(qs[b * 32 + e])
        else:
            for e in range(16):
                byte = np.int32(row[off + 2 + e])
                isum += ((byte & 15) - 8) * np.int32(qs[b * 32 + e]) + ((byte >> 4) - 8) * np.int32(qs[b * 32 + e + 16])
        s += _half_at(row, off, half) * qd[b] * np.float32(isum)
    return s


@njit(cache=True, inline="always")
def _accumulate(row, vt, p, o, half):
    """o += p * (one cached value row, bytes)."""
    hd = o.shape[0]
    if vt == _F16:
        for e in range(hd):
            o[e] += p * _half_at(row, 2 * e, half)
        return
    size = 34 if vt == _Q8_0 else 18
    for b in range(hd // 32):
        off = b * size
        w = p * _half_at(row, off, half)
        if vt == _Q8_0:
            for e in range(32):
                o[b * 32 + e] += w * np.float32(_byte_i8(row[off + 2 + e]))
        else:
            for e in range(16):
                byte = np.int32(row[off + 2 + e])
                o[b * 32 + e] += w * np.float32((byte & 15) - 8)
                o[b * 32 + e + 16] += w * np.float32((byte >> 4) - 8)


@njit(cache=True, parallel=True)
def _attention_typed(qf, qs, qd, keys, values, kt, vt, half, pos, out, scale, group, window, sinks):
    """Attention over caches of any KV types (rows of bytes), one task per query head; the f16/f16
    cache with a head size that is a multiple of 8 takes numba_ir's vector rows instead."""
    m, n_head, hd = qf.shape
    longest = pos.max() + 1
    for task in prange(m * n_head):
        i, h = task // n_head, task % n_head
        kvh = h // group
        t = pos[i] + 1
        first = t - window if 0 < window < t else 0
        scores = np.empty(longest, np.float32)
        mx = -np.inf
        for j in range(first, t):
            s = _score(keys[kvh, j], kt, qf[i, h], qs[i, h], qd[i, h], half) * scale
            scores[j - first] = s
            mx = max(mx, s)
        inv = exp_scores(scores, t - first, mx, sinks[h])
        o = out[i, h * hd : (h + 1) * hd]
        o[:] = 0.0
        for j in range(first, t):
            _accumulate(values[kvh, j], vt, scores[j - first] * inv, o, half)


# Every float16 bit pattern as float32: one load decodes a cached key or value.
_HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


def _gelu_table() -> np.ndarray:
    """GELU (tanh approximation) of every float16 value, rounded to float16, as float32: ggml's
    table. Its tanhf is libm's, which rounds about correctly: tanh in float64 rounded to
    float32 stands for it (numpy's own float32 tanh put 0.6 % of the entries a float16 step
    off, where 1 + tanh cancels)."""
    f32 = np.float32
    with np.errstate(all="ignore"):  # NaN and infinity patterns: never looked up (|x| < 10 only)
        h = _HALF
        t = np.tanh((f32(0.7978845608028654) * h * (f32(1) + f32(0.044715) * h * h)).astype(np.float64)).astype(f32)
        g = f32(0.5) * h * (f32(1) + t)
    return g.astype(np.float16).astype(np.float32)


_GELU = _gelu_table()


def _gelu(x: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32: 0 at or below -10, x from 10 up, else ggml's table at x rounded to float16."""
    g = _GELU[x.astype(np.float16).view(np.uint16)]
    return np.where(x <= -10.0, np.float32(0), np.where(x >= 10.0, x, g))


class NumbaOps:
    """Mixed into NumbaKernels."""

    def warm_up(self) -> None:
        """Compile (or load from Numba's cache) every op now, at load time, on tiny arrays of
        the types the forward pass uses: the first token should not pay for it, and the
        memory the compiler takes is a load-time cost, not the model's."""
        f32 = np.float32
        x, out = np.ones((1, 8), f32), np.empty((1, 8), f32)
        self.rms_norm(x, np.ones(8, f32), 1e-5, out)
        self.swiglu(x, out)
        q, kv = np.ones((1, 2, 4), f32), np.ones((1, 1, 4), f32)
        table = np.ones((4, 2), f32)
        for neox in (False, True):
            self.rope(q, np.zeros(1, np.int32), table, table, neox)
        attn, pos = np.empty((1, 8), f32), np.zeros(1, np.int32)
        cache = np.zeros((1, 4, 8), np.uint8)
        self.attention(q, kv, kv, cache, cache.copy(), pos, attn, 0.5)  # the typed path: 4 is no multiple of 8
        q, kv, attn = np.ones((1, 2, 8), f32), np.ones((1, 1, 8), f32), np.empty((1, 16), f32)
        cache = np.zeros((1, 4, 16), np.uint8)
        self.attention(q, kv, kv, cache, cache.copy(), pos, attn, 0.5)
        attention_f16_parallel(q, cache.view(np.uint16), cache.view(np.uint16), pos, attn, f32(0.5), 2, 0, no_sinks(2))
        q, kv = np.ones((1, 2, 32), f32), np.ones((1, 1, 32), f32)
        self.attention(q, kv, kv, np.zeros((1, 4, 34), np.uint8), np.zeros((1, 4, 18), np.uint8), pos, np.empty((1, 64), f32), 0.5, ("q8_0", "q4_0"))

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        _rms_norm(x, weight, np.float32(eps), out)

    def rope(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> None:
        _rope(x, positions, cos, sin, neox)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> None:
        _swiglu(gate, up)

    def layer_norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float, out: np.ndarray) -> None:
        _layer_norm(x, weight, bias, np.float32(eps), out)

    def add_layer_norm(self, x: np.ndarray, y: np.ndarray, y_bias: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> None:
        _add_layer_norm(x, y, y_bias, weight, bias, np.float32(eps))

    def gelu(self, x: np.ndarray, bias: np.ndarray | None = None) -> None:
        if bias is not None:
            x += bias
        x[...] = _gelu(x)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> None:
        gate[...] = _gelu(gate) * up

    def attention(
        self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, keys: np.ndarray, values: np.ndarray,
        positions: np.ndarray, out: np.ndarray, scale: float, kv_types: tuple[str, str] = ("f16", "f16"), window: int = 0,
        sinks: np.ndarray | None = None, causal: bool = True,
    ) -> None:  # fmt: skip
        if int(positions.max()) >= keys.shape[1] or int(positions.min()) < 0:
            raise ValueError("position outside the KV cache")
        assert causal or not window
        group = q.shape[1] // keys.shape[0]
        sinks = no_sinks(q.shape[1]) if sinks is None else sinks
        # the last position each row sees: its own, or (not causal) the call's last
        seen = positions if causal else np.full(len(positions), positions.max(), np.int32)
        if kv_types != ("f16", "f16") or q.shape[2] % 8:
            self._attention_typed(q, k_new, v_new, keys, values, positions, seen, out, scale, kv_types, window, sinks)
            return
        # The cache holds float16; queries are rounded to float16 too, as llama.cpp's flash
        # attention takes them.
        keys, values = keys.view(np.uint16), values.view(np.uint16)
        q = q.astype(np.float16).astype(np.float32)
        _store(k_new.astype(np.float16).view(np.uint16), v_new.astype(np.float16).view(np.uint16), keys, values, positions)
        work = q.shape[0] * q.shape[1] * (int(positions.max()) + 1) * q.shape[2]
        attend = attention_f16_parallel if work >= 1 << 18 else attention_f16_serial  # decode: no thread wake-up
        attend(q, keys, values, seen, out, np.float32(scale), group, window, sinks)

    def _attention_typed(
        self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, keys: np.ndarray, values: np.ndarray,
        positions: np.ndarray, seen: np.ndarray, out: np.ndarray, scale: float, kv_types: tuple[str, str], window: int, sinks: np.ndarray,
    ) -> None:  # fmt: skip
        """A quantized K or V: rows stored rotated (kv_rotation) as ggml's blocks, q rotated
        likewise and quantized to q8_0 for quantized K, the output rotated back."""
        m, n_head, hd = q.shape
        rot_k, rot_v = kv_rotation(kv_types[0], hd, True), kv_rotation(kv_types[1], hd, False)
        if rot_k:
            q, k_new = _rotated(q, rot_k), _rotated(k_new, rot_k)
        keys[:, positions] = kv_rows(k_new, kv_types[0]).transpose(1, 0, 2)
        values[:, positions] = kv_rows(_rotated(v_new, rot_v) if rot_v else v_new, kv_types[1]).transpose(1, 0, 2)
        if kv_types[0] == "f16":
            qf = q.astype(np.float16).astype(np.float32)
            qs, qd = np.zeros((m, n_head, hd), np.int8), np.zeros((m, n_head, hd // 32), np.float32)
        else:
            qf = np.ascontiguousarray(q, np.float32)
            qs, qd = np.empty((m * n_head, hd), np.int8), np.empty((m * n_head, hd // 32), np.float32)
            _quantize_q8_0(qf.reshape(-1, hd), qs, qd)
            qs, qd = qs.reshape(m, n_head, hd), qd.astype(np.float16).astype(np.float32).reshape(m, n_head, -1)
        kt, vt = int(KV_TYPES[kv_types[0]]), int(KV_TYPES[kv_types[1]])
        _attention_typed(qf, qs, qd, keys, values, kt, vt, _HALF, seen, out, np.float32(scale), q.shape[1] // keys.shape[0], window, sinks)
        if rot_v:
            out[...] = _rotated(out, rot_v)
