"""BF16, the one float type among the codecs: ggml's ``GGML_FP32_TO_BF16``
(``ggml_compute_fp32_to_bf16``, what ``ggml_fp32_to_bf16_row_ref`` and so llama.cpp's
quantizer run) and ``GGML_BF16_TO_FP32``.

* round to nearest even on the upper 16 bits of the float32 (``(u + 0x7fff + lsb) >> 16``),
  so values past the largest bfloat16 become infinities;
* NaN: the upper 16 bits with the quiet bit (64) forced on, no rounding;
* subnormals are kept (no flush to zero).

Blocks are single values: ``xt[1, n]`` in, ``[n, 2]`` little-endian bytes out.
"""

from __future__ import annotations

import numpy as np


def quantize_bf16(xt: np.ndarray) -> np.ndarray:
    u = np.ascontiguousarray(xt, dtype=np.float32).reshape(-1).view(np.uint32)
    nan = (u & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000)
    rounded = (u + (np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1)))) >> np.uint32(16)  # no NaN reaches 0xffff8000
    h = np.where(nan, (u >> np.uint32(16)) | np.uint32(64), rounded)
    return h.astype("<u2").view(np.uint8).reshape(-1, 2)


def dequantize_bf16(b: np.ndarray) -> np.ndarray:
    h = np.ascontiguousarray(b).view("<u2").astype(np.uint32)  # [n, 1]
    return (h << np.uint32(16)).view(np.float32)
