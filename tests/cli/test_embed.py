"""`localinfer embed`: the real command on a tiny BERT, against llama.cpp's own vectors of the
same file (tests/embedding_models.py), texts from arguments, a file and stdin."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.embedding_models import llamacpp_embeddings, write_bert

from ..conftest import run_cli

# llama.cpp's vectors move by up to 1e-4 with how many rows a forward carries (see
# tests/engine/test_embeddings.py); the reference runs one text a forward
TOLERANCE = 2e-4
TEXTS = ["the quick brown fox jumps over the lazy dog", "a cat sat on the mat", "paris is the capital of france"]


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bert(tmp_path_factory.mktemp("embed") / "bert.gguf")


def test_json_lines_are_llama_cpps_vectors(bert: Path) -> None:
    done = run_cli("embed", str(bert), *TEXTS, "--json", "--threads", "2")
    assert done.returncode == 0, done.stderr
    lines = [json.loads(line) for line in done.stdout.splitlines()]
    assert [(d["index"], d["text"]) for d in lines] == list(enumerate(TEXTS))
    assert np.allclose([d["embedding"] for d in lines], llamacpp_embeddings(bert, TEXTS), atol=TOLERANCE)


def test_texts_from_a_file_or_stdin_give_the_same_vectors(bert: Path, tmp_path: Path) -> None:
    listed = tmp_path / "texts.txt"
    listed.write_text("\n".join(TEXTS[:2]) + "\n\n")
    from_file = run_cli("embed", str(bert), "--file", str(listed), "--threads", "2")
    from_stdin = run_cli("embed", str(bert), "--threads", "2", input="\n".join(TEXTS[:2]))
    assert from_file.returncode == 0 and from_stdin.returncode == 0, from_file.stderr + from_stdin.stderr
    assert from_file.stdout == from_stdin.stdout and len(from_file.stdout.splitlines()) == 2
    assert np.allclose([json.loads(line) for line in from_file.stdout.splitlines()], llamacpp_embeddings(bert, TEXTS[:2]), atol=TOLERANCE)


def test_similarity_prints_the_cosine_matrix(bert: Path) -> None:
    done = run_cli("embed", str(bert), *TEXTS, "--similarity", "--threads", "2")
    assert done.returncode == 0, done.stderr
    vectors = llamacpp_embeddings(bert, TEXTS)
    rows = [line.split() for line in done.stdout.splitlines()[1:] if line.strip()]  # under the header of column numbers
    assert len(rows) == 3 and all(float(row[-3 + i]) == pytest.approx(1.0, abs=1e-3) for i, row in enumerate(rows))
    assert float(rows[0][-2]) == pytest.approx(float(vectors[0] @ vectors[1]), abs=2e-3)


@pytest.mark.parametrize(
    "args, message",
    [((), "no text to embed"), (("one", "--similarity"), "at least two"), (("one", "--dimensions", "100000"), "cut them shorter"), (("one", "--pooling", "max"), "not one of")],
    ids=["no-text", "similarity-of-one", "too-many-dimensions", "unknown-pooling"],
)
def test_bad_input_is_one_line(bert: Path, args: tuple[str, ...], message: str) -> None:
    done = run_cli("embed", str(bert), *args, "--threads", "2", input="")
    assert done.returncode != 0 and message in done.stderr and "Traceback" not in done.stderr


def test_run_on_an_embedding_model_says_what_it_is_for_in_one_line(bert: Path) -> None:
    done = run_cli("run", str(bert), "hello", "--threads", "2")
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1 and "is an embedding model" in lines[0] and "localinfer embed" in lines[0]
