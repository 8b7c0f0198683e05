"""Random but valid GGUF blocks of every native type, and a float64 reference product.

The reference dequantizes with the `gguf` package (gguf-py, llama.cpp's own Python
format code), so kernels are checked against an implementation we did not write.
"""

from __future__ import annotations

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from localinfer_native.types import QMatrix

# Byte offsets of the float16 scale fields inside each block; the rest may be any bytes.
F16_FIELDS = {
    Q.Q4_0: [0], Q.Q4_1: [0, 2], Q.Q5_0: [0], Q.Q5_1: [0, 2], Q.Q8_0: [0],
    Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208],
    Q.Q2_K: [80, 82], Q.Q3_K: [108], Q.IQ4_NL: [0], Q.IQ4_XS: [0], Q.MXFP4: [],
}
# Byte offsets of the E8M0 exponent bytes (MXFP4): random exponents would reach infinities
# (e = 255: 12 * 2^127), so they are drawn from E8M0_SANE, scales 2^-18 .. 2^2.
E8M0_FIELDS = {Q.MXFP4: [0]}
E8M0_SANE = (110, 130)


def random_qmatrix(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> QMatrix:
    """Random bytes with sane float16 (or E8M0) scales, so every bit pattern of the quants is exercised."""
    if qtype == Q.F32:
        return QMatrix.from_array(qtype, rng.standard_normal((rows, cols), dtype=np.float32), cols)
    if qtype == Q.F16:
        return QMatrix.from_array(qtype, rng.standard_normal((rows, cols)).astype(np.float16), cols)
    if qtype == Q.BF16:  # random bytes would hold NaNs: normal values, rounded as ggml rounds them
        return QMatrix.from_array(qtype, quantize(rng.standard_normal((rows, cols), dtype=np.float32), qtype), cols)
    block, size = GGML_QUANT_SIZES[qtype]
    raw = rng.integers(0, 256, size=(rows, cols // block, size), dtype=np.uint8)
    for offset in F16_FIELDS[qtype]:
        scale = rng.uniform(-0.02, 0.02, size=raw.shape[:2]).astype(np.float16)
        raw[:, :, offset : offset + 2] = scale.view(np.uint8).reshape(*raw.shape[:2], 2)
    for offset in E8M0_FIELDS.get(qtype, []):
        raw[:, :, offset] = rng.integers(E8M0_SANE[0], E8M0_SANE[1] + 1, size=raw.shape[:2], dtype=np.uint8)
    return QMatrix.from_array(qtype, raw.reshape(rows, -1), cols)


def quantized_qmatrix(qtype: Q, weights: np.ndarray) -> QMatrix:
    """Real quantization of float weights, for the types gguf-py can quantize."""
    return QMatrix.from_array(qtype, quantize(weights.astype(np.float32), qtype), weights.shape[1])


def dequantized(m: QMatrix) -> np.ndarray:
    """float64 [rows, cols] values of the matrix, by gguf-py's dequantizer."""
    return dequantize(m.data, m.type).astype(np.float64).reshape(m.rows, m.cols)


def reference_matmul(m: QMatrix, x: np.ndarray) -> np.ndarray:
    """float64 [n, rows]: the exact product of the dequantized matrix and x."""
    return x.astype(np.float64) @ dequantized(m).T
