"""A kernel set that multiplies by fully dequantized weights (gguf-py) in float64.

Too slow and too big for real use, but independent of our kernels: the forward pass is
tested on it, so a kernel bug and a forward-pass bug cannot hide each other.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from localinfer_native import MatmulOp, QMatrix
from tests.native.blocks import dequantized


class ReferenceKernels:
    name = "reference"

    def __init__(self) -> None:
        self._cache: dict[int, np.ndarray] = {}

    def set_threads(self, n: int) -> None:
        pass

    def describe(self) -> str:
        return "reference (gguf-py dequantize, float64)"

    def _weights(self, m: QMatrix) -> np.ndarray:
        key = m.data.__array_interface__["data"][0]
        if key not in self._cache:
            self._cache[key] = dequantized(m)
        return self._cache[key]

    def matmul_op(self, mats: Sequence[QMatrix]) -> MatmulOp:
        def op(x: np.ndarray, outs: Sequence[np.ndarray], n_fast: int = 0) -> None:
            for m, out in zip(mats, outs):
                out[...] = x.astype(np.float64) @ self._weights(m).T

        return op
