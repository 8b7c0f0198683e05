"""The Numba kernel set's low-bit types (Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4) and BF16 against gguf-py's
dequantizer, on both paths: this CPU's (int8 activations where it has AVX2, as ggml: Q8_K form
for Q2_K/Q3_K/IQ4_XS, Q8_0 form for IQ4_NL and MXFP4) and the portable float path a CPU without AVX2 runs
(`NumbaKernels(float_path=True)`).

The int8 path is checked tightly against dequant(W) @ dequant(quantized x), the float path
against dequant(W) @ x (float64). Every n-row product must equal the 1-row products bit for
bit. Each (type, path) compiles one kernel (cached on disk): 11 in all.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from localinfer_native import kernel_types
from localinfer_native.numba_ir import INT8_TYPES, Q8K_TYPES
from localinfer_native.numba_kernels import NumbaKernels
from localinfer_native.types import QMatrix
from tests.conftest import read_gguf
from tests.native.blocks import dequantized, random_qmatrix
from tests.native.test_numba_kernels import quantized_x, quantized_x_k

LOWBIT = [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4]
# Row lengths: one block, an odd number of blocks past a pair, and an even number (BF16: a tail).
_COLS = {Q.Q2_K: [256, 768, 1536], Q.Q3_K: [256, 768, 1536], Q.IQ4_XS: [256, 768, 1536], Q.IQ4_NL: [32, 96, 576],
         Q.MXFP4: [32, 96, 576], Q.BF16: [8, 37, 576]}
# (type, float path forced): the float path only where this CPU would take the int8 one.
CASES = [(t, False) for t in [*LOWBIT, Q.BF16]] + [(t, True) for t in LOWBIT if t in INT8_TYPES]


def case_id(case: tuple[Q, bool]) -> str:
    return f"{case[0].name}-{'float' if case[1] else 'native'}"


@pytest.fixture(scope="module")
def kernel_sets() -> dict[bool, NumbaKernels]:
    sets = {False: NumbaKernels(), True: NumbaKernels(float_path=True)}
    for k in sets.values():
        k.set_threads(2)
    return sets


def check(m: QMatrix, x: np.ndarray, out: np.ndarray, float_path: bool) -> None:
    """out against float64 products of gguf-py's dequantized weights, with x as the kernel takes it."""
    w = dequantized(m)
    int8 = m.type in INT8_TYPES and not float_path
    xr = (quantized_x_k(x) if m.type in Q8K_TYPES else quantized_x(x)) if int8 else x.astype(np.float64)
    ref = xr @ w.T
    scale = np.abs(xr) @ np.abs(w).T + 1e-6
    assert np.all(np.abs(out - ref) <= 2e-5 * scale), np.abs(out - ref).max()
    if int8:  # loosely, the product with x itself
        plain = x.astype(np.float64) @ w.T
        assert np.all(np.abs(out - plain) <= 2e-2 * (np.abs(x.astype(np.float64)) @ np.abs(w).T) + 1e-6)


def product(kernels: NumbaKernels, m: QMatrix, x: np.ndarray) -> np.ndarray:
    out = np.full((len(x), m.rows), np.nan, np.float32)
    kernels.matmul_op([m])(np.ascontiguousarray(x), [out])
    return out


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_products_and_batch_independence(kernel_sets, case):
    """n = 1 .. 9 activation rows (one at a time, by fours, by eights): each row's product is the
    1-row product bit for bit, and that matches the reference."""
    qtype, float_path = case
    kernels = kernel_sets[float_path]
    for cols in _COLS[qtype]:
        rng = np.random.default_rng(int(qtype) * 1000 + cols)
        m = random_qmatrix(qtype, 37, cols, rng)
        x = rng.standard_normal((9, cols)).astype(np.float32)
        singles = np.concatenate([product(kernels, m, x[j : j + 1]) for j in range(len(x))])
        check(m, x, singles, float_path)
        for n in (2, 3, 5, 8, 9):
            np.testing.assert_array_equal(product(kernels, m, x[:n]), singles[:n], err_msg=f"{qtype.name} cols={cols} n={n}")


def extreme_matrix(qtype: Q, rows: int, cols: int, rng: np.random.Generator) -> QMatrix:
    """Weights at the ends of their ranges: the first half of the rows at the largest value and
    scale, the rest at the most negative (Q3_K's -4 with scale -32, IQ4's -127, MXFP4's -12)."""
    m = random_qmatrix(qtype, rows, cols, rng)
    block, size = GGML_QUANT_SIZES[qtype]
    data = m.data.copy().reshape(rows, cols // block, size)
    top, bottom = data[: rows // 2], data[rows // 2 :]
    if qtype == Q.Q2_K:
        data[:, :, :80] = 0xFF  # q = 3, scale and min 15
    elif qtype == Q.Q3_K:
        top[:, :, :108], bottom[:, :, :108] = 0xFF, 0x00  # 3 with scale 31; -4 with scale -32
    elif qtype == Q.IQ4_NL:
        top[:, :, 2:], bottom[:, :, 2:] = 0xFF, 0x00  # 113; -127
    elif qtype == Q.MXFP4:
        top[:, :, 1:], bottom[:, :, 1:] = 0x77, 0xFF  # 12; -12 (with the random sane exponents)
    else:
        top[:, :, 2:], bottom[:, :, 2:] = 0xFF, 0x00  # 113 with scale 31; -127 with scale -32
    return QMatrix(qtype, data.reshape(rows, -1), rows, cols)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] in LOWBIT], ids=case_id)
def test_extreme_blocks(kernel_sets, case):
    """Largest weights against x at +-127 after quantization: the integer dots must not saturate."""
    qtype, float_path = case
    cols = 512
    m = extreme_matrix(qtype, 6, cols, np.random.default_rng(int(qtype)))
    for sign in (1.0, -1.0):
        x = np.full((2, cols), sign, np.float32)
        x[1, ::2] = -sign
        check(m, x, product(kernel_sets[float_path], m, x), float_path)


@pytest.mark.parametrize("case", [c for c in CASES if c[0] == Q.MXFP4], ids=case_id)
def test_mxfp4_at_every_exponent(kernel_sets, case):
    """Row e (0..250) has every block at E8M0 exponent e: each scale 2^(e - 128), the float32
    subnormals of e < 2 included, against activations that keep every product a normal float32
    (large ones for the small scales, small ones for the large; past 250 products overflow)."""
    qtype, float_path = case
    rng = np.random.default_rng(39)
    cols, exponents = 288, np.arange(251)
    raw = random_qmatrix(qtype, len(exponents), cols, rng).data.reshape(len(exponents), -1, 17).copy()
    raw[:, :, 0] = exponents[:, None]
    x = rng.standard_normal((3, cols)).astype(np.float32)
    for rows, xs in ((exponents < 128, x * np.float32(2.0**18)), (exponents >= 128, x * np.float32(2.0**-7))):
        m = QMatrix.from_array(qtype, raw[rows].reshape(int(rows.sum()), -1), cols)
        check(m, xs, product(kernel_sets[float_path], m, xs), float_path)


@pytest.fixture(scope="module")
def model_weights(model_path) -> dict[int, np.ndarray]:
    """Real weights by row length: 64 rows of the embedded model's ffn_down (1536) and attn_q (576)."""
    import gguf

    tensors = {t.name: t for t in read_gguf(model_path).tensors}
    out = {}
    for name in ("blk.0.ffn_down.weight", "blk.0.attn_q.weight"):
        t = tensors[name]
        cols = int(t.shape[0])
        out[cols] = gguf.quants.dequantize(t.data[:64], t.tensor_type).reshape(64, cols).astype(np.float32)
    return out


@pytest.mark.parametrize("qtype", [*LOWBIT, Q.BF16], ids=lambda t: t.name)
def test_blocks_from_llama_cpps_quantizer(kernel_sets, ggml_quantize, model_weights, qtype):
    """Blocks as llama.cpp writes them (its scales and their signs, not random bytes), on this CPU's path."""
    rng = np.random.default_rng(7)
    for cols, w in model_weights.items():
        if cols % GGML_QUANT_SIZES[qtype][0]:
            continue
        m = ggml_quantize(qtype, w)
        x = (rng.standard_normal((5, cols)) * rng.uniform(0.1, 3.0, cols)).astype(np.float32)
        check(m, x, product(kernel_sets[False], m, x), False)


def test_declares_its_types():
    assert {*LOWBIT, Q.BF16} <= NumbaKernels.supported_types
    assert kernel_types("numba") == NumbaKernels.supported_types  # what the engine's capabilities report
    k = NumbaKernels()
    with pytest.raises(ValueError, match="do not support IQ2_XXS"):
        k.matmul_op([QMatrix(Q.IQ2_XXS, np.zeros((1, 66), np.uint8), 1, 256)])
