"""Qwen3-Reranker on a real server on loopback, through httpx: `serve PLAIN --pooling rank`
makes a plain causal Qwen3 LM a yes/no reranker (tests/engine/test_qwen3_reranker.py has
the why and the tolerances), and llama.cpp's converted form, asked for by path, ranks with
llama.cpp's rank pooling. Each against llama.cpp's own scores of the same tiny file. The
same plain LM under another path, loaded on demand, keeps its file's pooling: a chat model,
whose rerank request is a 400."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from tests.embedding_models import llamacpp_rerank_scores, llamacpp_yes_no_scores, write_qwen3_reranker

from .test_serve import Server, serving

QUERY = "what is the capital of france"
DOCUMENTS = ["paris is the capital of france", "a cat sat on the mat", "rain today and sun tomorrow", "london is the capital of england", "coffee or tea"]
# the plain LM runs where --engine auto puts it (the native engine on a CPU: 3e-5 from
# llama.cpp's logits); the converted one on llama.cpp, several documents a forward
TOLERANCE = 2e-4


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("qwen3-rerankers")
    plain = write_qwen3_reranker(folder / "plain.gguf", converted=False)
    return {"plain": plain, "converted": write_qwen3_reranker(folder / "converted.gguf"), "chat": Path(shutil.copy(plain, folder / "chat.gguf"))}


@pytest.fixture(scope="module")
def server(models: dict[str, Path]) -> Iterator[Server]:
    yield from serving(models["plain"], "--pooling", "rank", "--allow-paths", "--max-loaded", "3")


def post(server: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(server.url + path, json=body, timeout=120)


def check_ranked(answer: httpx.Response, want: np.ndarray) -> None:
    assert answer.status_code == 200, answer.text
    results = answer.json()["results"]
    assert [r["index"] for r in results] == list(np.argsort(-want, kind="stable"))
    assert np.allclose([r["relevance_score"] for r in results], np.sort(want)[::-1], atol=TOLERANCE)


def test_a_plain_qwen3_lm_served_with_pooling_rank_ranks_by_p_yes(server: Server, models: dict[str, Path]) -> None:
    want = llamacpp_yes_no_scores(models["plain"], QUERY, DOCUMENTS)
    check_ranked(post(server, "/v1/rerank", {"model": server.model, "query": QUERY, "documents": DOCUMENTS}), want)
    listed = {m["id"]: m for m in httpx.get(server.url + "/v1/models", timeout=30).json()["data"]}
    assert listed[server.model]["kind"] == "rerank"


def test_the_converted_form_ranks_as_llama_server(server: Server, models: dict[str, Path]) -> None:
    want = llamacpp_rerank_scores(models["converted"], QUERY, DOCUMENTS)
    check_ranked(post(server, "/rerank", {"model": str(models["converted"]), "query": QUERY, "documents": DOCUMENTS}), want)


def test_a_chat_request_to_the_reranker_says_what_it_is_for(server: Server) -> None:
    chat = post(server, "/v1/chat/completions", {"model": server.model, "messages": [{"role": "user", "content": "hi"}]})
    assert chat.status_code == 400 and "reranking model" in chat.json()["error"]["message"]


def test_the_same_lm_not_asked_to_rank_cannot_rank(server: Server, models: dict[str, Path]) -> None:
    answer = post(server, "/v1/rerank", {"model": str(models["chat"]), "query": QUERY, "documents": DOCUMENTS})
    assert answer.status_code == 400 and "not a reranker" in answer.json()["error"]["message"]

