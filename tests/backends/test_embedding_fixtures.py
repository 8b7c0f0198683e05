"""The embedding fixtures (tests/embedding_models.py) hold: each tiny GGUF loads in the pinned
llama.cpp, and its reference does what the pooling's name says, checked against llama.cpp's
own per-token states, its high-level Llama.embed, and the reranker's head applied in numpy;
llama.cpp's Unigram tokenizer reads an XLM-RoBERTa's text as SentencePiece itself does."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from llama_cpp import Llama

import llama_cpp as C

from ..conftest import THREADS
from ..embedding_models import (
    N_EMBD,
    SPECIALS,
    XLMR_SPECIALS,
    llama_context,
    llamacpp_embeddings,
    llamacpp_rerank_scores,
    llamacpp_token_embeddings,
    pooled,
    rerank_tokens,
    run_sequence,
    sentencepiece_ids,
    tokenize,
    write_bert,
    write_bert_reranker,
    write_jina_bert_v2,
    write_nomic_bert,
    write_qwen3_embedding,
    write_xlm_roberta,
    write_xlm_roberta_reranker,
)

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Paris is the capital of France.", "I like to drink coffee in the morning."]
WRITERS = {"bert": write_bert, "nomic-bert": write_nomic_bert, "jina-bert-v2": write_jina_bert_v2, "qwen3": write_qwen3_embedding, "xlm-roberta": write_xlm_roberta}
DEFAULT_POOLING = {"bert": "mean", "nomic-bert": "mean", "jina-bert-v2": "mean", "qwen3": "last", "xlm-roberta": "cls"}
# each reranker, and the text whose tokens (specials parsed and added) are its query-document pair
RERANKERS = {"reranker": "{q} [SEP] {d}", "xlm-roberta-reranker": "{q}</s></s>{d}"}
QUERY = "What is the capital of France?"
DOCUMENTS = ["Paris is the capital of France.", "The dog sat on the mat.", "It will rain in London tomorrow."]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("embedding_models")
    written = {arch: write(folder / f"{arch}.gguf") for arch, write in WRITERS.items()}
    written["reranker"] = write_bert_reranker(folder / "reranker.gguf")
    written["xlm-roberta-reranker"] = write_xlm_roberta_reranker(folder / "xlm-roberta-reranker.gguf")
    return written


@pytest.mark.parametrize("arch", WRITERS)
def test_each_model_loads_and_embeds_unit_vectors(models: dict[str, Path], arch: str) -> None:
    vectors = llamacpp_embeddings(models[arch], TEXTS)
    assert vectors.shape == (len(TEXTS), N_EMBD)
    assert np.isfinite(vectors).all()
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-6)
    raw = llamacpp_embeddings(models[arch], TEXTS, normalize=False)
    assert not np.allclose(np.linalg.norm(raw, axis=1), 1.0, atol=1e-3)  # the norm was the reference's doing
    np.testing.assert_allclose(raw / np.linalg.norm(raw, axis=1, keepdims=True), vectors, atol=1e-6)


@pytest.mark.parametrize("arch", WRITERS)
def test_different_texts_and_word_orders_give_different_vectors(models: dict[str, Path], arch: str) -> None:
    """Also the same words in another order: each architecture's positions (learned rows,
    RoPE, ALiBi, a causal mask) reach the pooled vector."""
    vectors = llamacpp_embeddings(models[arch], [*TEXTS, "the dog saw the cat", "the cat saw the dog"])
    for i in range(len(vectors)):
        for j in range(i):
            assert np.abs(vectors[i] - vectors[j]).max() > 1e-3, (i, j)


@pytest.mark.parametrize("arch", WRITERS)
def test_poolings_are_what_their_names_say(models: dict[str, Path], arch: str) -> None:
    """Against the same text's per-token states (pooling none): mean is their mean, cls the
    first row, last the last; the three differ; no pooling given means the file's own."""
    path = models[arch]
    states = llamacpp_token_embeddings(path, TEXTS[0]).astype(np.float64)  # [n_tokens, n_embd]
    expected = {"mean": states.mean(axis=0), "cls": states[0], "last": states[-1]}
    got = {p: llamacpp_embeddings(path, TEXTS[:1], p, normalize=False)[0] for p in expected}
    for p in expected:
        np.testing.assert_allclose(got[p], expected[p], rtol=1e-4, atol=1e-5, err_msg=p)
    assert min(np.abs(got[a] - got[b]).max() for a, b in [("mean", "cls"), ("mean", "last"), ("cls", "last")]) > 1e-2
    np.testing.assert_array_equal(llamacpp_embeddings(path, TEXTS[:1], normalize=False)[0], got[DEFAULT_POOLING[arch]])


def test_pooling_written_in_the_file_is_the_default(tmp_path: Path) -> None:
    path = write_bert(tmp_path / "cls.gguf", pooling="cls")
    np.testing.assert_array_equal(llamacpp_embeddings(path, TEXTS), llamacpp_embeddings(path, TEXTS, "cls"))


def test_the_same_seed_writes_the_same_bytes(tmp_path: Path) -> None:
    a, b, c = (write_bert(tmp_path / f"{n}.gguf", seed=s) for n, s in (("a", 3), ("b", 3), ("c", 4)))
    assert a.read_bytes() == b.read_bytes() != c.read_bytes()


def test_wordpiece_vocabulary_reads_english_as_words(models: dict[str, Path]) -> None:
    """[CLS] first, [SEP] last, at bert-base's ids; real words, never [UNK], in ordinary text."""
    with llama_context(models["bert"], None) as (model, _, _):
        vocab = C.llama_model_get_vocab(model)
        for text in [*TEXTS, *DOCUMENTS, QUERY, "Hello world, it is 42 degrees today!"]:
            tokens = tokenize(vocab, text, add_special=True, parse_special=True)
            assert tokens[0] == SPECIALS["[CLS]"] and tokens[-1] == SPECIALS["[SEP]"]
            assert SPECIALS["[UNK]"] not in tokens, text
        assert len(tokenize(vocab, "the capital of france", add_special=False, parse_special=False)) == 4


def test_a_text_past_the_context_is_an_error_not_an_abort(models: dict[str, Path]) -> None:
    """llama.cpp aborts the process (GGML_ASSERT n_ubatch >= n_tokens) on an encoder's
    sequence longer than its ubatch: the reference refuses it first."""
    with pytest.raises(ValueError, match="tokens: a sequence here takes 1 to 128"):
        llamacpp_embeddings(models["bert"], ["word " * 200])


def test_encoders_run_through_llama_decode_as_through_llama_encode(models: dict[str, Path]) -> None:
    """llama.cpp (0.3.36's) reports no encoder for BERT-family models (has_encoder is T5's);
    their context has no memory, and llama_decode hands the batch to llama_encode."""
    for arch in ("bert", "nomic-bert", "jina-bert-v2", "xlm-roberta"):
        with llama_context(models[arch], "mean") as (model, ctx, batch):
            assert not C.llama_model_has_encoder(model) and C.llama_get_memory(ctx) is None
            run_sequence(ctx, batch, tokenize(C.llama_model_get_vocab(model), TEXTS[0], True, True))
            decoded = pooled(ctx, N_EMBD)
            assert C.llama_encode(ctx, batch) == 0
            np.testing.assert_array_equal(pooled(ctx, N_EMBD), decoded)


def test_reference_agrees_with_llama_cpp_pythons_embed(models: dict[str, Path]) -> None:
    """llama-cpp-python's Llama.embed puts all texts in one batch as separate sequences,
    where the reference runs one at a time. With flash attention on, as llama.cpp's "auto"
    (the reference's and llama-server's default) resolves on a CPU, both round K and V to
    f16 and run the same kernels on the same weights, only grouped otherwise: they agree to
    float32 rounding (3e-8 measured on unit vectors, held to 1e-6), while flash attention
    off alone moves them by 9e-5 and two texts differ by more than 1e-2."""
    llm = Llama(str(models["bert"]), embedding=True, n_ctx=128, n_batch=128, n_ubatch=128, n_threads=THREADS, flash_attn=True, verbose=False)
    try:
        theirs = np.array(llm.embed(TEXTS, normalize=True), dtype=np.float32)
    finally:
        llm.close()
    np.testing.assert_allclose(llamacpp_embeddings(models["bert"], TEXTS), theirs, atol=1e-6)


@pytest.mark.parametrize("reranker", RERANKERS)
def test_reranker_scores_each_document_by_its_head(models: dict[str, Path], reranker: str) -> None:
    """One finite score per document, differing between them, each the classification head
    cls.output(tanh(cls(h))) applied in numpy to the first token's state of the pair:
    "[CLS] query [SEP] document [SEP]" for BERT (the GGUF's add_bos/add_eos, add_sep false),
    "<s> query </s> </s> document </s>" for XLM-RoBERTa (add_sep true), as its tokenizer
    pairs them. The XLM-RoBERTa file names no pooling: rank is asked, as llama-server's --rerank."""
    path, joined = models[reranker], RERANKERS[reranker]
    scores = llamacpp_rerank_scores(path, QUERY, DOCUMENTS)
    assert scores.shape == (len(DOCUMENTS),) and np.isfinite(scores).all()
    assert np.abs(np.subtract.outer(scores, scores))[np.triu_indices(len(DOCUMENTS), 1)].min() > 1e-3
    tensors = {t.name: np.asarray(t.data, dtype=np.float64) for t in GGUFReader(path).tensors if t.name.startswith("cls")}
    with llama_context(path, "rank") as (model, _, _):
        vocab = C.llama_model_get_vocab(model)
        pair = [rerank_tokens(model, QUERY, d) for d in DOCUMENTS]
        assert pair == [tokenize(vocab, joined.format(q=QUERY, d=d), add_special=True, parse_special=True) for d in DOCUMENTS]
    for document, score in zip(DOCUMENTS, scores):
        h = llamacpp_token_embeddings(path, joined.format(q=QUERY, d=document))[0].astype(np.float64)
        hidden = np.tanh(tensors["cls.weight"] @ h + tensors["cls.bias"])
        expected = tensors["cls.output.weight"] @ hidden + tensors["cls.output.bias"]
        np.testing.assert_allclose(score, expected[0], rtol=1e-4, atol=1e-5)


# ordinary words; a word of characters the vocabulary lacks (capitals, an emoji: <unk>, a run
# of them one <unk>); other scripts; full-width letters (NFKC makes them ASCII); extra spaces
UNIGRAM_TEXTS = ["the quick brown fox jumps over the lazy dog", "ZEBRA 🦊 xyzzy", "café über zürich 東京 привет мир",
                 "ｆｏｘ", "fox", "  the   lazy  dog ", "the lazy dog"]  # fmt: skip


def test_unigram_vocabulary_reads_text_as_sentencepiece_does(models: dict[str, Path]) -> None:
    """llama.cpp's UGM tokenizer over the XLM-RoBERTa file (its charsmap, dummy prefix, merged
    spaces) gives SentencePiece's own pieces of the model the file was written from, in
    fairseq's numbering, between <s> and </s>: unknown characters as one <unk> a run, other
    scripts in their own pieces, full-width letters as the ASCII word."""
    with llama_context(models["xlm-roberta"], None) as (model, _, _):
        vocab = C.llama_model_get_vocab(model)
        got = {text: tokenize(vocab, text, add_special=True, parse_special=True) for text in UNIGRAM_TEXTS}
    for text, tokens in got.items():
        assert tokens == [XLMR_SPECIALS["<s>"], *sentencepiece_ids(text), XLMR_SPECIALS["</s>"]], text
    unk = XLMR_SPECIALS["<unk>"]
    assert got["ZEBRA 🦊 xyzzy"].count(unk) == 2
    assert unk not in got[UNIGRAM_TEXTS[0]] and unk not in got["café über zürich 東京 привет мир"]
    assert got["ｆｏｘ"] == got["fox"] and len(got["fox"]) == 3  # <s> ▁fox </s>
    assert got["  the   lazy  dog "] == got["the lazy dog"]
