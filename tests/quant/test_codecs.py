"""Our numpy codecs (localinfer_quant.codecs) against ggml, byte for byte.

* dequantize == gguf-py's dequantizer, exactly, on the embedded model (Q4_1, Q8_0) and on
  models llama.cpp made of every other type;
* quantize == llama.cpp's own quantizer (llama_model_quantize, no imatrix, `pure`), byte for
  byte, on the real weights of an F32 model made from the embedded one (IQ4: on the weights
  compared, through the ggml_quantize_chunk it calls per tensor); and every tensor of the
  mixed files people download (Q2_K, Q3_K_M as llama.cpp lays them out);
* quantize == ggml_quantize_chunk (the function llama_model_quantize calls) on random and
  edge-case data: zeros, signed zeros, constants, ties, tiny and huge values;
* MXFP4, which llama.cpp writes only into a mixture of experts' expert tensors: quantize ==
  llama.cpp's quantizer (MXFP4_MOE) on a tiny qwen3moe's experts, and == ggml_quantize_chunk
  at every scale exponent's edges; dequantize == ggml's own to_float and gguf-py's for every
  scale byte and code;
* round trips on random data with bounded error, and clear errors for bad input.
"""

from __future__ import annotations

import ctypes
import os
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q
from gguf.quants import dequantize as gguf_dequantize

from localinfer.modelfile import inspect
from localinfer_quant import codecs
from ..conftest import THREADS, read_gguf
from ..native.test_architectures import N_LAYER, first_tokens, tiny_model, vocabulary  # noqa: F401 - vocabulary: the fixture

LEGACY = [Q.Q8_0, Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1]
K_TYPES = [Q.Q2_K, Q.Q3_K, Q.Q4_K, Q.Q5_K, Q.Q6_K]
IQ4 = [Q.IQ4_NL, Q.IQ4_XS]
ALL = LEGACY + K_TYPES + IQ4 + [Q.BF16]  # what llama.cpp writes into a dense model
EVERY = ALL + [Q.MXFP4]  # and MXFP4, which it writes only into experts (MXFP4_MOE)
# 256-element blocks: of SmolLM2's matrices only the 1536-wide ffn_down rows take them
SUPER_BLOCK = K_TYPES + [Q.IQ4_XS]

# qtype -> the llama.cpp ftype that (with params.pure) asks for it
FTYPES = {
    Q.Q8_0: "LLAMA_FTYPE_MOSTLY_Q8_0",
    Q.Q4_0: "LLAMA_FTYPE_MOSTLY_Q4_0",
    Q.Q4_1: "LLAMA_FTYPE_MOSTLY_Q4_1",
    Q.Q5_0: "LLAMA_FTYPE_MOSTLY_Q5_0",
    Q.Q5_1: "LLAMA_FTYPE_MOSTLY_Q5_1",
    Q.Q4_K: "LLAMA_FTYPE_MOSTLY_Q4_K_S",
    Q.Q5_K: "LLAMA_FTYPE_MOSTLY_Q5_K_S",
    Q.Q6_K: "LLAMA_FTYPE_MOSTLY_Q6_K",
    Q.Q2_K: "LLAMA_FTYPE_MOSTLY_Q2_K",
    Q.Q3_K: "LLAMA_FTYPE_MOSTLY_Q3_K_M",  # with `pure`, every tensor Q3_K (no M mix)
    Q.BF16: "LLAMA_FTYPE_MOSTLY_BF16",
}


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _rows(t) -> np.ndarray:
    """A GGUFReader tensor's data as [rows, last-dim] (bytes for quantized types)."""
    data = np.asarray(t.data)
    return data.reshape(-1, data.shape[-1])


class _Tensor:
    """One tensor of a llama.cpp-made model, read through the header offsets that
    localinfer.modelfile finds (GGUFReader spends seconds per model on the tokenizer
    metadata; the embedded model is read with GGUFReader below)."""

    def __init__(self, path: Path, info) -> None:
        self.name, self.tensor_type = info.name, Q(info.type)
        self._path, self._info = path, info

    @property
    def rows(self) -> np.ndarray:
        block, size = GGML_QUANT_SIZES[self.tensor_type]
        cols = self._info.shape[0]
        if self.tensor_type == Q.F32:
            dtype, width = np.float32, cols
        else:
            dtype, width = np.uint8, cols // block * size
        data = np.fromfile(self._path, dtype=dtype, count=self._info.nbytes // np.dtype(dtype).itemsize, offset=self._info.offset)
        return data.reshape(-1, width)


def _read(path: Path) -> list[_Tensor]:
    return [_Tensor(path, info) for info in inspect(path).tensors]


# --- models made by llama.cpp ------------------------------------------------------------


def _quantize_pure(src: Path, dst: Path, ftype: int, pure: bool = True) -> Path:
    """llama_model_quantize with `pure`: every tensor the requested type where its rows allow
    (without: the ftype's own mix of types, as downloaded files have)."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.pure = pure
    params.allow_requantize = True
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


@pytest.fixture(scope="session")
def codecs_f32_path(f32_path: Path) -> Path:
    """The embedded model widened to F32 by llama.cpp (tests/conftest.py)."""
    return f32_path


@pytest.fixture(scope="session")
def f32_model(codecs_f32_path: Path) -> dict[str, np.ndarray]:
    """name -> float32 [rows, cols] for every matrix of the F32 model."""
    tensors = {}
    for t in _read(codecs_f32_path):
        assert t.tensor_type == Q.F32, t.name
        if len(t._info.shape) == 2:
            tensors[t.name] = t.rows
    return tensors


class _Chunk:
    """A tensor llama.cpp quantized alone (ggml_quantize_chunk), named as in the model."""

    def __init__(self, name: str, tensor_type: Q, rows: np.ndarray) -> None:
        self.name, self.tensor_type, self.rows = name, tensor_type, rows


@pytest.fixture(scope="session")
def pure_models(codecs_f32_path: Path, f32_model, tmp_path_factory: pytest.TempPathFactory):
    """qtype -> the tensors of the F32 model quantized by llama.cpp to that type (made on first
    use). IQ4: only the tensors _sample compares, each quantized alone by the function
    llama_model_quantize calls per tensor, since llama.cpp's IQ4 search costs ~45 CPU-s a
    whole model here (so the file-level choice of types is asserted for the other types only)."""
    import llama_cpp

    folder = tmp_path_factory.mktemp("codecs-pure")
    cache: dict[Q, list] = {}
    quantize_chunk = _ggml_quantize_chunk()

    def get(qtype: Q) -> list:
        if qtype not in cache and qtype in IQ4:
            # IQ4_NL: the matrices an IQ4_XS file falls back to it for (rows no multiple of 256)
            wanted = [_Chunk(name, qtype, np.empty(0)) for name, w in f32_model.items() if (w.shape[1] % 256 == 0) == (qtype == Q.IQ4_XS)]
            cache[qtype] = [_Chunk(t.name, qtype, quantize_chunk(f32_model[t.name], qtype)) for t in _sample(wanted, qtype)]
        elif qtype not in cache:
            cache[qtype] = _read(_quantize_pure(codecs_f32_path, folder / f"{qtype.name}.gguf", getattr(llama_cpp, FTYPES[qtype])))
        return cache[qtype]

    return get


def _layer(name: str) -> int:
    return int(name.split(".")[1]) if name.startswith("blk.") else -1


def _sample(tensors: list, qtype: Q) -> list:
    """The tensors our quantizer is compared on: all 30 K-quant ones (the ffn_down matrices)
    and BF16's 211; for the 32-blocks, to keep the suite fast, the token embeddings
    (49152 x 576) and every matrix of every third layer (0, 3, ..., 27: 71 of the 211).  The
    IQ4 search runs ~4x slower in numpy: IQ4_XS every third ffn_down (10 of 30), IQ4_NL every
    matrix of layers 0, 15 and 29 (21 of 211)."""
    if qtype in K_TYPES or qtype == Q.BF16:
        return tensors
    if qtype == Q.IQ4_XS:
        return [t for t in tensors if _layer(t.name) % 3 == 0]
    if qtype == Q.IQ4_NL:
        return [t for t in tensors if _layer(t.name) in (0, 15, 29)]
    return [t for t in tensors if t.name == "token_embd.weight" or (t.name.startswith("blk.") and _layer(t.name) % 3 == 0)]


def _in_sample_layers(name: str) -> bool:
    return name == "token_embd.weight" or name.split(".")[:2] in (["blk", "0"], ["blk", "15"], ["blk", "29"])


# --- dequantize == gguf-py ---------------------------------------------------------------


def test_dequantize_embedded_model_matches_gguf(model_path: Path):
    seen = set()
    for t in read_gguf(model_path).tensors:
        if t.tensor_type not in codecs.SUPPORTED or not _in_sample_layers(t.name):
            continue
        data = _rows(t)
        ours = codecs.dequantize(data, t.tensor_type)
        ref = gguf_dequantize(data, t.tensor_type).reshape(ours.shape)
        assert ours.dtype == np.float32
        assert np.array_equal(_bits(ours), _bits(ref)), t.name
        seen.add(t.tensor_type)
    assert seen == {Q.Q4_1, Q.Q8_0}


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_dequantize_llamacpp_models_match_gguf(qtype: Q, pure_models):
    tensors = [t for t in pure_models(qtype) if t.tensor_type == qtype and t.name != "token_embd.weight"]
    assert tensors
    for t in tensors[:: max(1, len(tensors) // 6)]:
        data = t.rows
        ours = codecs.dequantize(data, qtype)
        ref = gguf_dequantize(data, qtype).reshape(ours.shape)
        assert np.array_equal(_bits(ours), _bits(ref)), t.name


# --- quantize == llama.cpp ---------------------------------------------------------------


@pytest.mark.parametrize("qtype", ALL, ids=lambda q: q.name)
def test_quantize_matches_llamacpp_on_model_weights(qtype: Q, f32_model, pure_models):
    got = [t for t in pure_models(qtype) if t.tensor_type == qtype]
    # SmolLM2's 576-wide rows are no multiple of 256: llama.cpp falls back there, so the
    # 256-block tensors are exactly the 30 ffn_down matrices (rows of 1536)
    ffn_down = {f"blk.{i}.ffn_down.weight" for i in range(30)}
    if qtype in IQ4:
        pass  # tensors quantized one by one (pure_models): no file chose their types
    elif qtype in SUPER_BLOCK:
        assert {t.name for t in got} == ffn_down
    else:
        assert {t.name for t in got} == set(f32_model)  # pure: every matrix has the type
    sample = _sample(got, qtype)
    assert sample
    for t in sample:
        _assert_same_bytes(codecs.quantize(f32_model[t.name], qtype), t.rows, qtype, t.name)


def _assert_same_bytes(ours: np.ndarray, ref: np.ndarray, qtype: Q, name: str) -> None:
    assert ours.shape == ref.shape and ours.dtype == np.uint8, name
    if not np.array_equal(ours, ref):
        block = GGML_QUANT_SIZES[qtype][1]
        bad = np.flatnonzero((ours.reshape(-1, block) != ref.reshape(-1, block)).any(axis=1))
        pytest.fail(f"{name}: {bad.size} of {ours.size // block} {qtype.name} blocks differ (first {bad[:5]})")


@pytest.mark.parametrize("mix", ["Q2_K", "Q3_K_M"])
def test_quantize_matches_llamacpp_mixed_files(mix: str, codecs_f32_path: Path, f32_model, tmp_path: Path):
    """The mixes people download, llama.cpp picking a type per tensor.  On SmolLM2 (576-wide
    rows but for ffn_down) Q2_K gives Q3_K ffn_down, Q4_0 and Q8_0; Q3_K_M gives Q4_K/Q5_K
    ffn_down, Q5_0/Q5_1, Q4_0 and Q8_0.  Every tensor must be byte-identical to ours."""
    import llama_cpp

    ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{mix}")
    tensors = _read(_quantize_pure(codecs_f32_path, tmp_path / f"{mix}.gguf", ftype, pure=False))
    # the sample layers, and all 30 ffn_down matrices (the 256-block types)
    checked = [t for t in tensors if t.name in f32_model and (_in_sample_layers(t.name) or t.name.endswith("ffn_down.weight"))]
    assert {t.tensor_type for t in checked} <= codecs.SUPPORTED
    assert {t.tensor_type for t in checked} & set(SUPER_BLOCK)
    for t in checked:
        _assert_same_bytes(codecs.quantize(f32_model[t.name], t.tensor_type), t.rows, t.tensor_type, f"{mix} {t.name}")


# --- quantize == ggml_quantize_chunk on synthetic data -----------------------------------


@pytest.fixture(scope="module")
def ggml_quantize_chunk():
    return _ggml_quantize_chunk()


def _ggml_base() -> ctypes.CDLL:
    import llama_cpp

    return ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so"))


def _ggml_quantize_chunk():
    """llama.cpp's quantizer of one tensor: (float32 [rows, cols], qtype[, importance
    float32 [cols]]) -> its bytes."""
    fn = _ggml_base().ggml_quantize_chunk
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_size_t

    def run(x: np.ndarray, qtype: Q, imatrix: np.ndarray | None = None) -> np.ndarray:
        x = np.ascontiguousarray(x, dtype=np.float32)
        rows, cols = x.shape
        out = np.zeros((rows, codecs.row_bytes(cols, qtype)), np.uint8)
        weights = None if imatrix is None else np.ascontiguousarray(imatrix, dtype=np.float32).ctypes.data
        assert fn(int(qtype), x.ctypes.data, out.ctypes.data, 0, rows, cols, weights) == out.size
        return out

    return run


class _TypeTraits(ctypes.Structure):
    """ggml.h's struct ggml_type_traits (the wheel's include/ggml.h)."""

    _fields_ = [("type_name", ctypes.c_char_p), ("blck_size", ctypes.c_int64), ("blck_size_interleave", ctypes.c_int64),
                ("type_size", ctypes.c_size_t), ("is_quantized", ctypes.c_bool), ("to_float", ctypes.c_void_p), ("from_float_ref", ctypes.c_void_p)]  # fmt: skip


def ggml_to_float(data: np.ndarray, qtype: Q) -> np.ndarray:
    """ggml's own dequantizer of a type (ggml_get_type_traits(type)->to_float): uint8
    [rows, row_bytes] -> float32 [rows, cols]."""
    get = _ggml_base().ggml_get_type_traits
    get.argtypes, get.restype = [ctypes.c_int], ctypes.POINTER(_TypeTraits)
    traits = get(int(qtype)).contents
    assert traits.type_name.decode() == qtype.name.lower() and (traits.blck_size, traits.type_size) == GGML_QUANT_SIZES[qtype]
    to_float = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64)(traits.to_float)
    data = np.ascontiguousarray(data, dtype=np.uint8)
    out = np.empty((data.shape[0], data.shape[1] // traits.type_size * traits.blck_size), np.float32)
    to_float(data.ctypes.data, out.ctypes.data, out.size)
    return out


def _synthetic(rng: np.random.Generator, rows: int, cols: int):
    shape = (rows, cols)
    yield "normal", rng.standard_normal(shape)
    yield "scaled rows", rng.standard_normal(shape) * 10.0 ** rng.uniform(-8, 4, (rows, 1))
    yield "all positive", rng.uniform(0, 1, shape)
    yield "all negative", -rng.uniform(0, 1, shape)
    yield "heavy tails", rng.standard_cauchy(shape)
    yield "grid (ties)", rng.integers(-8, 8, shape) * 0.25
    sparse = rng.standard_normal(shape)
    sparse[rng.random(shape) < 0.7] = 0.0
    yield "sparse", sparse
    negzero = sparse.copy()
    negzero[negzero == 0] = -0.0
    yield "sparse, negative zeros", negzero
    yield "zeros", np.zeros(shape)
    yield "negative zeros", np.full(shape, -0.0)
    yield "constant", np.full(shape, 0.37)
    yield "negative constant", np.full(shape, -1.5)
    yield "tiny", rng.standard_normal(shape) * 1e-30
    yield "fp16-subnormal scales", rng.standard_normal(shape) * 1e-6
    yield "huge", rng.standard_normal(shape) * 1e4
    outliers = rng.standard_normal(shape)
    outliers[:, ::37] *= 1000
    yield "outliers", outliers


@pytest.mark.parametrize("qtype", EVERY, ids=lambda q: q.name)
def test_quantize_matches_ggml_on_synthetic_data(qtype: Q, ggml_quantize_chunk):
    rng = np.random.default_rng(int(qtype))
    for name, x in _synthetic(rng, 32, 512):
        x = np.asarray(x, dtype=np.float32)
        ours = codecs.quantize(x, qtype)
        ref = ggml_quantize_chunk(x, qtype)
        assert np.array_equal(ours, ref), f"{qtype.name}: {name}"
        # and what we decode from them is what gguf-py decodes
        assert np.array_equal(_bits(codecs.dequantize(ours, qtype)), _bits(gguf_dequantize(ref, qtype).reshape(x.shape))), name


def _bf16_edge_bits(rng: np.random.Generator) -> np.ndarray:
    """float32 bit patterns where GGML_FP32_TO_BF16 has a rule: NaNs (quiet, signalling, with
    payloads, either sign), infinities, values that round up to infinity, ties to even,
    subnormals and signed zeros; and random patterns of every kind."""
    edges = [0x7FC00000, 0xFFC00000, 0x7F800001, 0xFF800001, 0x7FBFFFFF, 0x7F80FFFF, 0x7F818000, 0x7FFFFFFF, 0xFFFFFFFF,
             0x7F800000, 0xFF800000, 0x7F7FFFFF, 0xFF7FFFFF, 0x7F7F8000, 0x7F7F7FFF, 0x3F808000, 0x3F818000, 0x3F807FFF,
             0xBF808000, 0x00000001, 0x80000001, 0x007FFFFF, 0x00008000, 0x00018000, 0x80000000, 0x00000000]  # fmt: skip
    random = rng.integers(0, 2**32, 32 * 64 - len(edges), dtype=np.uint64)
    return np.concatenate([np.array(edges, np.uint64), random]).astype(np.uint32).reshape(64, 32)


def test_bf16_special_values_match_ggml(ggml_quantize_chunk):
    x = _bf16_edge_bits(np.random.default_rng(16)).view(np.float32)
    ours = codecs.quantize(x, Q.BF16)
    ref = ggml_quantize_chunk(x, Q.BF16)
    assert np.array_equal(ours, ref)
    assert np.array_equal(_bits(codecs.dequantize(ours, Q.BF16)), _bits(gguf_dequantize(ref, Q.BF16).reshape(x.shape)))


# --- MXFP4 -------------------------------------------------------------------------------


def _mxfp4_scale_edges(rng: np.random.Generator) -> np.ndarray:
    """Blocks [n, 32] whose largest |x| is 2^k or one of the 40 float32 values below it, for
    every k a float32 reaches (subnormals included): where floorf(log2f(amax)) may round up
    to k. The rest of a block: random fractions of amax, either sign, so every code occurs."""
    amax = np.array([np.ldexp(1.0 - j * 2.0**-24, k) for k in range(-149, 128) for j in range(41)]).astype(np.float32)
    amax = np.unique(amax[(amax > 0) & np.isfinite(amax)])
    blocks = amax[:, None] * rng.uniform(-1, 1, (amax.size, 32)).astype(np.float32)
    blocks[np.arange(amax.size), np.arange(amax.size) % 32] = amax * rng.choice(np.array([-1, 1], np.float32), amax.size)
    return blocks


def test_mxfp4_quantize_matches_ggml_at_every_scale_edge(ggml_quantize_chunk):
    rng = np.random.default_rng(39)
    x = _mxfp4_scale_edges(rng)
    assert x.shape[0] > 250 * 40
    _assert_same_bytes(codecs.quantize(x, Q.MXFP4), ggml_quantize_chunk(x, Q.MXFP4), Q.MXFP4, "scale edges")
    # NaN is never the largest and never coded; an infinite amax casts to scale byte 0 (x86-64)
    special = np.array([np.nan, np.inf, -np.inf, -0.0, 1e-45, 3e-39, 3.4e38, -2.5, 0.75], np.float32)
    x = np.stack([rng.permutation(np.resize(special, 64)) for _ in range(64)])
    _assert_same_bytes(codecs.quantize(x, Q.MXFP4), ggml_quantize_chunk(x, Q.MXFP4), Q.MXFP4, "NaN, infinities, subnormals")
    # llama.cpp's quantizer ignores an importance matrix for MXFP4
    x = rng.standard_normal((16, 256)).astype(np.float32)
    assert np.array_equal(ggml_quantize_chunk(x, Q.MXFP4, rng.random(256) * 10), codecs.quantize(x, Q.MXFP4))


def test_mxfp4_dequantize_matches_ggml_for_every_scale_and_code():
    """Every scale byte (2^-128 and 2^-127 as subnormals, up to 2^127, where 12 * 2^127 is
    infinite), each with every code in both nibbles; ggml's own to_float, and gguf-py's."""
    j = np.arange(16, dtype=np.uint8)
    qs = np.tile(j | ((15 - j) << 4), (256, 1))
    data = np.concatenate([np.arange(256, dtype=np.uint8)[:, None], qs], axis=1).reshape(32, 8 * 17)
    ours = codecs.dequantize(data, Q.MXFP4)
    assert np.isinf(ours).any() and (ours == 0).any() and np.array_equal(_bits(ours), _bits(ggml_to_float(data, Q.MXFP4)))
    with np.errstate(over="ignore"):
        assert np.array_equal(_bits(ours), _bits(gguf_dequantize(data, Q.MXFP4).reshape(ours.shape)))


@pytest.fixture(scope="module")
def tiny_moe_f32(vocabulary, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny qwen3moe (8 experts of [256, 64] and [64, 256] matrices per layer), F32."""
    path = tmp_path_factory.mktemp("moe") / "tiny-qwen3moe-F32.gguf"
    return tiny_model(path, "qwen3moe", first_tokens(vocabulary, 1024), 4, 2, np.random.default_rng(3))


def test_mxfp4_quantize_matches_llamacpp_on_experts(tiny_moe_f32: Path, tmp_path: Path):
    """llama.cpp's MXFP4_MOE: every expert tensor ([n_expert, rows, cols]) MXFP4, the other
    matrices Q8_0 but the routers; every one byte-identical to ours (an expert tensor's rows
    are its experts' rows one after another), and decoded as ggml decodes it."""
    import llama_cpp

    f32 = {t.name: np.asarray(t.data).reshape(-1, t.data.shape[-1]) for t in read_gguf(tiny_moe_f32).tensors}
    tensors = _read(_quantize_pure(tiny_moe_f32, tmp_path / "MXFP4_MOE.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_MXFP4_MOE, pure=False))
    types = {t.name: t.tensor_type for t in tensors}
    experts = {name for name in types if "_exps." in name}
    assert len(experts) == 3 * N_LAYER and {types[name] for name in experts} == {Q.MXFP4}
    for t in tensors:
        if t.tensor_type in codecs.SUPPORTED:
            _assert_same_bytes(codecs.quantize(f32[t.name], t.tensor_type), t.rows, t.tensor_type, t.name)
            assert np.array_equal(_bits(codecs.dequantize(t.rows, t.tensor_type)), _bits(ggml_to_float(t.rows, t.tensor_type))), t.name
    others = {t.name: t.tensor_type for t in tensors if t.name not in experts and len(t._info.shape) == 2}
    assert {name for name, qtype in others.items() if qtype != Q.Q8_0} == {f"blk.{i}.ffn_gate_inp.weight" for i in range(N_LAYER)}  # routers stay F32


# --- round trips -------------------------------------------------------------------------

# relative RMS error bound for standard-normal data (measured: about 80% of these)
RMS_BOUND = {Q.Q8_0: 0.007, Q.Q4_0: 0.105, Q.Q4_1: 0.095, Q.Q5_0: 0.052, Q.Q5_1: 0.046, Q.Q4_K: 0.087, Q.Q5_K: 0.044, Q.Q6_K: 0.022,
             Q.Q2_K: 0.36, Q.Q3_K: 0.185, Q.IQ4_NL: 0.093, Q.IQ4_XS: 0.094, Q.BF16: 0.002, Q.MXFP4: 0.14}  # fmt: skip


@pytest.mark.parametrize("qtype", EVERY, ids=lambda q: q.name)
def test_round_trip_error_is_bounded(qtype: Q):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((64, 1024)).astype(np.float32)
    q = codecs.quantize(x, qtype)
    assert q.dtype == np.uint8 and q.shape == (64, 1024 // GGML_QUANT_SIZES[qtype][0] * GGML_QUANT_SIZES[qtype][1])
    y = codecs.dequantize(q, qtype)
    assert y.dtype == np.float32 and y.shape == x.shape
    assert np.sqrt(np.mean((y - x) ** 2)) < RMS_BOUND[qtype]
    if qtype in LEGACY:
        # per block: at most one quantization step (plus float16 rounding of d and m)
        b = x.reshape(-1, 32)
        err = np.abs(y.reshape(-1, 32) - b).max(axis=1)
        amax = np.abs(b).max(axis=1)
        span = b.max(axis=1) - b.min(axis=1)
        step = {Q.Q8_0: amax / 127 / 2, Q.Q4_0: amax / 8, Q.Q5_0: amax / 16, Q.Q4_1: span / 15 / 2, Q.Q5_1: span / 31 / 2}[qtype]
        assert np.all(err <= step * 1.01 + amax * 2e-3)
    if qtype == Q.BF16:
        assert np.all(np.abs(y - x) <= np.abs(x) * 2.0**-8)  # half a unit of bfloat16's 8-bit significand


@pytest.mark.parametrize("qtype", EVERY, ids=lambda q: q.name)
def test_zeros_round_trip_exactly(qtype: Q):
    x = np.zeros((2, 512), np.float32)
    assert np.array_equal(codecs.dequantize(codecs.quantize(x, qtype), qtype), x)


def test_large_tensor_round_trips():
    """The embedding-sized tensor (its speed is bench/codecs.py's business, not a test's)."""
    x = np.random.default_rng(1).standard_normal((49152, 576)).astype(np.float32)
    y = codecs.dequantize(codecs.quantize(x, Q.Q8_0), Q.Q8_0)
    assert y.shape == x.shape
    amax = np.abs(x).reshape(-1, 32).max(axis=1, keepdims=True)
    err = np.abs(y - x).reshape(-1, 32)
    assert np.all(err <= amax / 127 / 2 * 1.01 + amax * 2e-3)  # half a step, plus the f16 scale's rounding


# --- bad input ---------------------------------------------------------------------------


def test_supported_types():
    assert codecs.SUPPORTED == frozenset(EVERY)


@pytest.mark.parametrize("qtype", [Q.F16, Q.F32, Q.Q8_1, Q.IQ2_XXS, Q.IQ3_S, 9999])
def test_unsupported_type_is_a_clear_error(qtype):
    with pytest.raises(ValueError, match="unsupported|unknown"):
        codecs.quantize(np.zeros((1, 256), np.float32), qtype)
    with pytest.raises(ValueError, match="unsupported|unknown"):
        codecs.dequantize(np.zeros((1, 256), np.uint8), qtype)


@pytest.mark.parametrize(
    "qtype, shape",
    [(Q.Q8_0, (64,)), (Q.Q8_0, (2, 2, 32)), (Q.Q4_0, (4, 48)), (Q.Q4_K, (4, 576)), (Q.Q6_K, (1, 128)), (Q.Q5_1, (3, 0)),
     (Q.Q2_K, (1, 128)), (Q.IQ4_XS, (4, 576)), (Q.IQ4_NL, (2, 48)), (Q.BF16, (2, 0)), (Q.MXFP4, (2, 48))],  # fmt: skip
)
def test_bad_quantize_shape_is_a_clear_error(qtype, shape):
    with pytest.raises(ValueError, match="2-D|multiple"):
        codecs.quantize(np.zeros(shape, np.float32), qtype)


def test_bad_quantize_dtype_is_a_clear_error():
    with pytest.raises(ValueError, match="float"):
        codecs.quantize(np.zeros((1, 32), np.int32), Q.Q8_0)


def test_bad_dequantize_input_is_a_clear_error():
    with pytest.raises(ValueError, match="multiple"):
        codecs.dequantize(np.zeros((2, 35), np.uint8), Q.Q8_0)  # Q8_0 blocks are 34 bytes
    with pytest.raises(ValueError, match="2-D"):
        codecs.dequantize(np.zeros(34, np.uint8), Q.Q8_0)
    with pytest.raises(ValueError, match="uint8"):
        codecs.dequantize(np.zeros((1, 34), np.float32), Q.Q8_0)
