"""The Numba kernel set against gguf-py's dequantizer (float64 reference products).

Float-path types (F32, F16; everything without AVX2) are checked tightly against the
plain product. Int8-path types (INT8_TYPES on AVX2) quantize x to int8 first, as ggml
does: per 32 values (Q8_0 form) for Q4_0..Q8_0, per 256 (Q8_K form) for the K-quants.
They are checked tightly against dequant(W) @ dequant(quantized x), and loosely against
the plain product.

One kernels instance for the session: each type compiles once (or loads from cache).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from localinfer_native.numba_ir import INT8_TYPES, Q8K_TYPES
from localinfer_native.numba_kernels import NumbaKernels
from localinfer_native.types import SUPPORTED_TYPES, QMatrix
from tests.native.blocks import dequantized, random_qmatrix, reference_matmul

LEGACY = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0]
KQUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]


@pytest.fixture(scope="session")
def kernels() -> NumbaKernels:
    k = NumbaKernels()
    k.set_threads(2)
    return k


def quantized_x(x: np.ndarray) -> np.ndarray:
    """x as the int8 path sees it: per 32 values d = max|x|/127, q = rint(x * 127/max|x|)."""
    b = x.astype(np.float32).reshape(x.shape[0], -1, 32)
    amax = np.abs(b).max(axis=-1, keepdims=True)
    d = amax / np.float32(127)
    with np.errstate(divide="ignore"):
        inv = np.where(amax > 0, np.float32(127) / amax, np.float32(0)).astype(np.float32)
    q = np.rint(b * inv)
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def quantized_x_k(x: np.ndarray) -> np.ndarray:
    """x as the K-quants' int8 path sees it: ggml's quantize_row_q8_K_ref per 256 values.

    m = the value of largest |x| (signed, first), iscale = -127/m, q = min(127, rint(iscale*x)),
    d = 1/iscale; all in float32, and zero when m is.
    """
    b = x.astype(np.float32).reshape(x.shape[0], -1, 256)
    m = np.take_along_axis(b, np.abs(b).argmax(axis=-1)[..., None], -1)
    with np.errstate(divide="ignore"):
        iscale = np.where(m != 0, np.float32(-127) / m, np.float32(0)).astype(np.float32)
        d = np.where(iscale != 0, np.float32(1) / iscale, np.float32(0)).astype(np.float32)
    q = np.minimum(np.float32(127), np.rint(b * iscale))
    assert q.min() >= -127
    return (q.astype(np.float64) * d.astype(np.float64)).reshape(x.shape)


def check(m: QMatrix, x: np.ndarray, out: np.ndarray) -> None:
    w = dequantized(m)
    if m.type in INT8_TYPES:
        xq = quantized_x_k(x) if m.type in Q8K_TYPES else quantized_x(x)
        tight = xq @ w.T
        scale = np.abs(xq) @ np.abs(w).T + 1e-6
        assert np.all(np.abs(out - tight) <= 2e-5 * scale), np.abs(out - tight).max()
        ref = x.astype(np.float64) @ w.T
        loose = np.abs(x.astype(np.float64)) @ np.abs(w).T
        assert np.all(np.abs(out - ref) <= 2e-2 * loose + 1e-6)
    else:
        ref = reference_matmul(m, x)
        scale = np.abs(x.astype(np.float64)) @ np.abs(w).T + 1e-6
        assert np.all(np.abs(out - ref) <= 2e-5 * scale), np.abs(out - ref).max()


def shapes(t: Q) -> list[int]:
    if t in KQUANTS:
        return [256, 512, 768]
    if t in LEGACY:
        return [576, 1536, 96]  # 96: an odd number of blocks
    return [576, 1536, 37]


CASES = [(t, cols) for t in sorted(SUPPORTED_TYPES) for cols in shapes(t)]


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("qtype,cols", CASES, ids=[f"{t.name}-{c}" for t, c in CASES])
def test_every_type(kernels, qtype, cols, n):
    rng = np.random.default_rng(cols * 7 + n)
    m = random_qmatrix(qtype, 37, cols, rng)
    x = rng.standard_normal((n, cols)).astype(np.float32)
    out = np.full((n, m.rows), np.nan, np.float32)
    kernels.matmul_op([m])(x, [out])
    check(m, x, out)


@pytest.mark.parametrize("types", [(Q.Q6_K, Q.Q4_K, Q.Q8_0), (Q.Q4_1, Q.Q4_1, Q.Q4_1), (Q.Q4_1, Q.Q4_1)])
def test_fused_ops(kernels, types):
    cols = 512
    rng = np.random.default_rng(len(types))
    mats = [random_qmatrix(t, rows, cols, rng) for t, rows in zip(types, (24, 8, 16))]
    op = kernels.matmul_op(mats)
    for n in (1, 5):
        x = rng.standard_normal((n, cols)).astype(np.float32)
        outs = [np.full((n, m.rows), np.nan, np.float32) for m in mats]
        op(x, outs)
        for m, out in zip(mats, outs):
            check(m, x, out)


@pytest.mark.parametrize("qtype", [Q.Q4_K, Q.Q5_K, Q.Q6_K])
def test_kquants_int8_edges(kernels, qtype):
    """The Q8_K quantization of x: an all-zero super-block, one whose extreme is negative,
    one whose extreme is positive, and huge values (the integer sums must not overflow)."""
    cols = 1024
    rng = np.random.default_rng(int(qtype))
    m = random_qmatrix(qtype, 19, cols, rng)
    x = rng.standard_normal((4, cols)).astype(np.float32)
    x[:, :256] = 0.0
    x[0, 300] = -40.0
    x[1, 600] = 40.0
    x[2] *= np.float32(1e30)
    x[3, 768:] = np.float32(1e-30) * rng.standard_normal(256).astype(np.float32)
    out = np.full((4, m.rows), np.nan, np.float32)
    kernels.matmul_op([m])(x, [out])
    assert np.all(np.isfinite(out))
    check(m, x, out)


def test_kquants_extreme_blocks(kernels):
    """Weights at the ends of their ranges (every q maximal, every scale 63, Q6_K's scale
    -128 and 127) against x at +-127 after quantization: the integer dots must not saturate."""
    rng = np.random.default_rng(11)
    cols = 512
    for qtype in (Q.Q4_K, Q.Q5_K, Q.Q6_K):
        m = random_qmatrix(qtype, 6, cols, rng)
        data = m.data.copy().reshape(6, -1, m.data.shape[1] // (cols // 256))
        if qtype == Q.Q6_K:
            data[:, :, :192] = 0xFF  # q = 63 everywhere
            data[:3, :, 192:208] = 0x80  # scale -128
            data[3:, :, 192:208] = 0x7F  # scale 127
        else:
            data[:, :, 4:16] = 0xFF  # every 6-bit scale and min 63
            data[:, :, 16:] = 0xFF  # q maximal (and Q5_K's high bits set)
        m = QMatrix(qtype, data.reshape(6, -1), 6, cols)
        for sign in (1.0, -1.0):
            x = np.full((2, cols), sign, np.float32)
            x[1, ::2] = -sign
            out = np.full((2, 6), np.nan, np.float32)
            kernels.matmul_op([m])(x, [out])
            check(m, x, out)


def test_real_model_tensors(kernels):
    import gguf
    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    reader = gguf.GGUFReader(local_path(resolve(None)))
    tensors = {t.name: t for t in reader.tensors}
    rng = np.random.default_rng(3)
    for name, rows in (("blk.0.attn_q.weight", None), ("blk.0.ffn_down.weight", None), ("token_embd.weight", 300)):
        t = tensors[name]
        data = t.data if rows is None else t.data[:rows]
        m = QMatrix.from_array(t.tensor_type, data, int(t.shape[0]))
        x = rng.standard_normal((3, m.cols)).astype(np.float32)
        out = np.empty((3, m.rows), np.float32)
        kernels.matmul_op([m])(x, [out])
        check(m, x, out)
    # q/k/v fused, as the forward pass binds them.
    mats = [QMatrix.from_array(tensors[f"blk.1.attn_{p}.weight"].tensor_type, tensors[f"blk.1.attn_{p}.weight"].data, 576) for p in "qkv"]
    x = rng.standard_normal((1, 576)).astype(np.float32)
    outs = [np.empty((1, m.rows), np.float32) for m in mats]
    kernels.matmul_op(mats)(x, outs)
    for m, out in zip(mats, outs):
        check(m, x, out)


def test_bad_inputs(kernels):
    rng = np.random.default_rng(0)
    a = random_qmatrix(Q.Q4_0, 8, 64, rng)
    b = random_qmatrix(Q.Q4_0, 8, 96, rng)
    with pytest.raises(ValueError):
        kernels.matmul_op([a, b])
    with pytest.raises(ValueError):
        kernels.matmul_op([])
    op = kernels.matmul_op([a])
    with pytest.raises(ValueError):
        op(np.zeros((1, 96), np.float32), [np.zeros((1, 8), np.float32)])
    with pytest.raises(ValueError):
        op(np.zeros((1, 64), np.float32), [np.zeros((1, 7), np.float32)])
    bq = QMatrix(Q.IQ2_XXS, np.zeros((1, 66), np.uint8), 1, 256)
    with pytest.raises(ValueError):
        kernels.matmul_op([bq])


def test_threads_and_describe(kernels):
    kernels.set_threads(1)
    assert "1 threads" in kernels.describe() and kernels.describe().startswith("numba")
    rng = np.random.default_rng(5)
    m = random_qmatrix(Q.Q8_0, 50, 64, rng)
    x = rng.standard_normal((2, 64)).astype(np.float32)
    out = np.empty((2, 50), np.float32)
    kernels.matmul_op([m])(x, [out])
    check(m, x, out)
    kernels.set_threads(2)
    assert "2 threads" in kernels.describe()


@pytest.mark.parametrize("qtype", sorted(SUPPORTED_TYPES, key=int), ids=lambda t: t.name)
def test_a_row_never_depends_on_the_rows_beside_it(kernels, qtype):
    """As for the C kernels: row j of an n-row product is the 1-row product, bit for bit, so a
    speculative verify gives exactly the logits decoding would."""
    rng = np.random.default_rng(int(qtype))
    cols = 512
    m = random_qmatrix(qtype, 37, cols, rng)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    op = kernels.matmul_op([m])

    def product(rows: np.ndarray) -> np.ndarray:
        out = np.empty((len(rows), m.rows), np.float32)
        op(np.ascontiguousarray(rows), (out,))
        return out

    singles = np.concatenate([product(x[j : j + 1]) for j in range(len(x))])
    for n in range(2, len(x) + 1):
        np.testing.assert_array_equal(product(x[:n]), singles[:n])
