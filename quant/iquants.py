"""Reference codecs for ggml's non-linear 4-bit types: IQ4_NL (32-element blocks) and IQ4_XS
(256-element super-blocks of eight 32-element sub-blocks).

Both map each value to one of 16 fixed levels (``kvalues_iq4nl``) times a scale.
Quantization reproduces what ``llama_model_quantize`` runs without an importance matrix,
``quantize_iq4_nl`` / ``quantize_iq4_xs(src, dst, nrow, n_per_row, NULL)``, which both call
``quantize_row_iq4_nl_impl(..., quant_weights=NULL, ntry=7)``:

* per 32-element (sub-)block, weights ``x^2``; a first scale ``max/127`` (``max`` the value of
  largest magnitude), then 15 trial inverse scales ``(itry - 127)/max``, itry = -7..7, each
  giving the least-squares scale ``sum w*q*x / sum w*q*q`` over the nearest levels
  (``best_index_int8``); the trial with the largest ``sumqx^2/sumq2`` wins;
* IQ4_NL: the float16 of that scale, and the levels re-picked with ``1/scale`` (float32);
* IQ4_XS: ``d = -max_scale/32`` over the eight sub-blocks, 6-bit signed sub-block scales
  ``nearest_int(scale/d)``, and the levels re-picked with ``1/(d*l)`` (float32 ``d``, not
  its float16).

(``quantize_row_iq4_nl_ref`` passes ntry=-1 and gives other bytes; llama.cpp's quantizer
does not use it.)  Functions work on position-major blocks ``xt[32, nblocks]`` as in
`localinfer_quant.legacy`.
"""

from __future__ import annotations

import numpy as np

from .kquants import GROUP_MAX_EPS, _seqsum
from .legacy import F32, amax_signed, f16_bytes, f16_value, nearest_int

KVALUES = np.array([-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113], np.int8)
_LEVELS = KVALUES.astype(F32)
NTRY = 7


def _tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each integer f in -128..113: the index of the first level > f (1..15) and the two
    levels around it, so that the search below is three table lookups."""
    f = np.arange(-128, 114)
    mu = np.clip(np.searchsorted(_LEVELS, f, side="right"), 1, 15)
    return mu.astype(np.int32), _LEVELS[mu - 1], _LEVELS[mu]


_MU, _LO, _HI = _tables()


def best_index(v: np.ndarray) -> np.ndarray:
    """ggml's ``best_index_int8(16, kvalues_iq4nl, v)``: the nearest level, the upper one on a
    tie, the differences taken in float32 (NaN -> 15, where the C search ends).

    The levels are integers, so "the first level > v" is "the first level > floor(v)"; v is
    clamped to [-128, 113] for the lookup only, which gives 0 below -127 and 15 from 113 up."""
    c = np.maximum(np.where(v <= F32(113), v, F32(113)), F32(-128))  # NaN -> 113
    f = np.floor(c).astype(np.int32) + 128
    lo, hi = _LO[f], _HI[f]
    with np.errstate(invalid="ignore"):
        return _MU[f] - ((v - lo) < (hi - v))


def _fit(xt: np.ndarray, w: np.ndarray, inv: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Levels nearest to ``inv*x``; returns (sum w*q*x, sum w*q*q), sequential float32 sums."""
    q = _LEVELS[best_index(inv * xt)]
    wq = w * q
    return _seqsum(wq * xt), _seqsum(wq * q)


def _block_scales(xt: np.ndarray) -> np.ndarray:
    """The first phase of quantize_row_iq4_nl_impl: the float scale of each 32-block [S]."""
    w = xt * xt
    amax, mx = amax_signed(xt)
    zero = amax < GROUP_MAX_EPS
    mx = np.where(zero, F32(1), mx)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        d = -mx / _LEVELS[0]
        sumqx, sumq2 = _fit(xt, w, F32(1) / d)
        d = np.where(sumq2 > 0, sumqx / sumq2, F32(0))
        best = d * sumqx
        for itry in range(-NTRY, NTRY + 1):
            sumqx, sumq2 = _fit(xt, w, F32(itry + int(KVALUES[0])) / mx)
            upd = (sumq2 > 0) & (sumqx * sumqx > best * sumq2)
            if upd.any():
                d = np.where(upd, sumqx / sumq2, d)
                best = np.where(upd, d * sumqx, best)
    return np.where(zero, F32(0), d).astype(F32)


def _pack(L: np.ndarray) -> np.ndarray:
    """L [32, S] -> qs [S, 16]: qs[j] = L[j] | L[j+16] << 4."""
    return np.ascontiguousarray((L[:16] | (L[16:] << 4)).astype(np.uint8).T)


def _inv(d: np.ndarray) -> np.ndarray:
    """``d ? 1/d : 0`` in float32."""
    out = np.zeros_like(d, dtype=F32)
    np.divide(F32(1), d, out=out, where=d != 0)
    return out


def quantize_iq4_nl(xt: np.ndarray) -> np.ndarray:
    """xt [32, nb] -> blocks [nb, 18]: d (float16), qs."""
    d = _block_scales(xt)
    L = best_index(_inv(d) * xt)
    return np.concatenate([f16_bytes(d), _pack(L)], axis=1)


def quantize_iq4_xs(xt: np.ndarray) -> np.ndarray:
    """xt [32, nb*8] -> blocks [nb, 136]: d (float16), scales_h (uint16), scales_l[4], qs[128]."""
    nsub = xt.shape[1]
    nb = nsub // 8
    sc = _block_scales(xt).reshape(nb, 8)
    _, max_scale = amax_signed(sc.T)
    d = -max_scale / F32(32)  # -0.0 for an all-zero super-block, and its float16 keeps the sign
    l = np.clip(nearest_int(_inv(d)[:, None] * sc), -32, 31)  # [nb, 8]
    dl = (d[:, None] * l.astype(F32)).reshape(nsub)
    L = best_index(_inv(dl) * xt)
    l = l + 32
    scales_l = (l[:, 0::2] & 0x0F) | ((l[:, 1::2] & 0x0F) << 4)  # [nb, 4]
    scales_h = np.zeros(nb, np.int32)
    for ib in range(8):
        scales_h |= (l[:, ib] >> 4) << (2 * ib)
    qs = _pack(L).reshape(nb, 128)
    h = scales_h.astype("<u2").view(np.uint8).reshape(nb, 2)
    return np.concatenate([f16_bytes(d), h, scales_l.astype(np.uint8), qs], axis=1)


def _levels(qs: np.ndarray) -> np.ndarray:
    """qs [nb, 16*k] -> level values [nb, k, 32] float32 (low nibbles first in each 32)."""
    q = qs.reshape(qs.shape[0], -1, 16)
    return _LEVELS[np.concatenate([q & 0x0F, q >> 4], axis=2)]


def dequantize_iq4_nl(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    return d * _levels(b[:, 2:18]).reshape(-1, 32)


def dequantize_iq4_xs(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    d = f16_value(b[:, 0:2])[:, None]
    h = np.ascontiguousarray(b[:, 2:4]).view("<u2").astype(np.int32)  # [nb, 1]
    lo = b[:, 4:8].astype(np.int32)
    ib = np.arange(8)
    ls = ((lo[:, ib // 2] >> (4 * (ib % 2))) & 0x0F) | (((h >> (2 * ib)) & 3) << 4)
    dl = (d * (ls - 32).astype(F32))[:, :, None]
    return (dl * _levels(b[:, 8:136])).reshape(nb, 256)
