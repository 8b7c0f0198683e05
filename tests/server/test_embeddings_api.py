"""Embedding and rerank routes on a real server on loopback, through the clients people use
(the openai SDK, the ollama client, httpx for rerank), against llama.cpp's own vectors and
scores of the same tiny files (tests/embedding_models.py). One server holds both models:
the embedding model it started on, the reranker asked for by path. A second holds the
XLM-RoBERTa pair (bge-m3's and bge-reranker-v2-m3's kind), the other way round: started on
the reranker, whose file names no pooling (as llama.cpp's converter leaves it), with
--pooling rank (as llama-server's --rerank), and the embedder asked for by path."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import ollama
import pytest

from tests.embedding_models import (
    llamacpp_embeddings,
    llamacpp_rerank_scores,
    write_bert,
    write_bert_reranker,
    write_xlm_roberta,
    write_xlm_roberta_reranker,
)

from .test_serve import Server, serving

TEXTS = ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat", "paris is the capital of france"]
QUERY = "what is the capital of france"
# llama.cpp's own vectors move by up to 1e-4 with how many rows a forward carries (ggml picks
# its products by the row count; tests/engine/test_embeddings.py): the server groups inputs
# as its load asks, the reference one text a forward
TOLERANCE = 2e-4
# BERT-family embedders and rerankers run on the native engine (--engine auto's choice): its
# tolerance on a unit vector's values (tests/native/test_encoder.py); a reranker's scores,
# llama.cpp's within 3e-3 (tests/engine/test_embeddings.py says why)
NATIVE_TOLERANCE, RANK_TOLERANCE = 4e-4, 3e-3
# known words, unknown characters (<unk>), other scripts, full-width letters
XLMR_TEXTS = [*TEXTS, "ZEBRA 🦊 café über zürich", "東京 привет мир ｆｏｘ"]


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("embedding-models")
    return write_bert(folder / "bert.gguf"), write_bert_reranker(folder / "rerank.gguf")


@pytest.fixture(scope="module")
def server(models: tuple[Path, Path]) -> Iterator[Server]:
    yield from serving(models[0], "--parallel", "2", "--allow-paths", "--max-loaded", "2")


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def test_the_openai_sdks_embeddings_are_llama_cpps(server: Server, models: tuple[Path, Path]) -> None:
    want = llamacpp_embeddings(models[0], TEXTS)
    got = server.client().embeddings.create(model=server.model, input=TEXTS)  # the SDK asks for base64
    assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > 3 * 5
    assert np.allclose([d.embedding for d in got.data], want, atol=TOLERANCE)
    short = server.client().embeddings.create(model=server.model, input=TEXTS[0], dimensions=16).data[0].embedding
    cut = want[0][:16] / np.linalg.norm(want[0][:16])
    assert len(short) == 16 and np.allclose(short, cut, atol=TOLERANCE)
    as_float = post(server, "/v1/embeddings", {"model": server.model, "input": TEXTS[:1], "encoding_format": "float"}).json()
    assert np.allclose(as_float["data"][0]["embedding"], want[0], atol=TOLERANCE)
    models_listed = {m["id"]: m for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]}
    assert models_listed[server.model]["kind"] == "embedding"


def test_the_ollama_clients_embed(server: Server, models: tuple[Path, Path]) -> None:
    want = llamacpp_embeddings(models[0], TEXTS)
    client = ollama.Client(host=server.url, timeout=120)
    got = client.embed(model=server.model, input=TEXTS)
    assert np.allclose(got.embeddings, want, atol=TOLERANCE) and got.prompt_eval_count > 3 * 5
    older = post(server, "/api/embeddings", {"model": server.model, "prompt": TEXTS[1]}).json()["embedding"]
    raw = llamacpp_embeddings(models[0], TEXTS[1:2], normalize=False)[0]
    assert np.allclose(older, raw, rtol=1e-3, atol=1e-3)  # the older route was never normalised (values of about 1: TOLERANCE's scale)
    shown = client.show(server.model)
    assert shown.capabilities == ["embedding"]


def test_a_chat_request_to_an_embedding_model_says_what_it_is_for(server: Server) -> None:
    chat = post(server, "/v1/chat/completions", {"model": server.model, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "embedding model" in chat.json()["error"]["message"]
    old = post(server, "/api/generate", {"model": server.model, "prompt": "hi", "stream": False})
    assert old.status_code == 400 and "embedding model" in old.json()["error"]
    claude = post(server, "/v1/messages", {"model": server.model, "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]})
    assert claude.status_code == 400 and "embedding model" in claude.json()["error"]["message"]


@pytest.mark.parametrize(
    "body",
    [
        {"input": []},
        {"input": ["a cat", ""]},
        {"input": ["a cat"] * 10_000},
        {"input": [[5, 10**9]]},
        {"input": "a cat", "dimensions": 100_000},
    ],
    ids=["no-input", "an-empty-string", "ten-thousand", "a-token-past-the-vocabulary", "more-dimensions-than-it-has"],
)
def test_bad_embedding_input_is_a_400_that_says_why(server: Server, body: dict) -> None:
    answer = post(server, "/v1/embeddings", {"model": server.model, **body})
    assert answer.status_code == 400 and answer.json()["error"]["message"]


def test_rerank_sorts_the_documents_by_llama_cpps_scores(server: Server, models: tuple[Path, Path]) -> None:
    want = llamacpp_rerank_scores(models[1], QUERY, TEXTS)
    body = {"model": str(models[1]), "query": QUERY, "documents": [TEXTS[0], {"text": TEXTS[1]}, TEXTS[2]], "return_documents": True}
    answer = post(server, "/v1/rerank", body)
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable"))
    assert np.allclose([r["relevance_score"] for r in results], np.sort(want)[::-1], atol=RANK_TOLERANCE)
    assert [r["document"]["text"] for r in results] == [TEXTS[r["index"]] for r in results]
    top = post(server, "/rerank", {**body, "top_n": 2, "return_documents": False}).json()["results"]
    assert [r["index"] for r in top] == [r["index"] for r in results[:2]] and "document" not in top[0]


@pytest.mark.parametrize(
    "change",
    [{"top_n": 0}, {"top_n": 4}, {"documents": []}, {"documents": ["a cat", ""]}, {"query": ""}],
    ids=["top-n-0", "top-n-over-the-count", "no-documents", "an-empty-document", "no-query"],
)
def test_bad_rerank_input_is_a_400(server: Server, models: tuple[Path, Path], change: dict) -> None:
    answer = post(server, "/v1/rerank", {"model": str(models[1]), "query": QUERY, "documents": TEXTS, **change})
    assert answer.status_code == 400 and answer.json()["error"]["message"]


def test_rerank_with_a_model_that_cannot_rank_is_a_400(server: Server) -> None:
    answer = post(server, "/v1/rerank", {"model": server.model, "query": QUERY, "documents": TEXTS})
    assert answer.status_code == 400 and "not a reranker" in answer.json()["error"]["message"]


@pytest.fixture(scope="module")
def xlmr_models(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("xlm-roberta")
    return write_xlm_roberta(folder / "xlmr.gguf"), write_xlm_roberta_reranker(folder / "xlmr-rerank.gguf")


@pytest.fixture(scope="module")
def xlmr_server(xlmr_models: tuple[Path, Path]) -> Iterator[Server]:
    yield from serving(xlmr_models[1], "--pooling", "rank", "--parallel", "2", "--allow-paths", "--max-loaded", "2")


def test_an_xlm_roberta_embeds_and_ranks_as_llama_cpp(xlmr_server: Server, xlmr_models: tuple[Path, Path]) -> None:
    """bge-m3's kind by path: the SDK's vectors (CLS, unit length) of texts with unknown
    characters and other scripts are llama.cpp's; bge-reranker-v2-m3's kind, served with
    --pooling rank: /v1/rerank's order and scores are llama.cpp's."""
    embedder, reranker = xlmr_models
    want = llamacpp_embeddings(embedder, XLMR_TEXTS)
    got = xlmr_server.client().embeddings.create(model=str(embedder), input=XLMR_TEXTS)
    assert np.allclose([d.embedding for d in got.data], want, atol=NATIVE_TOLERANCE)
    scores = llamacpp_rerank_scores(reranker, QUERY, XLMR_TEXTS)
    answer = post(xlmr_server, "/v1/rerank", {"model": xlmr_server.model, "query": QUERY, "documents": XLMR_TEXTS})
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == list(np.argsort(-scores, kind="stable"))
    assert np.allclose([r["relevance_score"] for r in results], np.sort(scores)[::-1], atol=RANK_TOLERANCE)
    listed = {m["id"]: (m.get("kind"), m.get("engine")) for m in httpx.get(xlmr_server.url + "/v1/models", timeout=30).json()["data"]}
    assert listed[xlmr_server.model] == ("rerank", "native") and listed[str(embedder)] == ("embedding", "native")
