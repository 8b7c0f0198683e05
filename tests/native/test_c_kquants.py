"""K-quant C kernels (native/c/kquants.c): the Q8_K quantizer and the Q4_K/Q5_K/Q6_K dots.

The file is compiled here on its own, twice (the AVX2 path with -march=native and the
portable scalar path with plain -O2), and called through ctypes, so these tests do not
depend on the C framework's loader. Values are checked against gguf-py's dequantizer.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from localinfer_native.types import QMatrix
from tests.native.blocks import dequantized, random_qmatrix

SRC = Path(__file__).resolve().parents[2] / "native" / "c"
QK_K = 256
Q8K_DTYPE = np.dtype([("d", "<f4"), ("qs", "i1", (QK_K,)), ("bsums", "<i2", (QK_K // 16,))])
assert Q8K_DTYPE.itemsize == GGML_QUANT_SIZES[Q.Q8_K][1]  # ggml's block_q8_K, as gguf-py's table gives it
K_TYPES = [Q.Q4_K, Q.Q5_K, Q.Q6_K]
DOT_NAMES = {Q.Q4_K: "li_vec_dot_q4_K_q8_K", Q.Q5_K: "li_vec_dot_q5_K_q8_K", Q.Q6_K: "li_vec_dot_q6_K_q8_K"}

FLAVOURS = {"simd": ["-O3", "-march=native"], "scalar": ["-O2"]}


def _compile(out_dir: Path, name: str, flags: list[str]) -> ctypes.CDLL:
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler")
    lib = out_dir / f"kquants_{name}.so"
    subprocess.run(
        [cc, *flags, "-std=c11", "-Wall", "-Wextra", "-Werror", "-shared", "-fPIC", "-I", str(SRC),
         str(SRC / "kquants.c"), "-o", str(lib), "-lm"],
        check=True, capture_output=True, text=True,
    )
    dll = ctypes.CDLL(str(lib))
    dll.li_quantize_row_q8_K.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    dll.li_quantize_row_q8_K.restype = None
    for fn in DOT_NAMES.values():
        getattr(dll, fn).argtypes = [ctypes.c_int64, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        getattr(dll, fn).restype = None
    return dll


@pytest.fixture(scope="session")
def _libs(tmp_path_factory) -> dict[str, ctypes.CDLL]:
    out = tmp_path_factory.mktemp("kquants")
    return {name: _compile(out, name, flags) for name, flags in FLAVOURS.items()}


@pytest.fixture(params=list(FLAVOURS))
def lib(request, _libs) -> ctypes.CDLL:
    return _libs[request.param]


# ------------------------------------------------------------------ references


def q8k_reference(x: np.ndarray) -> np.ndarray:
    """numpy port of ggml's quantize_row_q8_K_ref, float32 arithmetic throughout."""
    x = np.ascontiguousarray(x, dtype=np.float32).reshape(-1, QK_K)
    out = np.zeros(len(x), dtype=Q8K_DTYPE)
    for i, row in enumerate(x):
        ax = np.abs(row)
        j = int(np.argmax(ax))  # first index of the largest |x|, as the strict '>' scan finds
        if ax[j] == 0:
            continue
        iscale = np.float32(-127.0) / row[j]
        v = (iscale * row).astype(np.float32) + np.float32(12582912.0)
        q = (v.view(np.int32) & 0x007FFFFF) - 0x00400000
        q = np.minimum(127, q).astype(np.int8)
        out[i]["qs"] = q
        out[i]["bsums"] = q.astype(np.int32).reshape(16, 16).sum(axis=1).astype(np.int16)
        out[i]["d"] = np.float32(1.0) / iscale
    return out


def quantize_c(lib: ctypes.CDLL, x: np.ndarray) -> np.ndarray:
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.zeros(x.size // QK_K, dtype=Q8K_DTYPE)
    lib.li_quantize_row_q8_K(x.ctypes.data, out.ctypes.data, x.size)
    return out


def dequant_q8k(y: np.ndarray) -> np.ndarray:
    return (y["d"].astype(np.float64)[:, None] * y["qs"].astype(np.float64)).reshape(-1)


def dot_c(lib: ctypes.CDLL, m: QMatrix, y: np.ndarray) -> np.ndarray:
    fn = getattr(lib, DOT_NAMES[m.type])
    res = np.zeros(m.rows, dtype=np.float32)
    base, stride = m.data.ctypes.data, m.data.strides[0]
    for r in range(m.rows):
        fn(m.cols, res.ctypes.data + 4 * r, base + r * stride, y.ctypes.data)
    return res


def check_matvec(lib: ctypes.CDLL, m: QMatrix, x: np.ndarray) -> None:
    w = dequantized(m)
    y = quantize_c(lib, x)
    got = dot_c(lib, m, y).astype(np.float64)
    xq = dequant_q8k(y)
    # 1) against the exact product with the quantized activations: only float rounding
    exact = w @ xq
    scale = np.abs(w) @ np.abs(xq) + 1e-30
    np.testing.assert_array_less(np.abs(got - exact), 1e-5 * scale)
    # 2) against the float activations: the Q8_K rounding bound, sum |w| * d_block / 2
    half_step = np.repeat(np.abs(y["d"]).astype(np.float64) * 0.5, QK_K)
    bound = np.abs(w) @ (half_step * 1.0001) + 2e-5 * scale + 1e-30
    np.testing.assert_array_less(np.abs(got - w @ x.astype(np.float64)), bound)


# ------------------------------------------------------------------ Q8_K quantizer


def _q8k_rows(rng: np.random.Generator) -> list[np.ndarray]:
    rows = [rng.standard_normal(QK_K * 4).astype(np.float32) * s for s in (1e-3, 1.0, 37.0)]
    rows.append(np.zeros(QK_K * 2, dtype=np.float32))  # all zeros
    one_neg = rng.standard_normal(QK_K).astype(np.float32)
    one_neg[77] = -500.0  # one large negative value sets the scale
    rows.append(one_neg)
    one_pos = rng.uniform(-1, 1, QK_K).astype(np.float32)
    one_pos[200] = 9.0
    rows.append(one_pos)
    tie = rng.uniform(-1, 1, QK_K).astype(np.float32)
    tie[[10, 20]] = [-3.0, 3.0]  # equal |x|: the first one's sign wins
    rows.append(tie)
    halves = (rng.integers(-254, 255, QK_K) / 2).astype(np.float32)  # many exact .5 ties
    halves[0] = -127.0
    rows.append(halves)
    mixed = np.concatenate([np.zeros(QK_K, np.float32), rng.standard_normal(QK_K).astype(np.float32)])
    rows.append(mixed)  # a zero block next to a normal one
    rows.append(rng.standard_normal(QK_K * 6).astype(np.float32) ** 3)  # heavy tails
    return rows


def test_q8k_quantizer_bit_exact(lib):
    rng = np.random.default_rng(1)
    for x in _q8k_rows(rng):
        got, want = quantize_c(lib, x), q8k_reference(x)
        np.testing.assert_array_equal(got["qs"], want["qs"])
        np.testing.assert_array_equal(got["bsums"], want["bsums"])
        np.testing.assert_array_equal(got["d"].view(np.uint32), want["d"].view(np.uint32))


def test_q8k_tie_takes_first_sign(lib):
    x = np.zeros(QK_K, dtype=np.float32)
    x[3], x[9] = 2.0, -2.0
    y = quantize_c(lib, x)
    assert y["qs"][0][3] == -127 and y["qs"][0][9] == 127
    assert y["d"][0] == np.float32(1.0) / (np.float32(-127.0) / np.float32(2.0))


# ------------------------------------------------------------------ dots, random blocks


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
@pytest.mark.parametrize("cols", [256, 512, 1536])
def test_dot_random_blocks(lib, qtype, cols):
    rng = np.random.default_rng(cols + int(qtype))
    m = random_qmatrix(qtype, 24, cols, rng)
    x = rng.standard_normal(cols).astype(np.float32)
    check_matvec(lib, m, x)


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_dot_extreme_blocks(lib, qtype):
    """All-ones bytes (largest quants, scales and mins) against saturated activations."""
    block, size = GGML_QUANT_SIZES[qtype]
    raw = np.full((3, 4 * size), 0xFF, dtype=np.uint8).reshape(3, 4, size)
    d_offsets = {Q.Q4_K: [0, 2], Q.Q5_K: [0, 2], Q.Q6_K: [208]}[qtype]
    for off in d_offsets:
        raw[:, :, off : off + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    if qtype == Q.Q6_K:
        raw[1, :, 192:208] = 0x80  # scales of -128
        raw[2, :, 192:208] = 0x7F
    m = QMatrix.from_array(qtype, raw.reshape(3, -1), 4 * block)
    for x in (np.full(4 * block, 3.0, np.float32), np.full(4 * block, -3.0, np.float32),
              np.tile(np.array([3.0, -3.0], np.float32), 2 * block)):
        check_matvec(lib, m, x)


def test_decoding_matches_gguf_one_hot(lib):
    """A one-hot activation picks single weights: each must equal gguf-py's value."""
    rng = np.random.default_rng(5)
    for qtype in K_TYPES:
        m = random_qmatrix(qtype, 4, QK_K, rng)
        w = dequantized(m)
        for pos in (0, 1, 15, 16, 31, 32, 63, 64, 100, 127, 128, 200, 255):
            x = np.zeros(QK_K, np.float32)
            x[pos] = -1.0  # quantizes to qs = -127, d = 1/127
            y = quantize_c(lib, x)
            assert y["qs"][0][pos] == -127
            got = dot_c(lib, m, y).astype(np.float64)
            want = w[:, pos] * (float(y["d"][0]) * -127)
            np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-9, err_msg=f"{qtype.name} pos {pos}")


# ------------------------------------------------------------------ dots, real tensors from llama.cpp


def _requantized_k_tensors(out_dir: Path, ftype_name: str) -> dict[Q, QMatrix]:
    """The first K-type tensor of each kind (ffn_down preferred) in the embedded model
    requantized by llama.cpp to `ftype_name` (a LLAMA_FTYPE_MOSTLY_* constant)."""
    import llama_cpp  # a dependency: its absence is a failure, not a skip
    from gguf import GGUFReader

    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    src = str(local_path(resolve(None)))
    dst = str(out_dir / f"model-{ftype_name}.gguf")
    p = llama_cpp.llama_model_quantize_default_params()
    p.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype_name}")
    p.allow_requantize = True
    p.nthread = 2
    assert llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(p)) == 0, f"llama.cpp could not quantize the embedded model to {ftype_name}"
    tensors = sorted(GGUFReader(dst).tensors, key=lambda t: "ffn_down" not in t.name)
    found: dict[Q, QMatrix] = {}
    for t in tensors:
        qtype = Q(t.tensor_type)
        if qtype in K_TYPES and qtype not in found:
            found[qtype] = QMatrix.from_array(qtype, np.array(t.data), int(t.shape[0]))
    return found


@pytest.fixture(scope="session")
def real_tensors(tmp_path_factory):
    """Q4_K and Q6_K (ffn_down, 1536 columns) from a Q4_K_M requantization of the
    embedded model; Q5_K from a Q5_K_M one."""
    out = tmp_path_factory.mktemp("requant")
    found = _requantized_k_tensors(out, "Q4_K_M")
    assert Q.Q4_K in found and Q.Q6_K in found
    if Q.Q5_K not in found:
        found[Q.Q5_K] = _requantized_k_tensors(out, "Q5_K_M")[Q.Q5_K]
    return found


@pytest.mark.parametrize("qtype", K_TYPES, ids=lambda t: t.name)
def test_dot_real_tensors(lib, real_tensors, qtype):
    full = real_tensors[qtype]
    rows = min(full.rows, 96)
    m = QMatrix(full.type, full.data[:rows], rows, full.cols)
    rng = np.random.default_rng(7)
    x = (rng.standard_normal(full.cols) * rng.uniform(0.1, 3.0, full.cols)).astype(np.float32)
    check_matvec(lib, m, x)
