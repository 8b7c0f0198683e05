"""The C kernels' AMX paths (native/c/amx.c), on CPUs that have them (Intel Xeon Sapphire
Rapids and later); skipped elsewhere.

- The exact path: a product of legacy types (Q4_0 .. Q8_0) from 4 rows up, every row, with
  the row dots' float operations, so its results equal the row dots' bit for bit.
- The fast path: the leading n_fast rows of any other product AMX runs (K-quants, or legacy
  types fused with them). Those rows quantize their activations per 32 values for every
  weight type (the row dots use Q8_K's 256 for the K-quants) and add the blocks' float terms
  in another order, so they are checked against gguf-py with that rounding, and for the one
  property the forward pass needs: a row's result depends on that row alone, never on how
  many rows run beside it.
"""

from __future__ import annotations

import ctypes

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from localinfer_native.c_kernels import CKernels
from localinfer_native.types import QMatrix
from tests.native.blocks import dequantized, random_qmatrix
from tests.native.test_c_kernels import K_TYPES, LEGACY_TYPES, cols_for, q8_0_values, rounding_bound

pytestmark = pytest.mark.skipif("amx" not in CKernels().describe(), reason="no AMX on this CPU (or LOCALINFER_AMX=0)")

AMX_TYPES = sorted(LEGACY_TYPES | K_TYPES, key=int)


@pytest.fixture(scope="module")
def kc() -> CKernels:
    return CKernels(threads=2)


def run(kc: CKernels, mats: list[QMatrix], x: np.ndarray, n_fast: int) -> list[np.ndarray]:
    outs = [np.full((len(x), m.rows), np.nan, np.float32) for m in mats]
    kc.matmul_op(mats)(x, outs, n_fast)
    return outs


def exact_path(kc: CKernels, m: QMatrix, x: np.ndarray) -> np.ndarray:
    """m @ x[j] for every row j through li_amx_rows_exact itself, called as matmul.c calls it."""
    lib, p = kc._lib, ctypes.c_void_p
    n, k = x.shape
    nb, tiles = k // 32, -(-n // 16)
    qs = np.zeros(tiles * 16 * k, np.int8)
    d, s = np.zeros(tiles * nb * 16, np.float32), np.zeros(tiles * nb * 16, np.float32)
    x = np.ascontiguousarray(x, np.float32)
    lib.li_quantize_q8a(p(x.ctypes.data), ctypes.c_int64(k), p(qs.ctypes.data), p(d.ctypes.data), p(s.ctypes.data),
                        ctypes.c_int64(0), ctypes.c_int64(n * nb), ctypes.c_int(2))  # LI_Q8A_TILES
    lib.li_amx_exact_scratch_bytes.restype = ctypes.c_int64
    raw = np.zeros(lib.li_amx_exact_scratch_bytes(ctypes.c_int64(k)) + 64, np.uint8)
    scratch = raw.ctypes.data + (-raw.ctypes.data) % 64
    y = np.full((n, m.rows), np.nan, np.float32)
    lib.li_amx_rows_exact(ctypes.c_int(int(m.type)), p(m.data.ctypes.data), ctypes.c_int64(m.data.shape[1]),
                          ctypes.c_int64(0), ctypes.c_int64(m.rows), ctypes.c_int64(k), p(qs.ctypes.data),
                          p(d.ctypes.data), p(s.ctypes.data), ctypes.c_int64(n), p(y.ctypes.data),
                          ctypes.c_int64(m.rows), p(scratch))
    return y


@pytest.mark.parametrize("qtype", sorted(LEGACY_TYPES, key=int), ids=lambda t: t.name)
def test_the_exact_path_equals_the_row_dots_bit_for_bit(kc, qtype):
    """Every legacy type, row lengths with and without blocks after the last octet of 8, a
    ragged last panel of weight rows (75) and ragged tiles of activation rows."""
    rng = np.random.default_rng(int(qtype) + 300)
    for cols in (32, 96, 288, 576, 1536):
        m = random_qmatrix(qtype, 75, cols, rng)
        x = rng.standard_normal((33, cols)).astype(np.float32)
        x[:, :32] *= 30
        dots = np.concatenate([run(kc, [m], x[j : j + 1], 0)[0] for j in range(len(x))])
        for n in (1, 2, 8, 16, 17, 33):
            np.testing.assert_array_equal(exact_path(kc, m, x[:n]), dots[:n], err_msg=f"{cols} columns, {n} rows")
            np.testing.assert_array_equal(run(kc, [m], x[:n], 0)[0], dots[:n])  # through li_matmul


def fast_op(kc: CKernels, m: QMatrix, x: np.ndarray, n_fast: int) -> np.ndarray:
    """m's rows of a product that takes the fast path: a legacy type goes there only fused
    with a type the exact path does not run (as in a Q4_K_M model's attention)."""
    if m.type in K_TYPES:
        return run(kc, [m], x, n_fast)[0]
    companion = random_qmatrix(Q.Q4_K, 16, m.cols, np.random.default_rng(0)) if m.cols % 256 == 0 else None
    return run(kc, [m, companion] if companion else [m], x, n_fast)[0]


@pytest.mark.parametrize("qtype", AMX_TYPES, ids=lambda t: t.name)
def test_fast_rows_against_gguf(kc, qtype):
    """Every type, a ragged last panel (75 rows) and ragged last tiles of activation rows."""
    rng = np.random.default_rng(int(qtype) + 100)
    for cols in cols_for(qtype):
        m = random_qmatrix(qtype, 75, cols, rng)
        w = dequantized(m)
        for n in (1, 17, 40):
            x = rng.standard_normal((n, cols)).astype(np.float32)
            x[:, :32] *= 30
            y = fast_op(kc, m, x, n)
            xq = q8_0_values(x)
            scale = np.abs(xq) @ np.abs(w).T + 1e-30
            err = np.abs(y - xq @ w.T) / scale
            assert err.max() < 2e-5, f"{qtype.name} {cols} n={n}: worst relative error {err.max():.2e}"
            plain = x.astype(np.float64) @ w.T
            assert np.all(np.abs(y - plain) <= rounding_bound(Q.Q8_0, w, x.astype(np.float64)) + 1e-5 * scale)


@pytest.mark.parametrize("qtype", AMX_TYPES, ids=lambda t: t.name)
def test_a_fast_row_depends_on_its_row_alone(kc, qtype):
    """Row j of any n-row product with n_fast rows: the fast product of row j alone where
    j < n_fast, the row dots' product of row j alone after, bit for bit."""
    rng = np.random.default_rng(int(qtype) + 200)
    cols = 512 if qtype in K_TYPES else 1536
    m = random_qmatrix(qtype, 37, cols, rng)
    x = rng.standard_normal((35, cols)).astype(np.float32)
    fast = np.concatenate([fast_op(kc, m, x[j : j + 1], 1) for j in range(len(x))])
    dots = np.concatenate([fast_op(kc, m, x[j : j + 1], 0) for j in range(len(x))])
    assert not np.array_equal(fast, dots)  # the two paths really differ, so the checks below see the path taken
    for n, n_fast in ((2, 2), (16, 16), (17, 17), (35, 35), (20, 13), (35, 16), (9, 0)):
        y = fast_op(kc, m, x[:n], n_fast)
        np.testing.assert_array_equal(y[:n_fast], fast[:n_fast])
        np.testing.assert_array_equal(y[n_fast:], dots[n_fast:n])


def test_an_op_with_a_float_matrix_keeps_every_row_on_the_dots(kc):
    rng = np.random.default_rng(5)
    mats = [random_qmatrix(Q.Q4_0, 40, 256, rng), random_qmatrix(Q.F16, 24, 256, rng)]
    x = rng.standard_normal((20, 256)).astype(np.float32)
    for a, b in zip(run(kc, mats, x, 20), run(kc, mats, x, 0)):
        np.testing.assert_array_equal(a, b)


def test_fused_matrices_and_threads_agree(kc):
    """q/k/v-like fused ops split between threads give what each matrix gives alone."""
    rng = np.random.default_rng(6)
    mats = [random_qmatrix(Q.Q5_0, 96, 576, rng), random_qmatrix(Q.Q8_0, 40, 576, rng)]
    x = rng.standard_normal((30, 576)).astype(np.float32)
    together = run(kc, mats, x, 30)
    for threads in (1, 3):
        kc.set_threads(threads)
        for m, y in zip(mats, together):
            np.testing.assert_array_equal(run(kc, [m], x, 30)[0], y)
    kc.set_threads(2)
