"""Embedding and reranking models through the Engine, against what llama.cpp itself makes of
the same tiny files (tests/embedding_models.py: llama-server's way, through llama-cpp-python's
low-level API). The runtime pools the backend's rows and normalises above the backends, and
carries many inputs in one forward: the vectors must still be llama.cpp's.

Tolerances: llama.cpp pools inside its graph in float32; here the rows are pooled in float64
from the same float32 rows, so the two differ by float32 rounding of a mean (1e-6 a value).
A batch of many inputs is not bit for bit one input alone in llama.cpp: ggml picks its matrix
product by the number of rows (measured: 2e-4 apart on values of about 1), so there the
vectors must agree to 1e-3. A reranker's score goes through its head (x4 here, so that the
scores spread): llama.cpp's own scores of the same four pairs in one forward and each alone
are up to 1.9e-3 apart on scores of about 3 for the XLM-RoBERTa pairs (86 tokens; measured
through llama_decode itself, the same as through the Engine), 1e-6 for the BERT pairs (62);
each pair alone through the Engine is llama.cpp's to 1e-5, four together to 3e-3. The
native engine computes a decoder's rows with its own kernels: there cosine > 0.9999 (an
encoder's, BERT's and XLM-RoBERTa's: tests/native/test_encoder.py).

XLM-RoBERTa (bge-m3, bge-reranker-v2-m3) is arch "bert" with a SentencePiece Unigram
vocabulary: the runtime's tokens of a text, a pair's included, must be llama.cpp's own for
words it knows, characters it does not, and other scripts."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer.engine.embedding import finish, forward_groups, pool
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.errors import UserError
from tests.embedding_models import (
    XLMR_SPECIALS,
    llama_context,
    llamacpp_embeddings,
    llamacpp_rerank_scores,
    rerank_tokens,
    tokenize,
    write_bert,
    write_bert_reranker,
    write_nomic_bert,
    write_qwen3_embedding,
    write_xlm_roberta,
    write_xlm_roberta_reranker,
)

import llama_cpp as C  # noqa: E402  (after localinfer's import, which loads the shared library first)

TEXTS = ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat", "paris is the capital of france", "rain today and sun tomorrow"]
WRITERS = {"bert": write_bert, "nomic-bert": write_nomic_bert, "qwen3": write_qwen3_embedding, "xlm-roberta": write_xlm_roberta}
# each reranker's writer and the pooling asked at load: bge-reranker-v2-m3's file names none
# (llama.cpp's converter writes none for it); its classifier head makes it a reranker anyway
# (modelfile.pooling_of), and asking for rank, as the catalog's default does, changes nothing
RERANKERS = {"bert": (write_bert_reranker, None), "xlm-roberta": (write_xlm_roberta_reranker, None), "xlm-roberta asked": (write_xlm_roberta_reranker, "rank")}
# XLM-RoBERTa's vocabulary: known words, unknown characters (capitals, an emoji), other scripts
UNIGRAM_TEXTS = ["the quick brown fox", "ZEBRA 🦊 xyzzy", "café über zürich", "東京 привет мир", "ｆｏｘ"]


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


@pytest.mark.parametrize("engine_name", ["llama.cpp", "native"])
@pytest.mark.parametrize("arch", sorted(RERANKERS))
def test_a_rerankers_scores_equal_llama_cpps(arch: str, engine_name: str, tmp_path: Path) -> None:
    """On llama.cpp, a pair a forward gives llama-server's score to 1e-5 (batched: 3e-3, as
    llama.cpp itself moves a score with its batch). On the native engine, 3e-3 batched or not:
    its encoder's states are llama.cpp's to 4e-4 (tests/native/test_encoder.py), the head
    (x4 on these tiny files' last layer, so that scores spread) multiplies that, and a score
    there is the same bit for bit whatever shares its forward."""
    write, pooling = RERANKERS[arch]
    path = write(tmp_path / "rerank.gguf")
    query = "what is the capital of france"
    want = llamacpp_rerank_scores(path, query, TEXTS)
    engine = engine_for(path, engine_name, pooling=pooling)
    try:
        pairs = [engine.tokenize_pair(query, d) for d in TEXTS]
        got = engine.rank(pairs)  # all four in one forward
        alone = np.concatenate([engine.rank([pair]) for pair in pairs])  # a forward each, as the reference
        assert engine.kind == "rerank" and engine.backend.name == engine_name
        with pytest.raises(UserError, match="reranking model"):
            engine.embed([engine.tokenize_input("a cat")])
    finally:
        engine.close()
    batched, single = (3e-3, 1e-5) if engine_name == "llama.cpp" else (3e-3, 3e-3)
    assert got.shape == (len(TEXTS),) and np.allclose(got, want, atol=batched), (got, want)
    assert np.allclose(alone, want, atol=single), (alone, want)
    assert len(set(np.round(got, 2))) == len(TEXTS)
    if engine_name == "native":
        assert np.array_equal(got, alone)


@pytest.mark.parametrize("arch", sorted(RERANKERS))
def test_auto_runs_a_bert_reranker_on_the_native_engine(arch: str, tmp_path: Path) -> None:
    write, pooling = RERANKERS[arch]
    path = write(tmp_path / "rerank.gguf")
    engine = engine_for(path, "auto", pooling=pooling)
    try:
        assert engine.backend.name == "native" and engine.kind == "rerank"
    finally:
        engine.close()


@pytest.mark.parametrize("engine_name", ["llama.cpp", "auto"])
def test_an_xlm_robertas_tokens_are_llama_cpps(engine_name: str, tmp_path: Path) -> None:
    """An input's tokens and a query-document pair's (<s> q </s> </s> d </s>) through the
    Engine, on llama.cpp and on the engine auto picks for the embedder (native), equal
    llama.cpp's own; the unknown characters are <unk>, the other scripts are not."""
    embedder, reranker = write_xlm_roberta(tmp_path / "xlmr.gguf"), write_xlm_roberta_reranker(tmp_path / "rerank.gguf")
    with llama_context(reranker, "rank") as (model, _, _):  # the two files' vocabulary is the same
        vocab = C.llama_model_get_vocab(model)
        want = [tokenize(vocab, t, add_special=True, parse_special=True) for t in UNIGRAM_TEXTS]
        want_pairs = [rerank_tokens(model, UNIGRAM_TEXTS[0], t) for t in UNIGRAM_TEXTS]
    engine, ranker = engine_for(embedder, engine_name), engine_for(reranker, engine_name, pooling="rank")
    try:
        got = [engine.tokenize_input(t) for t in UNIGRAM_TEXTS]
        pairs = [ranker.tokenize_pair(UNIGRAM_TEXTS[0], t) for t in UNIGRAM_TEXTS]
        names = engine.backend.name, ranker.backend.name
    finally:
        engine.close()
        ranker.close()
    assert names == ((engine_name,) * 2 if engine_name == "llama.cpp" else ("native", "native"))
    assert got == want and pairs == want_pairs
    unk = XLMR_SPECIALS["<unk>"]
    assert pairs[1] == want[0] + [XLMR_SPECIALS["</s>"]] + want[1][1:]  # <s> q </s> + </s> + d </s>, as XLM-R's tokenizer pairs them
    assert want[1].count(unk) == 2 and all(unk not in t for t in [want[0], *want[2:]])


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
