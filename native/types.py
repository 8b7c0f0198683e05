"""What a kernel set is: products of GGUF weight blocks, read in place, with float activations.

Both sets (C and Numba) implement the same small protocol, so the forward pass in
`localinfer.backends.native` never knows which one runs.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

Q = GGMLQuantizationType

# Block types the native engine runs. Q5_0/Q5_1 are here because llama.cpp's Q4_K_M
# falls back to them for rows whose length is not a multiple of 256 (SmolLM2's 576).
SUPPORTED_TYPES: frozenset[Q] = frozenset({Q.F32, Q.F16, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K})


@dataclass(frozen=True)
class QMatrix:
    """A [rows, cols] weight matrix as GGUF stores it: each row a run of blocks.

    `data` is uint8 [rows, row_bytes], C-contiguous, normally a view into the model's mmap.
    """

    type: Q
    data: np.ndarray
    rows: int
    cols: int

    @classmethod
    def from_array(cls, qtype: Q, data: np.ndarray, cols: int) -> QMatrix:
        """Wrap any array holding `qtype` blocks (gguf's tensor.data, or quantize() output)."""
        block, size = GGML_QUANT_SIZES[qtype]
        if cols % block:
            raise ValueError(f"{qtype.name} rows must be a multiple of {block} values, got {cols}")
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1, cols // block * size)
        return cls(qtype, raw, raw.shape[0], cols)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


# op(x, outs): for every matrix i and activation row j, outs[i][j] = mats[i] @ x[j].
# x is float32 [n, cols] C-contiguous; outs[i] is float32 [n, mats[i].rows] C-contiguous,
# written in place. n = 1 is decode; n > 1 is prefill or speculative verification.
MatmulOp = Callable[[np.ndarray, Sequence[np.ndarray]], None]


class Kernels(Protocol):
    """A kernel set: `matmul_op` binds matrices once, so the per-token call stays cheap."""

    name: str  # "c" or "numba"

    def set_threads(self, n: int) -> None: ...

    def matmul_op(self, mats: Sequence[QMatrix]) -> MatmulOp:
        """One fused call over 1-3 matrices sharing `cols` (q/k/v, gate/up): one parallel region."""
        ...

    def describe(self) -> str:
        """One line for --verbose and doctor, e.g. 'c (avx2 fma f16c, openmp, 2 threads)'."""
        ...
