"""Reference codecs for ggml's 256-element super-block types: Q2_K, Q3_K, Q4_K, Q5_K and Q6_K.

Quantization reproduces ggml's ``quantize_row_q<n>_K_ref`` (llama.cpp's path when no
importance matrix is given) bit for bit:

* Q2_K: per 16-element sub-block, weights ``|x|``, then
  ``make_qkx2_quants(n=16, nmax=3, rmin=-0.5, rdelta=0.1, nstep=15, use_mad=true)``;
  4-bit scales/mins against the super-block maxima, final quants ``nearest_int((x + dm)/d)``.
* Q3_K: per 16-element sub-block ``make_q3_quants(n=16, nmax=4, do_rmse=true)`` (weights
  ``x^2``, up to 5 passes of one-quant-at-a-time refinement); 6-bit signed scales against
  ``-32/max_scale``, final quants ``nearest_int(x/d)``.

* Q4_K: per 32-element sub-block, weights ``av_x + |x|`` with ``av_x = sqrtf(sum x^2 / 32)``,
  then ``make_qkx2_quants(n=32, nmax=15, rmin=-1.0, rdelta=0.1, nstep=20, use_mad=false)``;
  6-bit scales/mins against the super-block maxima, final quants ``nearest_int((x + dm)/d)``.
* Q5_K: the same with ``nmax=31, rmin=-0.5, rdelta=0.1, nstep=15``.
* Q6_K: per 16-element sub-block ``make_qx_quants(n=16, nmax=32, rmse_type=1, qw=NULL)``
  (weights ``x^2``, 18 extra trial scales ``-(32 + 0.1*is)/max``, is = -9..9, is != 0);
  8-bit signed scales against ``-128/max_scale``, final quants ``nearest_int(x/d)``.

Every function works on *sub-blocks laid out position-major*: a float32 array
``xt[n, nsub]`` (n = 32 for Q4_K/Q5_K, 16 for Q2_K/Q3_K/Q6_K; sub-block s of super-block i
is column ``i*(256/n) + s``), so that the sequential float32 sums of the C code become loops
over the n positions, each one vector operation over all sub-blocks.
"""

from __future__ import annotations

import numpy as np

from .legacy import F32, amax_signed, f16_bytes, f16_value, nearest_int, low_byte_signed

QK_K = 256
GROUP_MAX_EPS = np.float32(1e-15)


def _seqsum(a: np.ndarray) -> np.ndarray:
    """``float s = 0; for (i...) s += a[i];`` along axis 0, in float32 and in order."""
    s = np.zeros(a.shape[1:], F32)
    for row in a:
        s += row
    return s


# --------------------------------------------------------------------------------------------
# make_qkx2_quants / make_qx_quants / make_q3_quants, vectorised over sub-blocks (columns)
# --------------------------------------------------------------------------------------------


def _err(diff: np.ndarray, use_mad: bool) -> np.ndarray:
    return np.abs(diff) if use_mad else diff * diff


def _make_qkx2_quants(x: np.ndarray, w: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int, use_mad: bool = False):
    """ggml's make_qkx2_quants. x, w: [n, S]. Returns (scale[S], the_min[S], L[n, S]).

    The error is sum w*|diff| with `use_mad` (Q2_K), sum w*diff^2 otherwise."""
    n = x.shape[0]
    mn = x[0].copy()
    mx = x[0].copy()
    sum_w = w[0].copy()
    sum_x = sum_w * x[0]
    for i in range(1, n):
        xi = x[i]
        mn = np.where(xi < mn, xi, mn)
        mx = np.where(xi > mx, xi, mx)
        sum_w = sum_w + w[i]
        sum_x = sum_x + w[i] * xi
    mn = np.where(mn > 0, F32(0), mn)
    flat = mx == mn
    rng = np.where(flat, F32(1), mx - mn)  # the flat sub-blocks return early in C; avoid 0/0 here
    fnmax = F32(nmax)

    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = fnmax / rng
        scale = F32(1) / iscale
        xm = x - mn
        L = np.clip(nearest_int(iscale * xm), 0, nmax)
        Lf = L.astype(F32)
        diff = scale * Lf + mn - x
        best_error = _seqsum(w * _err(diff, use_mad))
        for step in range(nstep + 1):
            # `min` is the running best: C reuses the variable it overwrites below
            iscale = (F32(rmin) + F32(rdelta) * F32(step) + fnmax) / np.where(flat, F32(1), mx - mn)
            la = np.clip(nearest_int(iscale * xm), 0, nmax)
            laf = la.astype(F32)
            wl = w * laf
            sum_l = _seqsum(wl)
            sum_l2 = _seqsum(wl * laf)
            sum_xl = _seqsum(wl * x)
            D = sum_w * sum_l2 - sum_l * sum_l
            this_scale = (sum_w * sum_xl - sum_x * sum_l) / D
            this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D
            pos = this_min > 0
            this_min = np.where(pos, F32(0), this_min)
            this_scale = np.where(pos, sum_xl / sum_l2, this_scale)
            diff = this_scale * laf + this_min - x
            cur_error = _seqsum(w * _err(diff, use_mad))
            better = (D > 0) & (cur_error < best_error) & ~flat
            if better.any():
                L = np.where(better, la, L)
                best_error = np.where(better, cur_error, best_error)
                scale = np.where(better, this_scale, scale)
                mn = np.where(better, this_min, mn)
                xm = x - mn
    L = np.where(flat, 0, L)
    scale = np.where(flat, F32(0), scale).astype(F32)
    the_min = (-mn).astype(F32)
    return scale, the_min, L


def _make_qx_quants_rmse1(x: np.ndarray, nmax: int):
    """ggml's make_qx_quants(rmse_type=1, qw=NULL). x: [n, S]. Returns (scale[S], L[n, S] in 0..2*nmax-1)."""
    amax, mx = amax_signed(x)
    zero = amax < GROUP_MAX_EPS
    mx = np.where(zero, F32(1), mx)
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):

        def trial(iscale):
            l = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
            lf = l.astype(F32)
            return l, _seqsum(wx * lf), _seqsum((w * lf) * lf)

        l, sumlx, suml2 = trial(F32(-nmax) / mx)
        L = l + nmax
        scale = np.where(suml2 != 0, sumlx / suml2, F32(0))
        best = scale * sumlx
        for step in range(-9, 10):
            if step == 0:
                continue
            iscale = -(F32(nmax) + F32(0.1) * F32(step)) / mx
            l, sumlx, suml2 = trial(iscale)
            upd = (suml2 > 0) & (sumlx * sumlx > best * suml2)
            if upd.any():
                L = np.where(upd, l + nmax, L)
                scale = np.where(upd, sumlx / suml2, scale)
                best = np.where(upd, scale * sumlx, best)
    L = np.where(zero, 0, L)
    scale = np.where(zero, F32(0), scale).astype(F32)
    return scale, L


def _make_q3_quants_rmse(x: np.ndarray, nmax: int):
    """ggml's make_q3_quants(do_rmse=true). x: [n, S]. Returns (scale[S], L[n, S] in 0..2*nmax-1)."""
    amax, mx = amax_signed(x)
    zero = amax < GROUP_MAX_EPS
    w = x * x
    wx = w * x
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-nmax) / np.where(zero, F32(1), mx)
        L = np.clip(nearest_int(iscale * x), -nmax, nmax - 1)
        Lf = L.astype(F32)
        sumlx = _seqsum(wx * Lf)
        suml2 = _seqsum((w * Lf) * Lf)
        # C stops after a pass that changed nothing; a further pass over an unchanged state
        # changes nothing either, so running all 5 passes everywhere gives the same result
        for _ in range(5):
            for i in range(x.shape[0]):
                # take quant i out of the sums, re-fit it alone, keep it if the error drops
                li = L[i].astype(F32)
                slx0 = sumlx - wx[i] * li
                sl20 = suml2 - (w[i] * li) * li
                new_l = np.clip(nearest_int((x[i] * sl20) / slx0), -nmax, nmax - 1)
                nl = new_l.astype(F32)
                slx = slx0 + wx[i] * nl
                sl2 = sl20 + (w[i] * nl) * nl
                upd = (slx0 > 0) & (new_l != L[i]) & (sl2 > 0) & ((slx * slx) * suml2 > (sumlx * sumlx) * sl2)
                if upd.any():
                    L[i] = np.where(upd, new_l, L[i])
                    sumlx = np.where(upd, slx, sumlx)
                    suml2 = np.where(upd, sl2, suml2)
        scale = np.where(suml2 > 0, sumlx / suml2, F32(0))
    L = np.where(zero, 0, L + nmax)
    scale = np.where(zero, F32(0), scale).astype(F32)
    return scale, L


# --------------------------------------------------------------------------------------------
# Q2_K / Q3_K
# --------------------------------------------------------------------------------------------


def _pack_2bit(L: np.ndarray) -> np.ndarray:
    """L [nb, 256] (0..3) -> qs [nb, 64]: per 128-half, q[l] = L[l] | L[l+32]<<2 | L[l+64]<<4 | L[l+96]<<6."""
    c = L.reshape(-1, 2, 4, 32)
    q = c[:, :, 0] | (c[:, :, 1] << 2) | (c[:, :, 2] << 4) | (c[:, :, 3] << 6)
    return (q & 0xFF).astype(np.uint8).reshape(-1, 64)


def _unpack_2bit(qs: np.ndarray) -> np.ndarray:
    """qs [nb, 64] -> [nb, 16, 16] ints (0..3) in sub-block order."""
    q = qs.astype(np.int32).reshape(-1, 2, 1, 32)
    shifts = (2 * np.arange(4, dtype=np.int32))[None, None, :, None]
    return ((q >> shifts) & 3).reshape(-1, 16, 16)


def quantize_q2_k(xt: np.ndarray) -> np.ndarray:
    """xt [16, nb*16] -> blocks [nb, 84]: scales (4-bit scale | 4-bit min << 4), qs, d, dmin."""
    nsub = xt.shape[1]
    nb = nsub // 16
    scales, mins, L = _make_qkx2_quants(xt, np.abs(xt), 3, -0.5, 0.1, 15, use_mad=True)
    sc = scales.reshape(nb, 16)
    mn = mins.reshape(nb, 16)
    max_scale = np.where(sc > 0, sc, F32(0)).max(axis=1)
    max_min = np.where(mn > 0, mn, F32(0)).max(axis=1)
    has_s, has_m = (max_scale > 0)[:, None], (max_min > 0)[:, None]
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        ls = np.where(has_s, nearest_int((F32(15) / max_scale)[:, None] * sc), 0)
        lm = np.where(has_m, nearest_int((F32(15) / max_min)[:, None] * mn), 0)
    sbytes = (ls | (lm << 4)) & 0xFF  # uint8 stores keep the low byte
    d16 = f16_bytes(np.where(has_s[:, 0], max_scale / F32(15), F32(0)))
    dmin16 = f16_bytes(np.where(has_m[:, 0], max_min / F32(15), F32(0)))
    d = (f16_value(d16)[:, None] * (sbytes & 0x0F).astype(F32)).reshape(nsub)
    dm = (f16_value(dmin16)[:, None] * (sbytes >> 4).astype(F32)).reshape(nsub)
    nz = d != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        lnew = np.clip(nearest_int((xt + dm) / np.where(nz, d, F32(1))), 0, 3)
    L = np.where(nz, lnew, L)  # sub-blocks with d == 0 keep make_qkx2_quants' L
    L = np.ascontiguousarray(L.T).reshape(nb, QK_K)
    return np.concatenate([sbytes.astype(np.uint8), _pack_2bit(L), d16, dmin16], axis=1)


def _pack_scales_q3(l: np.ndarray) -> np.ndarray:
    """6-bit scales [nb, 16] (0..63) -> the 12 scale bytes of a Q3_K block."""
    out = np.zeros((l.shape[0], 12), np.int32)
    out[:, 0:8] = (l[:, 0:8] & 0x0F) | ((l[:, 8:16] & 0x0F) << 4)
    hi = l >> 4
    for j in range(16):
        out[:, 8 + j % 4] |= hi[:, j] << (2 * (j // 4))
    return (out & 0xFF).astype(np.uint8)


def _unpack_scales_q3(b: np.ndarray) -> np.ndarray:
    """12 scale bytes [nb, 12] -> the signed scales [nb, 16] (-32..31)."""
    q = b.astype(np.int32)
    lo = np.concatenate([q[:, 0:8] & 0x0F, q[:, 0:8] >> 4], axis=1)
    j = np.arange(16)
    hi = (q[:, 8 + j % 4] >> (2 * (j // 4))) & 3
    return (lo | (hi << 4)) - 32


def quantize_q3_k(xt: np.ndarray) -> np.ndarray:
    """xt [16, nb*16] -> blocks [nb, 110]: hmask, qs, scales, d."""
    nsub = xt.shape[1]
    nb = nsub // 16
    scales, L = _make_q3_quants_rmse(xt, 4)
    sc = scales.reshape(nb, 16)
    _, max_scale = amax_signed(sc.T)
    has = max_scale != 0
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-32) / np.where(has, max_scale, F32(1))
        l = np.clip(low_byte_signed(nearest_int(iscale[:, None] * sc)), -32, 31) + 32  # int8_t l = nearest_int(...)
        sbytes = np.where(has[:, None], _pack_scales_q3(l), np.uint8(0))
        d16 = f16_bytes(np.where(has, F32(1) / iscale, F32(0)))
        d = (f16_value(d16)[:, None] * _unpack_scales_q3(sbytes).astype(F32)).reshape(nsub)
        nz = d != 0
        lnew = np.clip(nearest_int(xt / np.where(nz, d, F32(1))), -4, 3) + 4
    L = np.where(nz, lnew, L)
    L = np.ascontiguousarray(L.T).reshape(nb, QK_K)
    high = (L > 3).astype(np.int32).reshape(nb, 8, 32)  # bit j of hmask[m] <- element 32*j + m
    hmask = np.zeros((nb, 32), np.int32)
    for j in range(8):
        hmask |= high[:, j, :] << j
    L = np.where(L > 3, L - 4, L)
    return np.concatenate([hmask.astype(np.uint8), _pack_2bit(L), sbytes, d16], axis=1)


# --------------------------------------------------------------------------------------------
# Q4_K / Q5_K
# --------------------------------------------------------------------------------------------


def _pack_scales_k4(ls: np.ndarray, lm: np.ndarray) -> np.ndarray:
    """6-bit scales and mins [nb, 8] -> the 12 scale bytes of a Q4_K/Q5_K block."""
    out = np.zeros((ls.shape[0], 12), np.int32)
    out[:, 0:4] = ls[:, 0:4] | ((ls[:, 4:8] >> 4) << 6)
    out[:, 4:8] = lm[:, 0:4] | ((lm[:, 4:8] >> 4) << 6)
    out[:, 8:12] = (ls[:, 4:8] & 0x0F) | ((lm[:, 4:8] & 0x0F) << 4)
    return (out & 0xFF).astype(np.uint8)


def _unpack_scales_k4(sc: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """get_scale_min_k4 for j = 0..7: 12 bytes [nb, 12] -> (scales, mins) [nb, 8] ints."""
    q = sc.astype(np.int32)
    d = np.empty((q.shape[0], 8), np.int32)
    m = np.empty((q.shape[0], 8), np.int32)
    d[:, 0:4] = q[:, 0:4] & 63
    m[:, 0:4] = q[:, 4:8] & 63
    d[:, 4:8] = (q[:, 8:12] & 0x0F) | ((q[:, 0:4] >> 6) << 4)
    m[:, 4:8] = (q[:, 8:12] >> 4) | ((q[:, 4:8] >> 6) << 4)
    return d, m


def _quantize_qk(xt: np.ndarray, nmax: int, rmin: float, rdelta: float, nstep: int):
    """Common part of Q4_K and Q5_K. xt [32, nb*8]. Returns (d bytes, dmin bytes, scale bytes, L [nb, 256])."""
    nsub = xt.shape[1]
    nb = nsub // 8
    sum_x2 = _seqsum(xt * xt)
    av_x = np.sqrt(sum_x2 / F32(32))
    w = av_x + np.abs(xt)
    scales, mins, L = _make_qkx2_quants(xt, w, nmax, rmin, rdelta, nstep)
    scales = scales.reshape(nb, 8)
    mins = mins.reshape(nb, 8)
    max_scale = np.where(scales > 0, scales, F32(0)).max(axis=1)
    max_min = np.where(mins > 0, mins, F32(0)).max(axis=1)
    with np.errstate(divide="ignore"):
        inv_scale = np.where(max_scale > 0, F32(63) / max_scale, F32(0))[:, None]
        inv_min = np.where(max_min > 0, F32(63) / max_min, F32(0))[:, None]
    ls = np.minimum(63, nearest_int(inv_scale * scales) & 0xFF)
    lm = np.minimum(63, nearest_int(inv_min * mins) & 0xFF)
    d16 = f16_bytes(max_scale / F32(63))
    dmin16 = f16_bytes(max_min / F32(63))
    sbytes = _pack_scales_k4(ls, lm)
    sc, m = _unpack_scales_k4(sbytes)
    d = (f16_value(d16)[:, None] * sc.astype(F32)).reshape(nsub)  # [nsub]
    dm = (f16_value(dmin16)[:, None] * m.astype(F32)).reshape(nsub)
    nz = d != 0
    with np.errstate(divide="ignore", invalid="ignore"):
        lnew = np.clip(nearest_int((xt + dm) / np.where(nz, d, F32(1))), 0, nmax)
    L = np.where(nz, lnew, L)  # sub-blocks with d == 0 keep make_qkx2_quants' L
    L = np.ascontiguousarray(L.T).reshape(nb, QK_K)
    return d16, dmin16, sbytes, L


def _pack_q4_nibbles(L: np.ndarray) -> np.ndarray:
    """L [nb, 256] -> qs [nb, 128]: for each 64-chunk, q[l] = L[l] | L[l+32] << 4."""
    c = L.reshape(-1, 4, 2, 32)
    return ((c[:, :, 0, :] & 0x0F) | ((c[:, :, 1, :] & 0x0F) << 4)).astype(np.uint8).reshape(-1, 128)


def quantize_q4_k(xt: np.ndarray) -> np.ndarray:
    d16, dmin16, sbytes, L = _quantize_qk(xt, 15, -1.0, 0.1, 20)
    return np.concatenate([d16, dmin16, sbytes, _pack_q4_nibbles(L)], axis=1)


def quantize_q5_k(xt: np.ndarray) -> np.ndarray:
    d16, dmin16, sbytes, L = _quantize_qk(xt, 31, -0.5, 0.1, 15)
    high = (L >> 4) & 1  # [nb, 256]: sub-block j sets bit j of qh[l]
    hb = high.reshape(-1, 8, 32)
    qh = np.zeros((L.shape[0], 32), np.int32)
    for j in range(8):
        qh |= hb[:, j, :] << j
    return np.concatenate([d16, dmin16, sbytes, qh.astype(np.uint8), _pack_q4_nibbles(L & 0x0F)], axis=1)


# --------------------------------------------------------------------------------------------
# Q6_K
# --------------------------------------------------------------------------------------------


def quantize_q6_k(xt: np.ndarray) -> np.ndarray:
    """xt [16, nb*16] -> blocks [nb, 210]."""
    nsub = xt.shape[1]
    nb = nsub // 16
    scales, L = _make_qx_quants_rmse1(xt, 32)
    sc2 = scales.reshape(nb, 16)
    max_abs, max_scale = amax_signed(sc2.T)
    zero = max_abs < GROUP_MAX_EPS
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        iscale = F32(-128) / np.where(zero, F32(1), max_scale)
        d16 = f16_bytes(F32(1) / iscale)
        qsc = low_byte_signed(np.minimum(127, nearest_int(iscale[:, None] * sc2)))  # int8 scales [nb, 16]
        d = (f16_value(d16)[:, None] * qsc.astype(F32)).reshape(nsub)
        nz = d != 0
        lnew = np.clip(nearest_int(xt / np.where(nz, d, F32(1))), -32, 31) + 32
    L = np.where(nz, lnew, L)
    L = np.ascontiguousarray(L.T).reshape(nb, QK_K)
    c = L.reshape(nb, 2, 4, 32)  # [half, k, l]: element 128*half + 32*k + l
    ql = np.concatenate(
        [(c[:, :, 0] & 0x0F) | ((c[:, :, 2] & 0x0F) << 4), (c[:, :, 1] & 0x0F) | ((c[:, :, 3] & 0x0F) << 4)], axis=2
    )  # [nb, 2, 64]
    qh = (c[:, :, 0] >> 4) | ((c[:, :, 1] >> 4) << 2) | ((c[:, :, 2] >> 4) << 4) | ((c[:, :, 3] >> 4) << 6)  # [nb, 2, 32]
    out = np.concatenate(
        [
            (ql & 0xFF).astype(np.uint8).reshape(nb, 128),
            (qh & 0xFF).astype(np.uint8).reshape(nb, 64),
            qsc.astype(np.int8).view(np.uint8),
            d16,
        ],
        axis=1,
    )
    out[zero] = 0  # memset(&y[i], 0, ...) for all-zero super-blocks
    return out


# --------------------------------------------------------------------------------------------
# dequantize: blocks [nb, type_size] uint8 -> [nb, 256] float32
# --------------------------------------------------------------------------------------------


def _q4_nibbles(qs: np.ndarray) -> np.ndarray:
    """qs [nb, 128] -> [nb, 8, 32] ints in sub-block order."""
    c = qs.reshape(-1, 4, 1, 32)
    return np.concatenate([c & 0x0F, c >> 4], axis=2).reshape(-1, 8, 32).astype(np.int32)


def dequantize_q4_k(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    dmin = f16_value(b[:, 2:4])[:, None]
    sc, m = _unpack_scales_k4(b[:, 4:16])
    d1 = (d * sc.astype(F32))[:, :, None]
    m1 = (dmin * m.astype(F32))[:, :, None]
    q = _q4_nibbles(b[:, 16:144]).astype(F32)
    return (d1 * q - m1).reshape(-1, QK_K)


def dequantize_q5_k(b: np.ndarray) -> np.ndarray:
    d = f16_value(b[:, 0:2])[:, None]
    dmin = f16_value(b[:, 2:4])[:, None]
    sc, m = _unpack_scales_k4(b[:, 4:16])
    d1 = (d * sc.astype(F32))[:, :, None]
    m1 = (dmin * m.astype(F32))[:, :, None]
    qh = b[:, 16:48].astype(np.int32)[:, None, :]  # [nb, 1, 32]
    high = ((qh >> np.arange(8, dtype=np.int32)[None, :, None]) & 1) << 4  # [nb, 8, 32]
    q = (_q4_nibbles(b[:, 48:176]) + high).astype(F32)
    return (d1 * q - m1).reshape(-1, QK_K)


def dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    ql = b[:, 0:128].astype(np.int32).reshape(nb, 2, 2, 32)  # [half, 0/32 offset, l]
    qh = b[:, 128:192].astype(np.int32).reshape(nb, 2, 1, 32)
    sc = np.ascontiguousarray(b[:, 192:208]).view(np.int8).astype(F32)  # [nb, 16]
    d = f16_value(b[:, 208:210])[:, None]
    low = np.concatenate([ql & 0x0F, ql >> 4], axis=2)  # k = 0..3 -> [nb, 2, 4, 32]
    high = (qh >> (2 * np.arange(4, dtype=np.int32))[None, None, :, None]) & 3
    q = ((low | (high << 4)) - 32).astype(F32).reshape(nb, 16, 16)
    return ((d * sc)[:, :, None] * q).reshape(nb, QK_K)


def dequantize_q2_k(b: np.ndarray) -> np.ndarray:
    sc = b[:, 0:16].astype(np.int32)
    d = f16_value(b[:, 80:82])[:, None]
    dmin = f16_value(b[:, 82:84])[:, None]
    dl = (d * (sc & 0x0F).astype(F32))[:, :, None]
    ml = (dmin * (sc >> 4).astype(F32))[:, :, None]
    q = _unpack_2bit(b[:, 16:80]).astype(F32)
    return (dl * q - ml).reshape(-1, QK_K)


def dequantize_q3_k(b: np.ndarray) -> np.ndarray:
    nb = b.shape[0]
    hm = b[:, 0:32].astype(np.int32)[:, None, :]  # [nb, 1, 32]
    high = (hm >> np.arange(8, dtype=np.int32)[None, :, None]) & 1  # [nb, 8, 32]: element 32*j + m
    low = _unpack_2bit(b[:, 32:96]).reshape(nb, 8, 32)
    q = (low - np.where(high == 1, 0, 4)).astype(F32).reshape(nb, 16, 16)
    d = f16_value(b[:, 108:110])[:, None]
    dl = (d * _unpack_scales_q3(b[:, 96:108]).astype(F32))[:, :, None]
    return (dl * q).reshape(nb, QK_K)
