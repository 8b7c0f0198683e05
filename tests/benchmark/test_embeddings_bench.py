"""bench/embeddings.py's main, one round on tests/embedding_models.py's tiny BERT (128
positions, so chunks of 16 and 64 tokens): one JSON line per (chunk, batch) with both rates,
their ratio and the rounds, the table on stderr, the texts exactly the chunk's tokens, and
the two engines' vectors alike. No timing is asserted (the figures go in docs/benchmarks.md)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localinfer.engine.loader import LoadOptions, open_engine
from tests.embedding_models import write_bert

from ..conftest import THREADS
from . import load_script

CHUNKS, BATCHES = [16, 64], [1, 4]


@pytest.fixture(scope="module")
def bench():
    return load_script("embeddings")


@pytest.fixture(scope="module")
def bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bert(tmp_path_factory.mktemp("bench-embed") / "bert.gguf")


def test_one_round_gives_a_line_per_chunk_and_batch(bench, bert: Path, capsys: pytest.CaptureFixture[str]) -> None:
    args = [str(bert), "--rounds", "1", "--chunks", ",".join(map(str, CHUNKS)), "--batches", ",".join(map(str, BATCHES)), "--min-inputs", "2", "--threads", str(THREADS)]
    rows = bench.main(args)
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines()]
    assert [(d["chunk"], d["batch"]) for d in lines] == [(c, b) for c in CHUNKS for b in BATCHES]
    assert lines == [bench.asdict(r) for r in rows]
    for d in lines:
        assert d["model"] == bert.name and d["threads"] == THREADS and d["inputs_per_timing"] == max(2, d["batch"])
        assert d["ours"] > 0 and d["llama_cpp_python"] > 0 and d["ratio"] == pytest.approx(d["ours"] / d["llama_cpp_python"])
        assert len(d["ours_rounds"]) == len(d["llama_cpp_python_rounds"]) == 1 and d["ours"] == d["ours_rounds"][0]
        assert d["max_diff"] < 1e-3  # ours (native, by auto) against llama.cpp on an F32 file: within 4e-4 (tests/native/test_encoder.py)
    table = err.splitlines()[-len(lines) - 1 :]
    assert table[0].split()[:4] == ["model", "engine", "chunk", "batch"]
    assert all(row.split()[:4] == [bert.name, d["engine"], str(d["chunk"]), str(d["batch"])] for row, d in zip(table[1:], lines))


def test_texts_are_exactly_the_chunks_tokens(bench, bert: Path) -> None:
    engine = open_engine(str(bert), LoadOptions(engine="llama.cpp", threads=THREADS))
    try:
        texts = bench.texts_of_exactly(engine, 64, 5, seed=1)
        assert len(set(texts)) == 5 and all(len(engine.tokenize_input(t)) == 64 for t in texts)
    finally:
        engine.close()


def test_a_chunk_longer_than_the_model_takes_is_one_line(bench, bert: Path) -> None:
    with pytest.raises(SystemExit, match="at most 128 tokens"):
        bench.main([str(bert), "--rounds", "1", "--chunks", "512", "--batches", "1"])
