"""Packed panels (native/c/packed.c): matrices repacked at bind time into 16 interleaved rows,
for the products of many activation rows (prefill) and of one (decode) alike.

The row-dot kernels stay the reference: the packed products sum each output in another
order, so they agree to float rounding, not bit for bit. What must hold bit for bit is that a
row's result never depends on the rows beside it (speculative verification equals decoding),
for every tile size the register tiling takes (8 rows with AVX-512, 4 with AVX2, and every
remainder), with rows past the last whole panel (the row dots) in the same product.
The float and low-bit types (packed_more.c) are held to the same, and an AVX2 build with
VNNI on 256-bit registers (as AVX-VNNI CPUs run it) joins the installed and AVX2 builds.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from localinfer_native.c_kernels import CKernels
from localinfer_native.types import QMatrix
from tests.native.blocks import E8M0_FIELDS, F16_FIELDS, random_qmatrix, reference_matmul

from .conftest import build_library, cpu_flags

PACKED = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K]
PACKED_MORE = [Q.F32, Q.F16, Q.BF16, Q.IQ4_NL, Q.IQ4_XS, Q.Q2_K, Q.Q3_K, Q.MXFP4]  # packed_more.c


@pytest.fixture(scope="session")
def avx2_vnni_library(tmp_path_factory) -> str:
    """AVX2's 16-lane halves with vpdpbusd on 256-bit registers (AVX512-VL's, standing in for
    AVX-VNNI, which takes the same path): without AVX512BW the 512-bit kernels stay out."""
    if not {"avx2", "fma", "f16c", "avx512vl", "avx512_vnni"} <= cpu_flags():
        pytest.skip("this CPU has no VNNI on 256-bit registers")
    out = tmp_path_factory.mktemp("avx2_vnni") / "_ckernels_avx2_vnni.so"
    return str(build_library(out, ["-mavx2", "-mfma", "-mf16c", "-mavx512vl", "-mavx512vnni"]))


@pytest.fixture(scope="module", params=["installed", "avx2", "avx2_vnni"])
def library(request) -> str | None:
    return None if request.param == "installed" else str(request.getfixturevalue(f"{request.param}_library"))


def product(kernels: CKernels, mats, x: np.ndarray) -> list[np.ndarray]:
    outs = [np.empty((len(x), m.rows), np.float32) for m in mats]
    kernels.matmul_op(mats)(x, outs)
    return outs


@pytest.mark.parametrize("qtype", PACKED + PACKED_MORE, ids=lambda t: t.name)
def test_packed_products_match_the_row_dots_and_the_reference(library, qtype):
    rng = np.random.default_rng(int(qtype))
    cols = 512
    m = random_qmatrix(qtype, 16 * 3 + 5, cols, rng)  # three panels and five rows for the row dots
    packed, plain = CKernels(threads=2, library=library, pack=True), CKernels(threads=2, library=library, pack=False)
    assert packed.packs(m)  # the matrix really packs
    x = rng.standard_normal((19, cols)).astype(np.float32)
    got, dots = product(packed, [m], x)[0], product(plain, [m], x)[0]
    ref = reference_matmul(m, x)
    scale = np.abs(ref).max()
    # the same 8-bit activations: only float32 rounding separates the two paths
    assert np.abs(got - dots).max() <= 1e-5 * scale
    # against float64 with unquantized activations: the activation rounding's bound
    assert np.abs(got - ref).max() <= 2e-2 * scale


@pytest.mark.parametrize("qtype", PACKED + PACKED_MORE, ids=lambda t: t.name)
def test_a_packed_row_never_depends_on_the_rows_beside_it(library, qtype):
    rng = np.random.default_rng(100 + int(qtype))
    m = random_qmatrix(qtype, 16 * 2 + 3, 256, rng)
    kernels = CKernels(threads=2, library=library)
    x = rng.standard_normal((19, 256)).astype(np.float32)
    singles = np.concatenate([product(kernels, [m], x[j : j + 1])[0] for j in range(len(x))])
    for n in (2, 3, 4, 5, 7, 8, 9, 12, 16, 17, 19):  # every tile remainder of 8 and of 4
        np.testing.assert_array_equal(product(kernels, [m], x[:n])[0], singles[:n], err_msg=f"n={n}")


@pytest.mark.parametrize("qtype", PACKED_MORE, ids=lambda t: t.name)
def test_a_matrix_of_many_rows_packs_like_an_output_head(library, qtype):
    """An lm_head's shape: thousands of rows, split between the threads in chunks of panels,
    the last rows with the row dots; still the row dots' results and independent of the batch."""
    rng = np.random.default_rng(200 + int(qtype))
    m = random_qmatrix(qtype, 16 * 160 + 9, 256, rng)
    x = rng.standard_normal((11, 256)).astype(np.float32)
    packed, plain = CKernels(threads=2, library=library, pack=True), CKernels(threads=2, library=library, pack=False)
    got, dots = product(packed, [m], x)[0], product(plain, [m], x)[0]
    assert np.abs(got - dots).max() <= 1e-5 * np.abs(dots).max()
    singles = np.concatenate([product(packed, [m], x[j : j + 1])[0] for j in range(len(x))])
    np.testing.assert_array_equal(got, singles)


@pytest.mark.parametrize("qtype", [t for t in PACKED + PACKED_MORE if t not in (Q.F32, Q.F16, Q.BF16)], ids=lambda t: t.name)
def test_extreme_blocks_do_not_overflow(library, qtype):
    """Panels of blocks whose every byte is 0x00, 0xFF or 0x5A (the largest values and scales of
    either sign) against saturated activations: no int16 or int8 step of a kernel may wrap."""
    block, size = GGML_QUANT_SIZES[qtype]
    cols = 512
    raw = np.empty((48, cols // block, size), np.uint8)
    for r, byte in enumerate([0x00, 0xFF, 0x5A] * 16):
        raw[r] = byte
    for offset in F16_FIELDS[qtype]:
        raw[:, :, offset : offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for offset in E8M0_FIELDS.get(qtype, []):  # 0xFF would be 2^127: infinite products
        raw[:, :, offset] = 121  # 2^-7
    m = QMatrix.from_array(qtype, raw.reshape(48, -1), cols)
    x = np.stack([np.full(cols, 3.0), np.full(cols, -3.0), np.tile([3.0, -3.0], cols // 2)] * 3).astype(np.float32)
    packed, plain = CKernels(threads=2, library=library, pack=True), CKernels(threads=2, library=library, pack=False)
    assert packed.packs(m)
    got, dots, ref = product(packed, [m], x)[0], product(plain, [m], x)[0], reference_matmul(m, x)
    scale = np.abs(ref).max()
    assert np.abs(got - dots).max() <= 1e-5 * scale  # the same activations
    assert np.abs(got - ref).max() <= 1e-3 * scale  # a wrapped sum would be far off


@pytest.mark.parametrize("cols", [1, 7, 99, 130])
@pytest.mark.parametrize("qtype", [Q.F32, Q.F16, Q.BF16], ids=lambda t: t.name)
def test_float_panels_take_any_row_length(library, qtype, cols):
    """A float panel's block is one column, so every k packs; the kernel walks columns in
    pairs (two accumulators a row), which leaves an odd k one column over."""
    rng = np.random.default_rng(cols)
    m = random_qmatrix(qtype, 16 * 2 + 1, cols, rng)
    packed, plain = CKernels(threads=2, library=library, pack=True), CKernels(threads=2, library=library, pack=False)
    assert packed.packs(m)
    x = rng.standard_normal((10, cols)).astype(np.float32)
    got, dots, ref = product(packed, [m], x)[0], product(plain, [m], x)[0], reference_matmul(m, x)
    assert np.abs(got - dots).max() <= 1e-5 * np.abs(ref).max()
    assert np.abs(got - ref).max() <= 1e-5 * np.abs(ref).max()
    singles = np.concatenate([product(packed, [m], x[j : j + 1])[0] for j in range(len(x))])
    np.testing.assert_array_equal(got, singles)


def test_fused_matrices_of_mixed_types_pack_each_their_own_way(library):
    """q/k/v of a Q4_K_M file mix types (Q4_K, Q6_K, and Q5_0 where rows are not a multiple
    of 256): each matrix takes its own packed kernel in one call, threads split them all."""
    rng = np.random.default_rng(7)
    mats = [random_qmatrix(Q.Q4_K, 64, 512, rng), random_qmatrix(Q.Q6_K, 32, 512, rng), random_qmatrix(Q.Q5_0, 40, 512, rng)]
    x = rng.standard_normal((13, 512)).astype(np.float32)
    kernels = CKernels(threads=2, library=library)
    fused = product(kernels, mats, x)
    for m, y in zip(mats, fused):
        np.testing.assert_array_equal(y, product(kernels, [m], x)[0])
    kernels.set_threads(1)
    for a, b in zip(product(kernels, mats, x), fused):
        np.testing.assert_array_equal(a, b)


def test_packing_can_be_turned_off(monkeypatch):
    """LOCALINFER_PACK=0 keeps every matrix as the file has it (for comparisons)."""
    m = random_qmatrix(Q.Q4_0, 32, 256, np.random.default_rng(0))
    monkeypatch.setenv("LOCALINFER_PACK", "0")
    assert not CKernels(threads=1).packs(m)
    monkeypatch.delenv("LOCALINFER_PACK")
    assert CKernels(threads=1).packs(m)


@pytest.mark.parametrize("qtype", [Q.Q4_K, *PACKED_MORE], ids=lambda t: t.name)
def test_a_portable_build_packs_nothing(portable_library, qtype):
    m = random_qmatrix(qtype, 32, 256, np.random.default_rng(0))
    assert not CKernels(threads=1, library=portable_library).packs(m)
