"""`doctor MODEL` and `show` on embedding and reranking models: what the model is for, its
pooling and the length of its vectors, against llama.cpp reading the same tiny GGUFs
(tests/embedding_models.py): the pooling its context takes from the file
(llama_pooling_type) and the length of the vector it gives for a text."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.embedding_models import llama_context, llamacpp_embeddings, write_bert, write_bert_reranker, write_qwen3_embedding

import llama_cpp as C  # noqa: E402  (after localinfer's import, which loads the shared library first)

from ..conftest import run_cli

WIDE = {"COLUMNS": "400"}  # rich wraps a table's cells at the terminal's width
POOLING_NAMES = {C.LLAMA_POOLING_TYPE_MEAN: "mean", C.LLAMA_POOLING_TYPE_CLS: "cls", C.LLAMA_POOLING_TYPE_LAST: "last", C.LLAMA_POOLING_TYPE_RANK: "rank"}
WRITERS = {"bert": write_bert, "bert-cls": lambda path: write_bert(path, pooling="cls"), "qwen3-embedding": write_qwen3_embedding, "reranker": write_bert_reranker}


@pytest.fixture(scope="module", params=list(WRITERS))
def model(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str, int | None]:
    """(path, llama.cpp's pooling of the file, the length of the vector llama.cpp gives a text
    or None for a reranker, which gives scores)."""
    path = WRITERS[request.param](tmp_path_factory.mktemp("kind") / f"{request.param}.gguf")
    with llama_context(path, None) as (_, ctx, _batch):
        pooling = POOLING_NAMES[C.llama_pooling_type(ctx)]
    dimensions = None if pooling == "rank" else llamacpp_embeddings(path, ["the quick brown fox"]).shape[1]
    return path, pooling, dimensions


def expected_line(pooling: str, dimensions: int | None) -> str:
    if pooling == "rank":
        return "reranking model, pooling: rank"
    return f"embedding model, pooling: {pooling}, dimensions: {dimensions}"


def test_doctor_says_what_the_model_is_for(model: tuple[Path, str, int | None]) -> None:
    path, pooling, dimensions = model
    done = run_cli("doctor", str(path), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["model"]
    assert report["kind"] == ("rerank" if pooling == "rank" else "embedding")
    assert report["pooling"] == pooling and report.get("dimensions") == dimensions
    text = run_cli("doctor", str(path), env=WIDE)
    assert text.returncode == 0, text.stderr
    lines = [line.strip() for line in text.stdout.splitlines()]
    at = next(i for i, line in enumerate(lines) if line.split()[:2] == ["model", str(path)])
    assert lines[at + 1] == expected_line(pooling, dimensions)  # under the model's own line


def test_show_has_the_pooling_line(model: tuple[Path, str, int | None]) -> None:
    path, pooling, _ = model
    info = json.loads(run_cli("show", str(path), "--json").stdout)
    assert info["pooling"] == pooling
    shown = {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in run_cli("show", str(path), env=WIDE).stdout.splitlines() if "  " in line}
    assert shown["pooling"] == f"{pooling} ({'reranking' if pooling == 'rank' else 'embedding'} model)"


def test_a_chat_model_is_a_chat_model(model_path: Path) -> None:
    report = json.loads(run_cli("doctor", str(model_path), "--json").stdout)["model"]
    assert report["kind"] == "chat" and not {"pooling", "dimensions"} & set(report)
    text = run_cli("doctor", str(model_path), env=WIDE).stdout
    assert "embedding model" not in text and "reranking model" not in text
    assert "pooling" not in json.loads(run_cli("show", str(model_path), "--json").stdout)
    assert not any(line.startswith("pooling") for line in run_cli("show", str(model_path), env=WIDE).stdout.splitlines())
