"""The Numba kernel set: products of GGUF weight blocks (read in place) with float32 rows.

One jitted kernel, `matmul`, does every product: one matrix in one parallel region over
its rows; for each weight row, every activation row (n = 1 decode, n > 1 prefill), up to
eight of them in one pass that unpacks each block once. A fused op (q/k/v, gate/up) calls
it once per matrix. The row dot products themselves are LLVM vector IR
(`numba_ir.rowdot`, `rowdot4`, `rowdot8`), one specialization per block type.

Each weight array is viewed (for free) as a one-byte record dtype that names its block
type, so `matmul` is compiled once per type, lazily, and `cache=True` makes the next start
load it from disk instead of compiling. (A kernel over three matrices in one region was
compiled per combination of types instead: a Q4_K_M or IQ4_XS file mixes four or five
types in its fused ops, and a fresh install spent minutes compiling them.)
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numba
import numpy as np

from localinfer_native.numba_ir import BLOCK, BYTES, F16_NATIVE, FLOAT_TYPES, NUMBA_TYPES, matmul, tag_dtype
from localinfer_native.numba_ops import NumbaOps
from localinfer_native.moe import MixtureOfExperts
from localinfer_native.types import DecodePlan, MatmulOp, MoeFFN, MoeOp, QMatrix


class NumbaKernels(NumbaOps):
    """Kernels in Numba: portable (any CPU LLVM targets), compiled per block type on first use."""

    name = "numba"
    supported_types = NUMBA_TYPES  # the block types matmul_op takes
    tiled_keys: frozenset[str] = frozenset()  # rows, one position each

    def __init__(self, float_path: bool = False) -> None:
        """float_path=True: every type takes the portable float path, as on a CPU without
        AVX2 (the tests cover that path with it)."""
        self._float_path = float_path
        self._threads = numba.get_num_threads()
        # Numba's thread count is per calling thread: remember which threads have ours.
        self._ready: set[int] = set()
        self.warm_up()  # the layer ops: compiled or loaded from cache now, not on the first token

    def set_threads(self, n: int) -> None:
        self._threads = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
        self._ready.clear()
        self._apply_threads()

    def _apply_threads(self) -> None:
        numba.set_num_threads(self._threads)
        self._ready.add(threading.get_ident())

    def describe(self) -> str:
        try:
            layer = numba.threading_layer()
        except ValueError:  # no parallel region ran yet
            layer = numba.config.THREADING_LAYER
        f16 = "f16c" if F16_NATIVE else "soft f16"
        return f"numba {numba.__version__} ({layer} threading layer, {f16}, {self._threads} threads)"

    def moe_op(self, ffn: MoeFFN) -> MoeOp:
        """moe.py's loop over the experts' bound products."""
        return MixtureOfExperts(ffn, self)

    def decode_step(self, plan: DecodePlan) -> None:
        """None: Numba's parallel regions are entered from Python, so a fused step would save
        little; the forward calls the operations one by one."""
        return None

    def _tagged(self, m: QMatrix) -> np.ndarray:
        if m.type not in self.supported_types:
            raise ValueError(f"the numba kernels do not support {m.type.name} weights")
        block, size = BLOCK[m.type], BYTES[m.type]
        if m.type in FLOAT_TYPES:
            block, size = 1, size // 8
        if m.cols % block:
            raise ValueError(f"{m.type.name} rows must be a multiple of {block} values, got {m.cols}")
        row_bytes = m.cols // block * size
        data = m.data
        if data.dtype != np.uint8 or data.ndim != 2 or data.shape != (m.rows, row_bytes) or not data.flags.c_contiguous:
            raise ValueError(f"{m.type.name} weights must be uint8 [{m.rows}, {row_bytes}] C-contiguous, got {data.dtype} {data.shape}")
        return data.view(tag_dtype(m.type, self._float_path))

    def matmul_op(self, mats: Sequence[QMatrix]) -> MatmulOp:
        mats = list(mats)
        if not 1 <= len(mats) <= 3:
            raise ValueError(f"matmul_op takes 1 to 3 matrices, got {len(mats)}")
        cols = mats[0].cols
        if cols <= 0 or any(m.cols != cols for m in mats):
            raise ValueError("fused matrices must share a positive number of columns")
        ws = [self._tagged(m) for m in mats]
        for w, m in zip(ws, mats):  # compile (or load from the cache) now, not in the first token: an empty batch
            matmul(w, np.empty((0, cols), np.float32), np.empty((0, m.rows), np.float32), cols)

        kern, ready, get_ident, apply_threads = matmul, self._ready, threading.get_ident, self._apply_threads
        if len(mats) == 1:
            (w1,) = ws

            def op(x, outs, n_fast=0):
                if get_ident() not in ready:
                    apply_threads()
                kern(w1, x, outs[0], cols)
        else:
            def op(x, outs, n_fast=0):
                if get_ident() not in ready:
                    apply_threads()
                if len(outs) != len(ws):
                    raise ValueError(f"this op writes {len(ws)} outputs, got {len(outs)}")
                for w, o in zip(ws, outs):
                    kern(w, x, o, cols)
        return op
