"""bench/synthetic.py's encoders, on tiny-bert (bert-base's code path and vocabulary with
smaller numbers): the script is run as a user runs it; its files hold the tensors and keys of
tests/embedding_models.py's BERT (llama.cpp's converter's), in the types asked for;
llama.cpp tokenizes English text with their WordPiece vocabulary without [UNK], and our
Engine's vectors of them are llama.cpp's own (the fixture's reference).

Tolerance: our Engine carries the texts in one forward and llama.cpp's reference one at a
time, and ggml picks its matrix product by the number of rows (tests/engine/test_embeddings.py
measured 2e-4 apart): 1e-3 on unit vectors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from localinfer.engine.embedding import finish
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.modelfile import inspect
from tests.embedding_models import SPECIALS, llamacpp_embeddings, llamacpp_rerank_scores, write_bert, write_bert_reranker, write_nomic_bert

from ..cli.test_errors import assert_one_line_error
from ..conftest import THREADS, read_gguf
from .test_synthetic import make, synthetic  # noqa: F401 - synthetic: the fixture, as test_synthetic loads the script

TEXTS = ["The quick brown fox jumps over the lazy dog.", "Retrieval-augmented generation embeds documents, then searches them!",
         "Paris is the capital of France; its weather changes quickly."]  # fmt: skip
SHAPE_KEYS = {"context_length": "n_ctx", "embedding_length": "n_embd", "feed_forward_length": "n_ff", "block_count": "n_layer", "attention.head_count": "n_head"}


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("synthetic-bert")
    r = make(out, "tiny-bert", "--types", "F16,Q8_0")
    assert r.returncode == 0, r.stderr
    printed = [Path(line) for line in r.stdout.splitlines()]
    assert printed == [out / "tiny-bert-F16.gguf", out / "tiny-bert-Q8_0.gguf"] and sorted(out.iterdir()) == sorted(printed)
    return {"F16": printed[0], "Q8_0": printed[1]}


@pytest.fixture(scope="module")
def fixture_bert(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_bert(tmp_path_factory.mktemp("fixture") / "bert.gguf")


@pytest.mark.parametrize("type_name", ["F16", "Q8_0"])
def test_tensors_and_keys_are_the_fixtures(made, synthetic, fixture_bert: Path, type_name: str) -> None:
    s = synthetic.BERT_SHAPES["tiny-bert"]
    ours, theirs = read_gguf(made[type_name]), read_gguf(fixture_bert)
    assert s.n_layer == 2 == inspect(fixture_bert).n_layer  # the fixture's depth: the same tensor names
    assert sorted(t.name for t in ours.tensors) == sorted(t.name for t in theirs.tensors)
    plan = {spec.name: spec for spec in synthetic.plan_of(s)}
    for t in ours.tensors:
        assert tuple(int(n) for n in reversed(t.shape)) == plan[t.name].shape, t.name
        if len(plan[t.name].shape) == 1 or t.name in ("position_embd.weight", "token_types.weight"):
            assert T(t.tensor_type).name == "F32", t.name  # norms, biases and the converter's F32 tables
        elif t.name.split(".")[-2] in ("attn_q", "attn_output", "ffn_up", "ffn_down"):
            assert T(t.tensor_type).name == type_name, t.name
    extra = {"general.file_type", "general.quantization_version"}  # the converter's and the quantizer's
    assert set(theirs.fields) - {"general.quantization_version"} <= set(ours.fields) <= set(theirs.fields) | extra
    for key, attr in SHAPE_KEYS.items():
        assert ours.fields[f"bert.{key}"].contents() == getattr(s, attr), key
    same = [k for k in theirs.fields if not k.startswith("GGUF.") and k.split(".")[-1] not in ("tokens", "token_type", "name") and k.removeprefix("bert.") not in SHAPE_KEYS]
    assert len(same) > 15 and all(ours.fields[k].contents() == theirs.fields[k].contents() for k in same), same
    assert len(ours.fields["tokenizer.ggml.tokens"].contents()) == s.n_vocab == 30_522


@pytest.mark.parametrize("type_name", ["F16", "Q8_0"])
def test_english_tokenizes_and_embeds_as_llama_cpp_does(made, type_name: str) -> None:
    path = made[type_name]
    want = llamacpp_embeddings(path, TEXTS)
    engine = open_engine(str(path), LoadOptions(engine="llama.cpp", threads=THREADS))
    try:
        tokens = [engine.tokenize_input(t) for t in TEXTS]
        got = finish(engine.embed(tokens))
        pieces = [engine.backend.token_bytes(t) for t in tokens[0]]
    finally:
        engine.close()
    for text, ids in zip(TEXTS, tokens):
        assert ids[0] == SPECIALS["[CLS]"] and ids[-1] == SPECIALS["[SEP]"] and SPECIALS["[UNK]"] not in ids, text
        assert len(text.split()) < len(ids) - 2 < 3 * len(text.split())  # whole words and a few pieces, not letter by letter
    assert b"".join(pieces).decode().replace(" ", "") == TEXTS[0].lower().replace(" ", "")  # the pieces spell the text
    assert np.isfinite(got).all() and np.abs(got - want).max() < 1e-3
    assert len({tuple(np.round(v, 3)) for v in got}) == len(TEXTS)


def test_a_vocabulary_below_the_base_is_one_line(synthetic, tmp_path: Path) -> None:
    assert_one_line_error(make(tmp_path, "tiny-bert", "--vocab", "500"), "base WordPiece tokens")
    assert not list(tmp_path.iterdir())
    assert synthetic.synthetic_bert.MIN_VOCAB > 500


def test_the_reranker_shape_has_the_fixtures_head_and_ranks_as_llama_cpp(synthetic, tmp_path: Path) -> None:
    """bert-base-reranker's code path (tiny): the fixture reranker's tensors (cls.weight,
    cls.output.weight: RoBERTa's classification head) and rank pooling; the native engine's
    scores of English pairs are llama.cpp's own within tests/engine/test_embeddings.py's 3e-3."""
    r = make(tmp_path, "tiny-bert-reranker", "--types", "F16")
    assert r.returncode == 0, r.stderr
    path = Path(r.stdout.split()[0])
    fixture = write_bert_reranker(tmp_path / "fixture.gguf")
    assert sorted(t.name for t in read_gguf(path).tensors) == sorted(t.name for t in read_gguf(fixture).tensors)
    assert inspect(path).pooling == "rank"
    query = "where is the capital"
    want = llamacpp_rerank_scores(path, query, TEXTS)
    engine = open_engine(str(path), LoadOptions(threads=THREADS))
    try:
        assert engine.backend.name == "native" and engine.kind == "rerank"
        got = engine.rank([engine.tokenize_pair(query, t) for t in TEXTS])
    finally:
        engine.close()
    assert np.allclose(got, want, atol=3e-3), (got, want)


def test_the_nomic_shape_has_the_fixtures_tensors(synthetic, tmp_path: Path) -> None:
    """nomic-embed-text's plan (bench/embeddings.py's nomic-bert) names the tensors of the
    fixture that llama.cpp loads (tests/embedding_models.write_nomic_bert), every layer alike."""
    s = synthetic.BERT_SHAPES["nomic-embed-text"]
    fixture = read_gguf(write_nomic_bert(tmp_path / "nomic.gguf"))
    plan = {spec.name: spec for spec in synthetic.plan_of(s)}
    kinds = lambda names: {n.split(".", 2)[2] if n.startswith("blk.") else n for n in names}  # noqa: E731  (a layer's tensors, whatever its number)
    assert s.arch == "nomic-bert" and kinds(plan) == kinds(t.name for t in fixture.tensors)
    assert plan["blk.0.attn_qkv.weight"].shape == (3 * s.n_embd, s.n_embd) and "position_embd.weight" not in plan
