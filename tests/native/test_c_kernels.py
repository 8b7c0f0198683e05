"""The C kernel set (native/c, localinfer_native.c_kernels) against gguf-py's dequantizer.

Activations are quantized to 8 bits before the integer dots (Q8_0 values for the legacy
types, Q8_K for the K-quants), so the tight reference is dequant(W) @ dequant(quantize(x)):
only float32 rounding separates it from the kernels. The plain float64 product is checked
too, within the bound the activation rounding allows. Every type runs through the
installed library (built for this CPU: AVX2, or AVX-512 with VNNI's byte dots where it has
them), through an AVX2-only build and through a portable build, both compiled in the test.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from localinfer_native import KernelsUnavailable
from localinfer_native.types import SUPPORTED_TYPES, QMatrix
from tests.native.blocks import dequantized, random_qmatrix

try:
    from localinfer_native.c_kernels import CKernels

    CKernels()
except (ImportError, OSError, KernelsUnavailable) as e:  # pragma: no cover - depends on the install
    # Without a C compiler the install leaves them out on purpose (auto falls back to Numba);
    # with one, a missing library is a broken build and must fail, not hide.
    if shutil.which("gcc") or shutil.which("cc"):
        raise AssertionError(f"a C compiler is here but the C kernels did not build or load ({e}); run pip install -e . -v") from e
    pytest.skip(f"no C compiler, so no C kernels ({e})", allow_module_level=True)

K_TYPES = {Q.Q4_K, Q.Q5_K, Q.Q6_K}
FLOAT_TYPES = {Q.F32, Q.F16}
LEGACY_TYPES = {Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0}
ALL_TYPES = sorted(SUPPORTED_TYPES, key=int)
assert set(ALL_TYPES) == K_TYPES | FLOAT_TYPES | LEGACY_TYPES


# ------------------------------------------------------------------ the installed build


@pytest.fixture(scope="module")
def kc() -> CKernels:
    return CKernels(threads=2)


# ------------------------------------------------------------------ references


def q8_0_values(x: np.ndarray) -> np.ndarray:
    """x as the legacy dots see it: gguf-py's Q8_0 (ggml's reference rounding), dequantized."""
    return dequantize(quantize(x.astype(np.float32), Q.Q8_0), Q.Q8_0).reshape(x.shape).astype(np.float64)


def q8_k_values(x: np.ndarray) -> np.ndarray:
    """x as the K-quant dots see it: numpy port of ggml's quantize_row_q8_K_ref, dequantized.

    Per 256 values: the value of largest |x| (the first, on ties) sets iscale = -127/max;
    q = min(127, round-half-even(iscale*x)); d = 1/iscale; all in float32.
    """
    blocks = x.astype(np.float32).reshape(-1, 256)
    out = np.zeros(blocks.shape, np.float64)
    for i, b in enumerate(blocks):
        j = int(np.argmax(np.abs(b)))
        if b[j] == 0:
            continue
        iscale = np.float32(-127.0) / b[j]
        q = np.minimum(127, np.rint(iscale * b)).astype(np.float64)
        out[i] = np.float64(np.float32(1.0) / iscale) * q
    return out.reshape(x.shape)


def activation_values(qtype: Q, x: np.ndarray) -> np.ndarray:
    if qtype in FLOAT_TYPES:
        return x.astype(np.float64)
    return q8_k_values(x) if qtype in K_TYPES else q8_0_values(x)


def rounding_bound(qtype: Q, w: np.ndarray, x: np.ndarray) -> np.ndarray:
    """[n, rows] bound of |W @ xq - W @ x|: each value moves by at most half its block's step."""
    if qtype in FLOAT_TYPES:
        return np.zeros((x.shape[0], w.shape[0]))
    block, steps = (256, 127.0) if qtype in K_TYPES else (32, 127.0)
    amax = np.abs(x).reshape(x.shape[0], -1, block).max(axis=2)
    half_step = np.repeat(amax / steps / 2 * 1.001, block, axis=1)  # fp16 scales round up a little
    return half_step @ np.abs(w).T


def check(m: QMatrix, x: np.ndarray, y: np.ndarray) -> None:
    """y (the kernel's [n, rows]) against both references."""
    w = dequantized(m)
    xq = activation_values(m.type, x)
    scale = np.abs(xq) @ np.abs(w).T + 1e-30
    exact = xq @ w.T
    err = np.abs(y - exact) / scale
    assert err.max() < 2e-5, f"{m.type.name} {m.rows}x{m.cols}: worst relative error {err.max():.2e} (row {np.unravel_index(err.argmax(), err.shape)})"
    plain = x.astype(np.float64) @ w.T
    assert np.all(np.abs(y - plain) <= rounding_bound(m.type, w, x.astype(np.float64)) + 1e-5 * scale)


def run(kernels: CKernels, mats: list[QMatrix], x: np.ndarray) -> list[np.ndarray]:
    outs = [np.full((len(x), m.rows), np.nan, np.float32) for m in mats]
    kernels.matmul_op(mats)(x, outs)
    return outs


def cols_for(qtype: Q) -> list[int]:
    return [256, 512, 1536] if qtype in K_TYPES else [576, 1536, 96]


# ------------------------------------------------------------------ products


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_every_type_against_gguf(kernels, qtype):
    rng = np.random.default_rng(int(qtype))
    for cols in cols_for(qtype):
        m = random_qmatrix(qtype, 75, cols, rng)  # 75 rows: the threads' split is not aligned
        for n in (1, 5):
            x = rng.standard_normal((n, cols)).astype(np.float32)
            x[:, :32] *= 30  # one block with much larger values than the others
            (y,) = run(kernels, [m], x)
            check(m, x, y)


@pytest.mark.parametrize("qtype", sorted(LEGACY_TYPES, key=int), ids=lambda t: t.name)
def test_real_quantization_and_zero_blocks(kernels, qtype):
    """Weights quantized by gguf-py (not random bytes), activations with all-zero blocks."""
    rng = np.random.default_rng(7)
    w = rng.standard_normal((40, 576)).astype(np.float32)
    m = QMatrix.from_array(qtype, quantize(w, qtype), 576)
    x = rng.standard_normal((3, 576)).astype(np.float32)
    x[:, 64:128] = 0
    x[1] = 0
    (y,) = run(kernels, [m], x)
    check(m, x, y)
    assert np.all(y[1] == 0)


def test_fused_ops_mixed_types(kernels):
    rng = np.random.default_rng(3)
    groups = [
        [(Q.Q4_1, 576), (Q.Q8_0, 192), (Q.F32, 64)],
        [(Q.Q4_K, 300), (Q.Q6_K, 33), (Q.Q5_0, 128)],
        [(Q.Q5_1, 100), (Q.F16, 260)],
        [(Q.Q5_K, 17), (Q.Q4_0, 90), (Q.Q8_0, 1)],
    ]
    for group in groups:
        mats = [random_qmatrix(t, rows, 512, rng) for t, rows in group]
        for n in (1, 5):
            x = rng.standard_normal((n, 512)).astype(np.float32)
            for m, y in zip(mats, run(kernels, mats, x)):
                check(m, x, y)


def test_prefill_tiles_and_threads_agree(kc):
    """n rows run in tiles of 4; every thread count gives bit-identical results."""
    rng = np.random.default_rng(11)
    m1, m2 = random_qmatrix(Q.Q4_1, 333, 512, rng), random_qmatrix(Q.Q4_K, 77, 512, rng)
    x = rng.standard_normal((11, 512)).astype(np.float32)
    results = []
    for threads in (1, 2, 3):
        kc.set_threads(threads)
        results.append(run(kc, [m1, m2], x))
    kc.set_threads(2)
    for r in results[1:]:
        for a, b in zip(results[0], r):
            np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("qtype", ALL_TYPES, ids=lambda t: t.name)
def test_a_row_never_depends_on_the_rows_beside_it(kernels, qtype):
    """Row j of an n-row product is the 1-row product of row j, bit for bit, for every tile
    shape: a K-row speculative verify must give exactly the logits decoding would (a last-bit
    difference is enough to flip an 8-bit activation rounding and then a greedy token)."""
    rng = np.random.default_rng(int(qtype))
    cols = cols_for(qtype)[-1]
    m = random_qmatrix(qtype, 37, cols, rng)
    x = rng.standard_normal((9, cols)).astype(np.float32)
    singles = np.concatenate([run(kernels, [m], x[j : j + 1])[0] for j in range(len(x))])
    for n in range(2, len(x) + 1):
        np.testing.assert_array_equal(run(kernels, [m], x[:n])[0], singles[:n])


# ------------------------------------------------------------------ activation quantizers


def test_q8_0_quantizer_bit_exact(kernels):
    rng = np.random.default_rng(5)
    x = rng.standard_normal(32 * 40).astype(np.float32) * rng.uniform(0.01, 100, 32 * 40).astype(np.float32)
    x[:32] = 0
    # halves after scaling: amax 127 makes the scale 1, so 2.5 must round away from zero
    x[32:64] = np.array([127.0, -2.5, 2.5, 0.5, -0.5, 1.5, -1.5, 126.5] * 4, np.float32)
    np.testing.assert_array_equal(kernels.quantize_q8_0(x), quantize(x, Q.Q8_0).reshape(-1))


def test_q8_1_quantizer(kernels):
    rng = np.random.default_rng(6)
    x = rng.standard_normal(32 * 20).astype(np.float32)
    got = kernels.quantize_q8_1(x).reshape(-1, 36)
    ref = quantize(x, Q.Q8_0).reshape(-1, 34)
    np.testing.assert_array_equal(got[:, :2], ref[:, :2])  # d
    np.testing.assert_array_equal(got[:, 4:], ref[:, 2:])  # qs
    blocks = x.reshape(-1, 32)
    d = np.abs(blocks).max(axis=1) / np.float32(127)
    s = (got[:, 4:].view(np.int8).astype(np.int32).sum(axis=1).astype(np.float32) * d).astype(np.float16)
    np.testing.assert_array_equal(got[:, 2:4].copy().view(np.float16).reshape(-1), s)


# ------------------------------------------------------------------ the real model


@pytest.fixture(scope="module")
def model_tensors():
    import gguf

    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    reader = gguf.GGUFReader(local_path(resolve(None)))  # the embedded model ships with the install
    return {t.name: t for t in reader.tensors}


def _qmatrix(tensor, max_rows: int | None = None) -> QMatrix:
    cols = int(tensor.shape[0])
    m = QMatrix.from_array(tensor.tensor_type, tensor.data, cols)
    if max_rows and m.rows > max_rows:
        m = QMatrix(m.type, m.data[:max_rows], max_rows, cols)
    return m


def test_real_tensors(kc, model_tensors):
    rng = np.random.default_rng(13)
    t = model_tensors
    q, k, v = (_qmatrix(t[f"blk.3.attn_{p}.weight"]) for p in "qkv")
    gate, up, down = (_qmatrix(t[f"blk.3.ffn_{p}.weight"]) for p in ("gate", "up", "down"))
    head = _qmatrix(t["token_embd.weight"], max_rows=3000)
    # the shapes the model's own metadata gives (GGUF order: row length first)
    shape = {name: tuple(int(d) for d in t[name].shape) for name in ("blk.3.attn_q.weight", "blk.3.attn_k.weight", "blk.3.ffn_gate.weight", "blk.3.ffn_down.weight")}
    assert (q.cols, q.rows) == shape["blk.3.attn_q.weight"] and k.rows == shape["blk.3.attn_k.weight"][1]
    assert gate.rows == shape["blk.3.ffn_gate.weight"][1] and down.cols == shape["blk.3.ffn_down.weight"][0]
    assert head.type == Q.Q8_0
    for n in (1, 5):
        x = rng.standard_normal((n, 576)).astype(np.float32)
        for mats in ([q, k, v], [gate, up], [head]):
            for m, y in zip(mats, run(kc, mats, x)):
                check(m, x, y)
        h = rng.standard_normal((n, 1536)).astype(np.float32)
        (y,) = run(kc, [down], h)
        check(down, h, y)


# ------------------------------------------------------------------ the op's contract


def test_op_validates_its_arguments(kc):
    rng = np.random.default_rng(17)
    m = random_qmatrix(Q.Q4_0, 64, 128, rng)
    op = kc.matmul_op([m])
    x = rng.standard_normal((2, 128)).astype(np.float32)
    y = np.zeros((2, 64), np.float32)
    op(x, [y])
    bad = [
        (x.astype(np.float64), [y]),
        (x[:, :96], [y]),
        (x, [np.zeros((2, 63), np.float32)]),
        (x, [np.zeros((2, 64), np.float64)]),
        (x, [np.zeros((64, 2), np.float32).T]),
        (np.asfortranarray(np.zeros((2, 128), np.float32)), [y]),
        (x, [y, y]),
    ]
    for bx, bouts in bad:
        with pytest.raises(ValueError):
            op(bx, bouts)
    ro = x.copy()
    ro.flags.writeable = False  # read-only activations are fine (e.g. a view of the mmap)
    y2 = np.zeros_like(y)
    op(ro, [y2])
    np.testing.assert_array_equal(y, y2)
    op(np.zeros((0, 128), np.float32), [np.zeros((0, 64), np.float32)])
    with pytest.raises(ValueError):
        kc.matmul_op([m, random_qmatrix(Q.Q4_0, 8, 256, rng)])  # different row lengths
    with pytest.raises(ValueError):
        kc.matmul_op([m] * 4)
    with pytest.raises(ValueError):
        kc.matmul_op([QMatrix(Q.TQ2_0, np.zeros((1, 66), np.uint8), 1, 256)])  # a type it does not run


def test_describe_and_threads():
    kc = CKernels(threads=3)
    assert kc.name == "c"
    assert kc.describe().startswith("c (") and "3 threads" in kc.describe()
    rng = np.random.default_rng(19)
    m = random_qmatrix(Q.Q8_0, 256, 256, rng)
    op = kc.matmul_op([m])
    x = rng.standard_normal((1, 256)).astype(np.float32)
    (before,) = run(kc, [m], x)
    kc.set_threads(1)  # reaches ops already bound
    assert "1 thread)" in kc.describe()
    y = np.zeros((1, 256), np.float32)
    op(x, [y])
    np.testing.assert_array_equal(before, y)
    with pytest.raises(ValueError):
        kc.set_threads(0)


def test_load_kernels_picks_c():
    from localinfer_native import load_kernels

    assert load_kernels("c", threads=2).name == "c"
    assert load_kernels("auto").name == "c"


def test_the_installed_library_is_built_from_these_sources():
    """A failed rebuild (the extension is optional, so pip only warns) leaves the last library
    in place: in an editable install that is the old code, and every test here would run it."""
    from localinfer_native.c_kernels import library_path

    from .conftest import SRC

    lib = library_path()
    if lib is None or SRC.parent not in lib.parents:
        pytest.skip("not an editable install: the library was built with the package")
    newest = max(p.stat().st_mtime for p in [*SRC.glob("*.c"), *SRC.glob("*.h")])
    assert lib.stat().st_mtime >= newest, f"{lib.name} is older than native/c: rebuild with pip install -e . -v and read its errors"
