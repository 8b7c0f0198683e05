"""The C kernels' AMX path (native/c/amx.c): the leading n_fast rows of a product through
AMX tiles, on CPUs that have them (Intel Xeon Sapphire Rapids and later); skipped elsewhere.

Those rows quantize their activations per 32 values for every weight type (the row dots use
Q8_K's 256 for the K-quants) and add the blocks' float terms in another order, so they are
checked against gguf-py with that rounding, and for the one property the forward pass needs:
a row's result depends on that row alone, never on how many rows run beside it.
"""

from __future__ import annotations

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
            (y,) = run(kc, [m], x, n)
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
    cols = cols_for(qtype)[0]
    m = random_qmatrix(qtype, 37, cols, rng)
    x = rng.standard_normal((35, cols)).astype(np.float32)
    fast = np.concatenate([run(kc, [m], x[j : j + 1], 1)[0] for j in range(len(x))])
    dots = np.concatenate([run(kc, [m], x[j : j + 1], 0)[0] for j in range(len(x))])
    assert not np.array_equal(fast, dots)  # the two paths really differ, so the checks below see the path taken
    for n, n_fast in ((2, 2), (16, 16), (17, 17), (35, 35), (20, 13), (35, 16), (9, 0)):
        (y,) = run(kc, [m], x[:n], n_fast)
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
