"""Reference codecs for ggml's 32-element block types: Q8_0, Q4_0, Q4_1, Q5_0 and Q5_1.

Quantization reproduces ggml's ``quantize_row_*_ref`` (what llama.cpp's quantizer runs when
no importance matrix is given) bit for bit; see `localinfer_quant.codecs` for the rules that
make that possible.  Every function here works on *blocks laid out position-major*: a float32
array ``xt[32, nblocks]``, so that a loop over the 32 positions of a block (the order in
which ggml scans a block) is 32 vector operations over all blocks at once.

Also home of the small helpers shared with `localinfer_quant.kquants` (float16 packing,
ggml's ``nearest_int`` and C's ``roundf``).
"""

from __future__ import annotations

import numpy as np

F32 = np.float32
_MAGIC = np.float32(12582912.0)  # 1.5 * 2**23


# --------------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------------


def nearest_int(v: np.ndarray) -> np.ndarray:
    """ggml's ``nearest_int``: add 1.5*2**23 in float32 and read the low mantissa bits.

    Round-half-to-even for |v| <= 4194303; reproduced literally (not with ``np.rint``) so that
    out-of-range values give the same integers as the C code too.
    """
    with np.errstate(over="ignore", invalid="ignore"):
        s = (np.asarray(v, dtype=F32) + _MAGIC).view(np.int32)
    return (s & np.int32(0x007FFFFF)) - np.int32(0x00400000)


def roundf(v: np.ndarray) -> np.ndarray:
    """C ``roundf``: nearest integer, halves away from zero (float32 in, float32 out)."""
    t = np.trunc(v)
    frac = np.abs(v - t)  # exact for float32
    return np.where(frac >= F32(0.5), t + np.sign(v), t).astype(F32)


def c_to_int(v: np.ndarray) -> np.ndarray:
    """A C float -> (int8_t / uint8_t) conversion as x86-64 compilers emit it: truncate to an
    int32 (``cvttss2si``, INT_MIN when out of range) and keep the low byte."""
    with np.errstate(invalid="ignore"):
        i = np.trunc(v).astype(np.int64)
    i = np.where((i > 2147483647) | (i < -2147483648), -2147483648, i)
    return i.astype(np.int32)


def low_byte_signed(i: np.ndarray) -> np.ndarray:
    """int -> int8_t (two's complement wrap), as int32."""
    return ((i.astype(np.int32) & 0xFF) ^ 0x80) - 0x80


def f16_bytes(v: np.ndarray) -> np.ndarray:
    """float32 [n] -> the little-endian bytes of GGML_FP32_TO_FP16 (round to nearest even), [n, 2]."""
    with np.errstate(over="ignore"):  # |v| > 65504 -> inf, as in ggml
        h = np.asarray(v, dtype=F32).astype("<f2")
    return np.ascontiguousarray(h).view(np.uint8).reshape(-1, 2)


def f16_value(b: np.ndarray) -> np.ndarray:
    """[n, 2] uint8 -> GGML_FP16_TO_FP32 as float32 [n]."""
    return np.ascontiguousarray(b).view("<f2").reshape(-1).astype(F32)


def safe_inv(d: np.ndarray) -> np.ndarray:
    """``d ? 1.0f/d : 0.0f`` in float32."""
    out = np.zeros_like(d, dtype=F32)
    np.divide(F32(1.0), d, out=out, where=d != 0)
    return out


def amax_signed(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(largest |x|, the first x that has it) per column of x [n, S], as ggml's scans write it:
    ``if (amax < fabsf(v)) { amax = fabsf(v); max = v; }`` (strictly greater: the first wins a tie)."""
    amax = np.zeros(x.shape[1], F32)
    mx = np.zeros(x.shape[1], F32)
    for v in x:
        a = np.abs(v)
        upd = a > amax
        amax = np.where(upd, a, amax)
        mx = np.where(upd, v, mx)
    return amax, mx


def _min_max(xt: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sequential ``if (v < min) min = v; if (v > max) max = v;`` from +-FLT_MAX."""
    n = xt.shape[1]
    fmax = np.finfo(F32).max
    mn = np.full(n, fmax, F32)
    mx = np.full(n, -fmax, F32)
    for v in xt:
        mn = np.where(v < mn, v, mn)
        mx = np.where(v > mx, v, mx)
    return mn, mx


def _pack_nibbles(q: np.ndarray) -> np.ndarray:
    """q [32, nb] (ints, low 4 bits used) -> qs [nb, 16]: qs[j] = q[j] | q[j+16] << 4."""
    lo = q[:16] & 0x0F
    hi = (q[16:] & 0x0F) << 4
    return np.ascontiguousarray((lo | hi).astype(np.uint8).T)


def _pack_qh(q: np.ndarray) -> np.ndarray:
    """q [32, nb] -> qh [nb, 4]: bit j of the little-endian uint32 is bit 4 of q[j]."""
    bits = ((q >> 4) & 1).astype(np.uint32)
    qh = np.zeros(q.shape[1], np.uint32)
    for j in range(32):
        qh |= bits[j] << np.uint32(j)
    return qh.astype("<u4").view(np.uint8).reshape(-1, 4)


def _unpack_nibbles(qs: np.ndarray) -> np.ndarray:
    """qs [nb, 16] -> [nb, 32] ints: positions 0..15 low nibbles, 16..31 high nibbles."""
    return np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.int32)


def _unpack_qh(qh: np.ndarray) -> np.ndarray:
    """qh [nb, 4] -> [nb, 32] ints: the fifth bit (0x10) of each position."""
    h = np.ascontiguousarray(qh).view("<u4").reshape(-1, 1)
    return (((h >> np.arange(32, dtype=np.uint32)) & 1) << 4).astype(np.int32)


# --------------------------------------------------------------------------------------------
# quantize: xt [32, nb] float32 -> blocks [nb, type_size] uint8
# --------------------------------------------------------------------------------------------


def quantize_q8_0(xt: np.ndarray) -> np.ndarray:
    amax = np.zeros(xt.shape[1], F32)
    for v in xt:
        a = np.abs(v)
        amax = np.where(amax > a, amax, a)  # MAX(amax, fabsf(v))
    d = amax / F32(127)
    idv = safe_inv(d)
    q = low_byte_signed(c_to_int(roundf(xt * idv)))
    return np.concatenate([f16_bytes(d), np.ascontiguousarray(q.astype(np.int8).T).view(np.uint8)], axis=1)


def quantize_q4_0(xt: np.ndarray) -> np.ndarray:
    d = amax_signed(xt)[1] / F32(-8)
    idv = safe_inv(d)
    q = np.minimum(15, low_byte_signed(c_to_int(xt * idv + F32(8.5)))) & 0xFF
    return np.concatenate([f16_bytes(d), _pack_nibbles(q)], axis=1)


def quantize_q4_1(xt: np.ndarray) -> np.ndarray:
    mn, mx = _min_max(xt)
    d = (mx - mn) / F32(15)
    idv = safe_inv(d)
    q = np.minimum(15, low_byte_signed(c_to_int((xt - mn) * idv + F32(0.5)))) & 0xFF
    return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_nibbles(q)], axis=1)


def quantize_q5_0(xt: np.ndarray) -> np.ndarray:
    d = amax_signed(xt)[1] / F32(-16)
    idv = safe_inv(d)
    q = np.minimum(31, low_byte_signed(c_to_int(xt * idv + F32(16.5)))) & 0xFF
    return np.concatenate([f16_bytes(d), _pack_qh(q), _pack_nibbles(q)], axis=1)


def quantize_q5_1(xt: np.ndarray) -> np.ndarray:
    mn, mx = _min_max(xt)
    d = (mx - mn) / F32(31)
    idv = safe_inv(d)
    q = c_to_int((xt - mn) * idv + F32(0.5)) & 0xFF  # (uint8_t)(x0 + 0.5f), no clamp in ggml
    return np.concatenate([f16_bytes(d), f16_bytes(mn), _pack_qh(q), _pack_nibbles(q)], axis=1)


# --------------------------------------------------------------------------------------------
# dequantize: blocks [nb, type_size] uint8 -> [nb, 32] float32
# --------------------------------------------------------------------------------------------


def dequantize_q8_0(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    q = np.ascontiguousarray(b[:, 2:34]).view(np.int8).astype(F32)
    return q * d


def dequantize_q4_0(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    q = (_unpack_nibbles(b[:, 2:18]) - 8).astype(F32)
    return q * d


def dequantize_q4_1(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    m = f16_value(b[:, 2:4])[:, None]
    q = _unpack_nibbles(b[:, 4:20]).astype(F32)
    return q * d + m


def dequantize_q5_0(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    q = ((_unpack_nibbles(b[:, 6:22]) | _unpack_qh(b[:, 2:6])) - 16).astype(F32)
    return q * d


def dequantize_q5_1(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    m = f16_value(b[:, 2:4])[:, None]
    q = (_unpack_nibbles(b[:, 8:24]) | _unpack_qh(b[:, 4:8])).astype(F32)
    return q * d + m
