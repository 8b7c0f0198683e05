"""numpy reference codecs for GGUF block types, bit-exact with ggml.

Public API::

    quantize(x, qtype)     float32 [rows, cols] -> uint8 [rows, row_bytes] (GGUF block layout)
    dequantize(data, qtype) uint8 [rows, row_bytes] -> float32 [rows, cols]
    SUPPORTED              the types both work for

Types: Q8_0, Q4_0, Q4_1, Q5_0, Q5_1 (`localinfer_quant.legacy`), Q2_K, Q3_K, Q4_K, Q5_K,
Q6_K (`localinfer_quant.kquants`), IQ4_NL, IQ4_XS (`localinfer_quant.iquants`), BF16
(`localinfer_quant.floats`) and MXFP4 (`localinfer_quant.mxfp4`).

What "bit-exact" means here
---------------------------
``quantize`` gives the same bytes as ggml's reference quantizers ``quantize_row_<type>_ref``
in ggml/src/ggml-quants.c -- what ``llama_model_quantize`` runs when no importance matrix is
given (``quantize_q4_K(src, dst, nrow, n_per_row, NULL)`` calls ``quantize_row_q4_K_ref`` and
so on).  IQ4_NL and IQ4_XS are the exception: there ``quantize_iq4_nl`` / ``quantize_iq4_xs``
with no imatrix run ``quantize_row_iq4_nl_impl`` with ``ntry=7`` (a 15-scale search), not
``quantize_row_iq4_nl_ref`` (``ntry=-1``), and that search is what is reproduced.  BF16 is
``GGML_FP32_TO_BF16`` (round to nearest even, NaN made quiet).  MXFP4 has one quantizer,
``quantize_row_mxfp4_ref``, with an imatrix or without.  With an imatrix llama.cpp uses
the ``*_impl`` variants (or imatrix weights in the IQ4 search) instead; those are not
reproduced.  ``dequantize`` gives the same float32 values as ggml's ``dequantize_row_*`` and as
``gguf.quants.dequantize``.  The tests check both against llama.cpp and gguf-py byte for byte.

How: every value is computed with the C code's float32 operations in the C code's order.

* float32 throughout, never float64; ``a*b*c`` is ``(a*b)*c`` as in C.  (One exception:
  MXFP4's ``log2f``, taken as float64's log2 rounded to float32; see `localinfer_quant.mxfp4`.)
* Sequential loops (``s += ...``, running min/max/argmax with their strict comparisons and
  first-wins ties, which also decides the sign of zero results) stay sequential: the loop
  runs over the positions of a block and each step is one vector operation over every block
  (numpy's pairwise ``sum`` would round differently).
* ggml's ``nearest_int`` (the ``+ 12582912.f`` bit trick, round-half-even) is reproduced
  literally; ``roundf`` (Q8_0) rounds halves away from zero; float -> int8/uint8 casts
  truncate toward zero and keep the low byte, as x86-64 compilers emit them.
* float16 scales use round-to-nearest-even (numpy's float16 cast = ``GGML_FP32_TO_FP16``).
* No fused multiply-add: ggml-base (where the reference quantizers live) is built for the
  baseline ISA and contains no FMA instructions (checked: llama_cpp's ``libggml-base.so``
  holds none at all), so ``a*b + c`` rounds twice, as numpy does.  A ggml build that let the
  compiler contract ``a*b + c`` into FMA (``-march=native`` with ``-ffp-contract=fast`` on
  ggml-base) could differ from this module in rare last-bit cases of the K-quant and IQ4
  scale searches.

Inputs are not checked for NaN/inf; ggml's own behaviour there is implementation-defined
(BF16 excepted: its NaN and infinity handling is defined and reproduced; MXFP4's is
reproduced as x86-64 builds cast an infinite scale exponent).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

from . import floats, iquants, kquants, legacy, mxfp4

T = GGMLQuantizationType

# qtype -> (quantize(xt) -> blocks, dequantize(blocks) -> values, positions per (sub-)block)
_CODECS: dict[GGMLQuantizationType, tuple[Callable, Callable, int]] = {
    T.Q8_0: (legacy.quantize_q8_0, legacy.dequantize_q8_0, 32),
    T.Q4_0: (legacy.quantize_q4_0, legacy.dequantize_q4_0, 32),
    T.Q4_1: (legacy.quantize_q4_1, legacy.dequantize_q4_1, 32),
    T.Q5_0: (legacy.quantize_q5_0, legacy.dequantize_q5_0, 32),
    T.Q5_1: (legacy.quantize_q5_1, legacy.dequantize_q5_1, 32),
    T.Q4_K: (kquants.quantize_q4_k, kquants.dequantize_q4_k, 32),
    T.Q5_K: (kquants.quantize_q5_k, kquants.dequantize_q5_k, 32),
    T.Q6_K: (kquants.quantize_q6_k, kquants.dequantize_q6_k, 16),
    T.Q2_K: (kquants.quantize_q2_k, kquants.dequantize_q2_k, 16),
    T.Q3_K: (kquants.quantize_q3_k, kquants.dequantize_q3_k, 16),
    T.IQ4_NL: (iquants.quantize_iq4_nl, iquants.dequantize_iq4_nl, 32),
    T.IQ4_XS: (iquants.quantize_iq4_xs, iquants.dequantize_iq4_xs, 32),
    T.BF16: (floats.quantize_bf16, floats.dequantize_bf16, 1),
    T.MXFP4: (mxfp4.quantize_mxfp4, mxfp4.dequantize_mxfp4, 32),
}

SUPPORTED: frozenset[GGMLQuantizationType] = frozenset(_CODECS)

# blocks per chunk: keeps the working set of the position loops in cache
_CHUNK_ELEMENTS = 1 << 19


def _qtype(qtype) -> GGMLQuantizationType:
    try:
        qt = GGMLQuantizationType(qtype)
    except ValueError:
        raise ValueError(f"unknown GGML quantization type {qtype!r}") from None
    if qt not in SUPPORTED:
        names = ", ".join(sorted(t.name for t in SUPPORTED))
        raise ValueError(f"unsupported quantization type {qt.name}; supported: {names}")
    return qt


def row_bytes(cols: int, qtype) -> int:
    """Bytes of one quantized row of `cols` values."""
    qt = _qtype(qtype)
    block, size = GGML_QUANT_SIZES[qt]
    if cols % block:
        raise ValueError(f"{qt.name}: row length {cols} is not a multiple of the block size {block}")
    return cols // block * size


def quantize(x: np.ndarray, qtype) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, row_bytes], byte for byte what ggml's reference
    quantizer (``quantize_row_<type>_ref``) writes."""
    qt = _qtype(qtype)
    block, size = GGML_QUANT_SIZES[qt]
    x = np.asarray(x)
    if x.ndim != 2:
        raise ValueError(f"quantize expects a 2-D [rows, cols] array, got shape {x.shape}")
    if not np.issubdtype(x.dtype, np.floating):
        raise ValueError(f"quantize expects float values, got dtype {x.dtype}")
    rows, cols = x.shape
    if cols == 0 or cols % block:
        raise ValueError(f"{qt.name}: row length {cols} is not a positive multiple of the block size {block}")
    fn, _, n = _CODECS[qt]
    blocks = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, block)
    nb = blocks.shape[0]
    out = np.empty((nb, size), np.uint8)
    step = max(1, _CHUNK_ELEMENTS // block)
    for s in range(0, nb, step):
        chunk = blocks[s : s + step]
        xt = np.ascontiguousarray(chunk.reshape(-1, n).T)  # [n, sub-blocks], position-major
        out[s : s + step] = fn(xt)
    return out.reshape(rows, cols // block * size)


def dequantize(data: np.ndarray, qtype) -> np.ndarray:
    """uint8 [rows, row_bytes] -> float32 [rows, cols], the values ggml's ``dequantize_row_<type>``
    (and ``gguf.quants.dequantize``) give."""
    qt = _qtype(qtype)
    block, size = GGML_QUANT_SIZES[qt]
    data = np.asarray(data)
    if data.dtype != np.uint8:
        raise ValueError(f"dequantize expects uint8 bytes, got dtype {data.dtype}")
    if data.ndim != 2:
        raise ValueError(f"dequantize expects a 2-D [rows, row_bytes] array, got shape {data.shape}")
    rows, nbytes = data.shape
    if nbytes == 0 or nbytes % size:
        raise ValueError(f"{qt.name}: {nbytes} bytes per row is not a positive multiple of the block size {size}")
    _, fn, _ = _CODECS[qt]
    blocks = np.ascontiguousarray(data).reshape(-1, size)
    nb = blocks.shape[0]
    out = np.empty((nb, block), np.float32)
    step = max(1, _CHUNK_ELEMENTS // block)
    for s in range(0, nb, step):
        out[s : s + step] = fn(blocks[s : s + step])
    return out.reshape(rows, nbytes // size * block)
