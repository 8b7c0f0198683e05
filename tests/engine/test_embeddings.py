"""Embedding and reranking models through the Engine, against what llama.cpp itself makes of
the same tiny files (tests/embedding_models.py: llama-server's way, through llama-cpp-python's
low-level API). The runtime pools the backend's rows and normalises above the backends, and
carries many inputs in one forward: the vectors must still be llama.cpp's.

Tolerances: llama.cpp pools inside its graph in float32; here the rows are pooled in float64
from the same float32 rows, so the two differ by float32 rounding of a mean (1e-6 a value).
A batch of many inputs is not bit for bit one input alone in llama.cpp: ggml picks its matrix
product by the number of rows (measured: 2e-4 apart on values of about 1), so there the
vectors must agree to 1e-3. The native engine computes a decoder's rows with its own
kernels: there cosine > 0.9999."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer.engine.embedding import finish, forward_groups, pool
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.errors import UserError
from tests.embedding_models import (
    llamacpp_embeddings,
    llamacpp_rerank_scores,
    write_bert,
    write_bert_reranker,
    write_nomic_bert,
    write_qwen3_embedding,
)

TEXTS = ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat", "paris is the capital of france", "rain today and sun tomorrow"]
WRITERS = {"bert": write_bert, "nomic-bert": write_nomic_bert, "qwen3": write_qwen3_embedding}


def engine_for(path: Path, engine: str = "llama.cpp", **more: object):
    return open_engine(str(path), LoadOptions(engine=engine, threads=2, **more))  # type: ignore[arg-type]


def vectors(engine, texts: list[str], normalize: bool = True) -> np.ndarray:
    return finish(engine.embed([engine.tokenize_input(t) for t in texts]), normalize=normalize)


@pytest.mark.parametrize("arch", sorted(WRITERS))
def test_vectors_equal_llama_cpps_own(arch: str, tmp_path: Path) -> None:
    path = WRITERS[arch](tmp_path / f"{arch}.gguf")
    want = llamacpp_embeddings(path, TEXTS)
    engine = engine_for(path)
    try:
        got = vectors(engine, TEXTS)
        assert engine.kind == "embedding" and engine.backend.facts.n_seq_max >= len(TEXTS)  # all four in one forward
    finally:
        engine.close()
    assert got.shape == want.shape and np.allclose(got, want, atol=2e-5), np.abs(got - want).max()
    assert np.allclose(np.linalg.norm(got, axis=1), 1, atol=1e-5)


def test_a_decoder_embedder_on_the_native_engine(tmp_path: Path) -> None:
    path = write_qwen3_embedding(tmp_path / "qwen3.gguf")
    want = llamacpp_embeddings(path, TEXTS)
    engine = engine_for(path, "native")
    try:
        got = vectors(engine, TEXTS)
    finally:
        engine.close()
    assert np.all(np.sum(got * want, axis=1) > 0.9999)


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_pooling_overrides_the_files(pooling: str, tmp_path: Path) -> None:
    path = write_bert(tmp_path / "bert.gguf", pooling="mean" if pooling == "cls" else "cls")
    want = llamacpp_embeddings(path, TEXTS[:2], pooling=pooling)
    engine = engine_for(path, pooling=pooling)
    try:
        got = vectors(engine, TEXTS[:2])
    finally:
        engine.close()
    assert np.allclose(got, want, atol=2e-5)


def test_many_inputs_in_a_forward_equal_each_alone_and_the_cut_is_exact(tmp_path: Path) -> None:
    path = write_bert(tmp_path / "bert.gguf")
    engine = engine_for(path)
    try:
        many = [f"{a} {b}" for a in TEXTS for b in TEXTS] * 3  # 48 inputs: more than one forward's sequences
        together = vectors(engine, many, normalize=False)
        alone = np.concatenate([vectors(engine, [t], normalize=False) for t in many[:5]])
        long_text = " ".join(TEXTS * 40)
        with pytest.raises(UserError, match="at most"):
            engine.embed([engine.tokenize_input(long_text)])
        tokens = engine.tokenize_input(long_text)
        cut = engine.embed([tokens], truncate=True)
        first = engine.embed([tokens[: engine.embed_limit]])
        with pytest.raises(UserError, match="empty"):
            engine.embed([[]])
        with pytest.raises(UserError, match="embedding model"):
            engine.submit(tokens[:8])
    finally:
        engine.close()
    assert np.allclose(together[:5], alone, atol=1e-3)
    assert np.array_equal(cut, first)
    assert len({tuple(np.round(v, 4)) for v in together[:16]}) == 16  # sixteen different texts, sixteen vectors


def test_a_rerankers_scores_equal_llama_cpps(tmp_path: Path) -> None:
    path = write_bert_reranker(tmp_path / "rerank.gguf")
    query = "what is the capital of france"
    want = llamacpp_rerank_scores(path, query, TEXTS)
    engine = engine_for(path)
    try:
        got = engine.rank([engine.tokenize_pair(query, d) for d in TEXTS])
        assert engine.kind == "rerank"
        with pytest.raises(UserError, match="reranking model"):
            engine.embed([engine.tokenize_input("a cat")])
    finally:
        engine.close()
    assert got.shape == (len(TEXTS),) and np.allclose(got, want, atol=1e-4), (got, want)
    assert len(set(np.round(got, 5))) == len(TEXTS)


def test_the_native_engine_hands_a_reranker_to_llama_cpp(tmp_path: Path) -> None:
    path = write_bert_reranker(tmp_path / "rerank.gguf")
    engine = engine_for(path, "auto")
    try:
        assert engine.backend.name == "llama.cpp"
    finally:
        engine.close()


def test_a_chat_models_embedding_is_the_mean_of_its_rows(model_path: Path) -> None:
    """A generative model has no pooling of its own: the runtime takes the mean, as before."""
    engine = open_engine(str(model_path), LoadOptions(engine="llama.cpp", threads=2, n_seq_max=2))
    try:
        tokens = engine.tokenize_input(TEXTS[0])
        rows = engine.backend.embed(engine_batch(tokens))
        got = engine.embed([tokens])
        assert engine.kind == "chat"
    finally:
        engine.close()
    assert np.allclose(got[0], rows.mean(axis=0), atol=1e-5)


def engine_batch(tokens: list[int]):
    from localinfer.backends.base import Batch

    return Batch.for_sequence(tokens, 0, 0, all_logits=True)


def test_groups_and_pooling_by_hand() -> None:
    assert forward_groups([3, 3, 3, 5], n_seq=2, n_tokens=8) == [[0, 1], [2, 3]]
    assert forward_groups([3, 3, 3, 5], n_seq=4, n_tokens=8) == [[0, 1], [2, 3]]
    assert forward_groups([8, 1], n_seq=4, n_tokens=8) == [[0], [1]]
    rows = np.arange(10, dtype=np.float32).reshape(5, 2)
    assert np.array_equal(pool(rows, [2, 3], "cls"), rows[[0, 2]])
    assert np.array_equal(pool(rows, [2, 3], "last"), rows[[1, 4]])
    assert np.allclose(pool(rows, [2, 3], "mean"), [[1, 2], [6, 7]])
    cut = finish(np.array([[3.0, 4.0, 12.0]], np.float32), dimensions=2)
    assert np.allclose(cut, [[0.6, 0.8]])
