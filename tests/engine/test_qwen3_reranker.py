"""Qwen3-Reranker through the Engine, in both of its GGUF forms (tests/embedding_models.py's
write_qwen3_reranker: the same weights), against what llama.cpp itself makes of them:

- as llama.cpp's converter writes it (rank pooling, cls.output = the LM head's "yes" and
  "no" rows, a "rerank" chat template): llama.cpp's rank pooling, the prompt from the file's
  template as llama-server's format_prompt_rerank makes it, the score llama-server's
  (the first value its pooling leaves);
- as a plain causal LM with --pooling rank: the runtime's yes/no scoring on either engine,
  Qwen's card's prompt, P(yes) of llama.cpp's own logits of the same prompt.

Tolerances. llama.cpp's two forms compute the same two dot products and the same softmax
(measured 1e-8 apart): 1e-6. Our llama.cpp backend carries several documents a forward and
ggml picks its products by the row count (tests/engine/test_embeddings.py): 1e-5 on scores
of about 0.35, whose documents differ by 5e-4 and more. The native engine's own kernels:
2e-4 (measured 3e-5)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.llamacpp import Tokenizer
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.engine.yes_no import TEMPLATE
from localinfer.errors import UserError
from tests.embedding_models import (
    QWEN3_RERANK_TEMPLATE,
    llama_context,
    llamacpp_rerank_scores,
    llamacpp_yes_no_scores,
    rerank_tokens,
    template_tokens,
    write_qwen3_embedding,
    write_qwen3_reranker,
)

import llama_cpp as C  # noqa: E402  (after localinfer's import, which loads the shared library first)

QUERY = "what is the capital of france"
# six documents: more than the four sequences one forward of this reranker carries (its
# 512-token context into the 2,048 tokens of an embedding model's forward)
DOCUMENTS = ["paris is the capital of france", "a cat sat on the mat", "rain today and sun tomorrow", "the quick brown fox", "london is the capital of england", "coffee or tea"]
TOLERANCE = {"llama.cpp": 1e-5, "native": 2e-4}


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("qwen3-reranker")
    return write_qwen3_reranker(folder / "converted.gguf"), write_qwen3_reranker(folder / "plain.gguf", converted=False)


def engine_for(path: Path, engine: str = "llama.cpp", **more: object):
    return open_engine(str(path), LoadOptions(engine=engine, threads=2, **more))  # type: ignore[arg-type]


def test_llama_cpps_qwen3_rank_pooling_is_the_softmax_of_yes_and_no(files: tuple[Path, Path]) -> None:
    """What the converted form's score is in llama.cpp: its rank pooling takes the last
    token's state through cls.output and a softmax, so the score (the first of the two) is
    P(yes) of the plain form's own logits."""
    converted, plain = files
    assert np.allclose(llamacpp_rerank_scores(converted, QUERY, DOCUMENTS), llamacpp_yes_no_scores(plain, QUERY, DOCUMENTS), atol=1e-6)


def test_the_rerank_template_is_read_with_the_vocabulary(files: tuple[Path, Path]) -> None:
    converted, plain = files
    for path, want in ((converted, QWEN3_RERANK_TEMPLATE), (plain, None)):
        tokenizer = Tokenizer.load(path)  # the native engine's vocabulary; llama.cpp's backend builds the same
        try:
            assert tokenizer.info.rerank_template == want
        finally:
            tokenizer.close()
    assert TEMPLATE == QWEN3_RERANK_TEMPLATE  # Qwen's card's prompt is the converter's template


def test_a_converted_qwen3_reranker_scores_as_llama_server(files: tuple[Path, Path]) -> None:
    converted = files[0]
    want = llamacpp_rerank_scores(converted, QUERY, DOCUMENTS)
    with llama_context(converted, "rank") as (model, _, _):
        want_tokens = rerank_tokens(model, QUERY, DOCUMENTS[0])
    engine = engine_for(converted, "auto")  # the native engine runs no rank head: llama.cpp's
    try:
        tokens = [engine.tokenize_pair(QUERY, d) for d in DOCUMENTS]
        got = engine.rank(tokens)
        assert (engine.kind, engine.backend.name, engine.backend.facts.pooling, engine.yes_no) == ("rerank", "llama.cpp", "rank", None)
        assert engine.backend.vocab.rerank_template == QWEN3_RERANK_TEMPLATE
    finally:
        engine.close()
    assert tokens[0] == want_tokens  # the file's template, {query} and {document} filled, specials parsed
    assert got.shape == (len(DOCUMENTS),) and np.allclose(got, want, atol=TOLERANCE["llama.cpp"]), np.abs(got - want).max()


@pytest.mark.parametrize("engine_name", ["llama.cpp", "native"])
def test_a_plain_qwen3_lm_asked_to_rank_scores_p_yes_of_its_logits(files: tuple[Path, Path], engine_name: str) -> None:
    plain = files[1]
    want = llamacpp_yes_no_scores(plain, QUERY, DOCUMENTS)
    with llama_context(plain, "none", logits=True) as (model, _, _):
        want_tokens = template_tokens(C.llama_model_get_vocab(model), QWEN3_RERANK_TEMPLATE, QUERY, DOCUMENTS[0])
    engine = engine_for(plain, engine_name, pooling="rank")
    try:
        tokens = [engine.tokenize_pair(QUERY, d) for d in DOCUMENTS]
        got = engine.rank(tokens)
        assert engine.kind == "rerank" and engine.backend.name == engine_name
        assert engine.backend.facts.pooling == "none"  # the backend runs it as the generative model it is
        with pytest.raises(UserError, match="reranking model"):
            engine.submit(tokens[0])
        with pytest.raises(UserError, match="reranking model"):
            engine.embed([tokens[0]])
    finally:
        engine.close()
    assert tokens[0] == want_tokens
    assert got.shape == (len(DOCUMENTS),) and np.allclose(got, want, atol=TOLERANCE[engine_name]), np.abs(got - want).max()
    assert list(np.argsort(-got)) == list(np.argsort(-want))


def test_a_plain_lm_not_asked_to_rank_is_a_chat_model(files: tuple[Path, Path]) -> None:
    engine = engine_for(files[1])
    try:
        assert engine.kind == "chat" and engine.yes_no is None
        with pytest.raises(UserError, match="not a reranker"):
            engine.rank([engine.tokenize_pair(QUERY, DOCUMENTS[0])])
    finally:
        engine.close()


def test_rank_asked_of_a_model_without_yes_and_no_tokens_is_one_line(tmp_path: Path) -> None:
    """Qwen3-Embedding's tiny vocabulary has "yes" only after a space: bare, it is three bytes."""
    path = write_qwen3_embedding(tmp_path / "embedding.gguf")
    with pytest.raises(UserError, match='"yes" and "no" are not one token each') as caught:
        engine_for(path, pooling="rank")
    assert "\n" not in str(caught.value)
