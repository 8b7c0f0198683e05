"""The per-token layer operations of the Numba set: RMSNorm, RoPE, attention over the
KV cache, SwiGLU. The same loops as native/c/ops.c, compiled by Numba (cached on disk)."""

from __future__ import annotations

import math

import numpy as np
from numba import njit, prange


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


@njit(cache=True, inline="always")
def _attend_one(q, keys, values, half, pos, out, scale, task, n_head, group, scores):
    i, h = task // n_head, task % n_head
    kvh = h // group
    hd = q.shape[2]
    t = pos[i] + 1
    qh = q[i, h]
    mx = -np.inf
    for j in range(t):
        s = np.float32(0.0)
        for e in range(hd):
            s += qh[e] * half[keys[kvh, j, e]]
        s *= scale
        scores[j] = s
        mx = max(mx, s)
    total = np.float32(0.0)
    for j in range(t):
        scores[j] = np.exp(scores[j] - mx)
        total += scores[j]
    inv = np.float32(1.0) / total
    o = out[i, h * hd : (h + 1) * hd]
    o[:] = 0.0
    for j in range(t):
        p = scores[j] * inv
        for e in range(hd):
            o[e] += p * half[values[kvh, j, e]]


@njit(cache=True)
def _store(k_new, v_new, keys, values, pos):
    m, n_head_kv, hd = k_new.shape
    for i in range(m):
        for h in range(n_head_kv):
            for e in range(hd):
                keys[h, pos[i], e] = k_new[i, h, e]
                values[h, pos[i], e] = v_new[i, h, e]


@njit(cache=True)
def _attention_serial(q, keys, values, half, pos, out, scale, group):
    n_head = q.shape[1]
    scores = np.empty(pos.max() + 1, np.float32)
    for task in range(q.shape[0] * n_head):
        _attend_one(q, keys, values, half, pos, out, scale, task, n_head, group, scores)


@njit(cache=True, parallel=True)
def _attention_parallel(q, keys, values, half, pos, out, scale, group):
    n_head = q.shape[1]
    longest = pos.max() + 1
    for task in prange(q.shape[0] * n_head):
        scores = np.empty(longest, np.float32)
        _attend_one(q, keys, values, half, pos, out, scale, task, n_head, group, scores)


# Every float16 bit pattern as float32: one load decodes a cached key or value.
_HALF = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)


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
        cache = np.zeros((1, 4, 4), np.float16)
        attn = np.empty((1, 8), f32)
        self.attention(q, kv, kv, cache, cache.copy(), np.zeros(1, np.int32), attn, 0.5)
        half = _HALF
        _attention_parallel(q, cache.view(np.uint16), cache.view(np.uint16), half, np.zeros(1, np.int32), attn, f32(0.5), 2)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        _rms_norm(x, weight, np.float32(eps), out)

    def rope(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> None:
        _rope(x, positions, cos, sin, neox)

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> None:
        _swiglu(gate, up)

    def attention(
        self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, keys: np.ndarray, values: np.ndarray,
        positions: np.ndarray, out: np.ndarray, scale: float,
    ) -> None:  # fmt: skip
        if int(positions.max()) >= keys.shape[1] or int(positions.min()) < 0:
            raise ValueError("position outside the KV cache")
        # The cache holds float16 (read through a table); queries are rounded to float16
        # too, as llama.cpp's flash attention takes them.
        keys, values = keys.view(np.uint16), values.view(np.uint16)
        q = q.astype(np.float16).astype(np.float32)
        _store(k_new.astype(np.float16).view(np.uint16), v_new.astype(np.float16).view(np.uint16), keys, values, positions)
        group = q.shape[1] // keys.shape[0]
        work = q.shape[0] * q.shape[1] * (int(positions.max()) + 1) * q.shape[2]
        attend = _attention_parallel if work >= 1 << 18 else _attention_serial  # decode: no thread wake-up
        attend(q, keys, values, _HALF, positions, out, np.float32(scale), group)
