"""The native engine's BERT (localinfer/backends/native/encoder.py) against llama.cpp's own
vectors, on tiny BERTs in llama.cpp's tensor names and metadata (tests/embedding_models.py)
and their F16 and Q8_0 versions made by llama.cpp's own quantizer, on both kernel sets.

Tolerances (TOL: the largest difference of one value of a unit vector, 1/8 on average at
64 dimensions; a token's row is measured against its norm, about 8, the same way):
  - F32 and F16: both engines round q, k and v to f16 for attention, as llama.cpp's flash
    attention takes them (and F16 weights keep both to the same weights), but llama.cpp
    then sums the values in f16 (its VKQ16) where we sum in float32, and multiplies an F16
    matrix by f16-rounded activations where we use floats. Measured on these files: 6.7e-5
    (mean) and 1.6e-4 (cls) from llama.cpp's vectors, as far as llama.cpp's own vectors
    move between flash attention on and off (7.1e-5 and 1.5e-4); rows 2.3e-4. TOL: 4e-4.
  - Q8_0: both quantize every activation to 8 bits, and a value at a rounding edge goes one
    way in one engine and the other way in the other; measured 1.9e-3 to 3.8e-3 (a cosine of
    1 - 5e-5), rows 4.4e-3. TOL: 8e-3.
Several sequences in one forward equal each alone bit for bit: no product, norm, activation
or attention of ours reads a row of another sequence.
An XLM-RoBERTa (bge-m3) is the same pass over another file: one token type, LayerNorm eps
1e-5, CLS pooling, a Unigram vocabulary, positions from 0 (the converter cut RoBERTa's first
pad + 1 rows): held to the same tolerances, on the engine --engine auto picks for it.
"""

from __future__ import annotations

import functools
from pathlib import Path

import llama_cpp
import numpy as np
import pytest
from gguf import GGUFWriter

import tests.embedding_models

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.native import NativeBackend
from localinfer.backends.native.config import UnsupportedModel
from localinfer.engine.embedding import finish
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.errors import BackendError
from localinfer.modelfile import inspect
from tests.embedding_models import llamacpp_embeddings, llamacpp_token_embeddings, write_bert, write_jina_bert_v2, write_nomic_bert, write_xlm_roberta

from .conftest import llama_quantize

TEXTS = [
    "the quick brown fox jumps over the lazy dog",
    "a cat sat on the mat",
    "paris is the capital of france",
    "rain today and sun tomorrow",
    "machine learning finds a vector for every sentence, and retrieval searches them by their angle",
]
FTYPES = {"f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0}
TOL = {"f32": 4e-4, "f16": 4e-4, "q8_0": 8e-3}  # a value (above)
COSINE = {"f32": 1e-6, "f16": 1e-6, "q8_0": 2e-4}  # 1 - cosine at most


@pytest.fixture(scope="module")
def berts(tmp_path_factory: pytest.TempPathFactory) -> dict[tuple[str, str], Path]:
    """(pooling, weight type) -> a tiny BERT: written F32 here, F16 and Q8_0 by llama.cpp's quantizer."""
    folder = tmp_path_factory.mktemp("native-bert")
    files = {}
    for pooling in ("mean", "cls"):
        f32 = files[(pooling, "f32")] = write_bert(folder / f"bert-{pooling}-f32.gguf", pooling=pooling)
        for name, ftype in FTYPES.items():
            files[(pooling, name)] = llama_quantize(f32, folder / f"bert-{pooling}-{name}.gguf", ftype)
    return files


@functools.cache
def reference(path: Path) -> np.ndarray:
    return llamacpp_embeddings(path, TEXTS)


def engine_vectors(path: Path, kernels: str, texts: list[str], normalize: bool = True) -> np.ndarray:
    engine = open_engine(str(path), LoadOptions(engine="native", kernels=kernels, threads=2))
    try:
        assert engine.backend.name == "native" and not engine.backend.facts.causal
        return finish(engine.embed([engine.tokenize_input(t) for t in texts]), normalize=normalize)
    finally:
        engine.close()


@pytest.mark.parametrize("kernels", ["c", "numba"])
@pytest.mark.parametrize("wtype", ["f32", "f16", "q8_0"])
@pytest.mark.parametrize("pooling", ["mean", "cls"])
def test_pooled_vectors_equal_llama_cpps(berts, kernels: str, wtype: str, pooling: str) -> None:
    path = berts[(pooling, wtype)]
    want = reference(path)
    got = engine_vectors(path, kernels, TEXTS)
    assert got.shape == want.shape
    assert np.abs(got - want).max() < TOL[wtype], np.abs(got - want).max()
    assert np.sum(got * want, axis=1).min() > 1 - COSINE[wtype]


@pytest.mark.parametrize("kernels", ["c", "numba"])
@pytest.mark.parametrize("wtype", ["f32", "q8_0"])
def test_every_tokens_row_equals_llama_cpps(berts, kernels: str, wtype: str) -> None:
    path = berts[("mean", wtype)]
    text = TEXTS[-1]
    want = llamacpp_token_embeddings(path, text)
    backend = NativeBackend.load(path, LoadParams(n_threads=2, kernels=kernels, pooling="none"))
    try:
        got = backend.embed(Batch.for_sequence(backend.tokenize(text), 0, all_logits=True))
    finally:
        backend.close()
    assert got.shape == want.shape
    scale = np.linalg.norm(want, axis=1, keepdims=True)
    assert (np.abs(got - want) / scale).max() < TOL[wtype], (np.abs(got - want) / scale).max()


@pytest.mark.parametrize("kernels", ["c", "numba"])
def test_sequences_in_one_forward_equal_each_alone_bit_for_bit(berts, kernels: str) -> None:
    """Five sequences in one batch, in order and with their rows shuffled, against each alone."""
    backend = NativeBackend.load(berts[("mean", "q8_0")], LoadParams(n_threads=2, kernels=kernels, n_seq_max=8, pooling="mean"))
    try:
        inputs = [backend.tokenize(t) for t in TEXTS]
        alone = [backend.embed(Batch.for_sequence(tokens, 0, all_logits=True)) for tokens in inputs]
        together = Batch.of_rows((seq, tokens, 0, len(tokens)) for seq, tokens in zip([5, 0, 3, 1, 7], inputs))
        np.testing.assert_array_equal(backend.embed(together), np.concatenate(alone))
        shuffle = np.random.default_rng(0).permutation(len(together))
        mixed = Batch(together.tokens[shuffle], together.positions[shuffle], together.seq_ids[shuffle], together.want_logits[shuffle])
        np.testing.assert_array_equal(backend.embed(mixed), np.concatenate(alone)[shuffle])
    finally:
        backend.close()


def test_an_encoder_refuses_what_it_cannot_do(berts, tmp_path: Path) -> None:
    backend = NativeBackend.load(berts[("mean", "f32")], LoadParams(n_threads=2, n_seq_max=2, pooling="mean"))
    try:
        tokens = backend.tokenize(TEXTS[0])
        assert NativeBackend.kv_cache_bytes(inspect(berts[("mean", "f32")]), 512, 32, ("f16", "f16")) == 0
        with pytest.raises(BackendError, match="whole"):  # a sequence cut in two
            backend.embed(Batch.for_sequence(tokens[3:], 3, all_logits=True))
        with pytest.raises(BackendError, match="not logits"):
            backend.forward(Batch.for_sequence(tokens, 0))
        assert backend.kv_truncate(0, 3) == 0 and backend.kv_read(0, 0, 2) == b"" and backend.kv_write(0, 0, b"x") == 0
    finally:
        backend.close()
    jina = write_jina_bert_v2(tmp_path / "jina.gguf")
    with pytest.raises(UnsupportedModel, match="'jina-bert-v2' architecture"):
        NativeBackend.load(jina, LoadParams(n_threads=2))


class FusedQKVWriter(GGUFWriter):
    """GGUFWriter that writes each layer's q, k and v (weights and biases, as write_bert adds
    them) as one attn_qkv of their rows in that order, as llama.cpp's create_tensor_qkv
    also loads a BERT; the weights are drawn as before, so the model is the same."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.held: dict[tuple[str, str], np.ndarray] = {}  # a layer's q/k/v tensors until its v bias

    def add_tensor(self, name: str, tensor: np.ndarray, *args, **kwargs) -> None:
        layer, _, part = name.partition(".attn_")
        kind, _, what = part.partition(".")
        if kind not in ("q", "k", "v"):
            return super().add_tensor(name, tensor, *args, **kwargs)
        self.held[(kind, what)] = tensor
        if (kind, what) == ("v", "bias"):
            for what in ("weight", "bias"):
                super().add_tensor(f"{layer}.attn_qkv.{what}", np.concatenate([self.held.pop((x, what)) for x in "qkv"]))


def test_a_fused_qkv_is_the_same_model(monkeypatch: pytest.MonkeyPatch, berts, tmp_path: Path) -> None:
    """The same BERT with attn_qkv: llama.cpp's vectors, and ours bit for bit as from separate q/k/v."""
    monkeypatch.setattr(tests.embedding_models, "GGUFWriter", FusedQKVWriter)
    fused = write_bert(tmp_path / "fused.gguf")
    assert "blk.0.attn_qkv.weight" in {t.name for t in inspect(fused).tensors}
    got = engine_vectors(fused, "c", TEXTS, normalize=False)
    np.testing.assert_array_equal(got, engine_vectors(berts[("mean", "f32")], "c", TEXTS, normalize=False))
    assert np.abs(finish(got) - llamacpp_embeddings(fused, TEXTS)).max() < TOL["f32"]


# known words, unknown characters (<unk>), other scripts, full-width letters, and a long text
XLMR_TEXTS = [*TEXTS[:3], "ZEBRA 🦊 café über zürich", "東京 привет мир ｆｏｘ", " ".join(TEXTS)]


def test_an_xlm_roberta_equals_llama_cpps(tmp_path: Path) -> None:
    """bge-m3's kind through the Engine on the engine auto picks (ours): CLS vectors, and
    without pooling every token's row, llama.cpp's within TOL (F32)."""
    path = write_xlm_roberta(tmp_path / "xlmr.gguf")
    engine = open_engine(str(path), LoadOptions(engine="auto", threads=2))
    try:
        assert engine.backend.name == "native" and engine.pooling == "cls"
        got = finish(engine.embed([engine.tokenize_input(t) for t in XLMR_TEXTS]))
    finally:
        engine.close()
    want = llamacpp_embeddings(path, XLMR_TEXTS)
    assert np.abs(got - want).max() < TOL["f32"], np.abs(got - want).max()
    assert np.sum(got * want, axis=1).min() > 1 - COSINE["f32"]
    backend = NativeBackend.load(path, LoadParams(n_threads=2, pooling="none"))
    try:
        rows = backend.embed(Batch.for_sequence(backend.tokenize(XLMR_TEXTS[-1]), 0, all_logits=True))
    finally:
        backend.close()
    want_rows = llamacpp_token_embeddings(path, XLMR_TEXTS[-1])
    assert rows.shape == want_rows.shape
    assert (np.abs(rows - want_rows) / np.linalg.norm(want_rows, axis=1, keepdims=True)).max() < TOL["f32"]


@pytest.mark.parametrize("kernels", ["c", "numba"])
def test_a_nomic_bert_equals_llama_cpps(kernels: str, tmp_path: Path) -> None:
    """nomic-embed-text's kind (RoPE on q and k, a fused q/k/v, a SwiGLU FFN, no biases but
    the LayerNorms'), on the engine auto picks (ours): mean vectors and every token's row,
    llama.cpp's within TOL (F32); several sequences a forward as each alone, bit for bit."""
    path = write_nomic_bert(tmp_path / "nomic.gguf")
    engine = open_engine(str(path), LoadOptions(engine="auto", threads=2, kernels=kernels))
    try:
        assert engine.backend.name == "native" and engine.pooling == "mean"
        inputs = [engine.tokenize_input(t) for t in TEXTS]
        got = engine.embed(inputs)
        alone = np.concatenate([engine.embed([i]) for i in inputs])
    finally:
        engine.close()
    np.testing.assert_array_equal(got, alone)
    want = llamacpp_embeddings(path, TEXTS)
    assert np.abs(finish(got) - want).max() < TOL["f32"], np.abs(finish(got) - want).max()
    backend = NativeBackend.load(path, LoadParams(n_threads=2, pooling="none", kernels=kernels))
    try:
        rows = backend.embed(Batch.for_sequence(backend.tokenize(TEXTS[-1]), 0, all_logits=True))
    finally:
        backend.close()
    want_rows = llamacpp_token_embeddings(path, TEXTS[-1])
    assert (np.abs(rows - want_rows) / np.linalg.norm(want_rows, axis=1, keepdims=True)).max() < TOL["f32"]
