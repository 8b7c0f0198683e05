"""MXFP4, the OCP microscaling 4-bit float (gpt-oss's experts): blocks of 32 values, each
one E2M1 code (a sign and 3 bits) times the block's power-of-two scale.

ggml's layout (ggml-common.h ``block_mxfp4``): 1 + 16 bytes per block, the scale's E8M0
exponent byte ``e``, then ``qs[j] = code[j] | code[j + 16] << 4``. ggml stores the E2M1
values doubled, as the integers ``kvalues_mxfp4`` (0, 1, 2, 3, 4, 6, 8, 12 and their
negatives), and halves the scale instead: ``GGML_E8M0_TO_FP32_HALF(e)`` is 2^(e - 128)
(for e < 2 the float32 subnormals 2^-128 and 2^-127, bit patterns ``0x00200000 << e``).

* ``dequantize_row_mxfp4``: ``kvalues_mxfp4[code] * d``, one float32 product.
* ``quantize_row_mxfp4_ref`` (what ``quantize_mxfp4`` and so llama.cpp's quantizer run, an
  importance matrix or not): ``amax`` the largest |x| (NaN never taken), ``e = amax > 0 ?
  (uint8_t)(floorf(log2f(amax)) - 2 + 127) : 0``, and each value's code the first of the 16
  whose ``fabsf(kvalues_mxfp4[i]*d - x)`` is smallest (``best_index_mxfp4``: strict ``<``,
  so +0 beats -0 and NaN stays at code 0).

``floorf(log2f(amax))`` is amax's binary exponent except where log2f rounds up to the next
integer, for amax a few float32 steps below a power of two. There float64's log2 rounded to
float32 gives the same floor as the libm log2f ggml calls (the tests try the 40 float32
values below every power of two, subnormals included). A scale exponent below 0 (amax
under 2^-125) or an infinite amax wraps as the C cast does on x86-64 (truncate to int32,
keep the low byte). Functions work on position-major blocks ``xt[32, nblocks]`` as in
`localinfer_quant.legacy`.
"""

from __future__ import annotations

import numpy as np

from .legacy import F32, c_to_int

KVALUES = np.array([0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12], np.int8)  # kvalues_mxfp4: E2M1, doubled
_LEVELS = KVALUES.astype(F32)


def e8m0_half(e: np.ndarray) -> np.ndarray:
    """``GGML_E8M0_TO_FP32_HALF``: uint8 exponents -> float32 2^(e - 128)."""
    e = e.astype(np.uint32)
    bits = np.where(e < 2, np.uint32(0x00200000) << e, (e - np.uint32(1)) << np.uint32(23))
    return bits.astype(np.uint32).view(F32)


def _exponents(amax: np.ndarray) -> np.ndarray:
    """amax [S] (float32, >= 0) -> the scale byte e [S] as uint8."""
    with np.errstate(divide="ignore", invalid="ignore"):
        log2 = np.log2(amax.astype(np.float64)).astype(F32)  # log2f (see the module docstring)
        e = c_to_int(np.floor(log2) - F32(2) + F32(127)) & 0xFF
    return np.where(amax > 0, e, 0).astype(np.uint8)


def quantize_mxfp4(xt: np.ndarray) -> np.ndarray:
    """xt [32, nb] -> blocks [nb, 17]: e, qs."""
    a = np.abs(xt)
    amax = np.where(np.isnan(a), F32(0), a).max(axis=0)
    e = _exponents(amax)
    d = e8m0_half(e)
    best = np.zeros(xt.shape, np.uint8)
    best_err = np.abs(_LEVELS[0] * d - xt)
    with np.errstate(over="ignore", invalid="ignore"):
        for i in range(1, 16):  # best_index_mxfp4: the first level with the smallest error
            err = np.abs(_LEVELS[i] * d - xt)
            better = err < best_err
            best = np.where(better, np.uint8(i), best)
            best_err = np.where(better, err, best_err)
    qs = best[:16] | (best[16:] << np.uint8(4))  # [16, nb]
    return np.concatenate([e[:, None], qs.T], axis=1)


def dequantize_mxfp4(b: np.ndarray) -> np.ndarray:
    """blocks [nb, 17] -> values [nb, 32] float32."""
    d = e8m0_half(b[:, 0])[:, None]
    qs = b[:, 1:17]
    codes = np.concatenate([qs & 0x0F, qs >> 4], axis=1)
    with np.errstate(over="ignore"):  # e = 255: 12 * 2^127 is infinite, in ggml too
        return _LEVELS[codes] * d
