"""bench/synthetic.py on its tiny shapes: the full-size shapes run the same code with other
numbers in their Shape, so what holds here holds for them. The script itself is run (as a
user runs it); its files are read back with gguf-py, loaded by llama.cpp and by the native
engine, and measured by `localinfer bench model`."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend, Tokenizer
from localinfer.backends.native import NativeBackend
from localinfer.engine.engine import Engine
from localinfer.engine.types import SamplingParams
from localinfer.modelfile import inspect

from ..cli.test_errors import assert_one_line_error
from ..conftest import THREADS, run_cli
from . import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "synthetic.py"
SHAPES = ["tiny", "tiny-llama"]
# llama ftype -> the block type llama.cpp gives attn_q, ffn_gate and ffn_up (it may raise others)
MAIN_TYPE = {"Q4_K_M": "Q4_K", "Q4_0": "Q4_0", "Q8_0": "Q8_0", "Q2_K": "Q2_K", "BF16": "BF16"}
TYPES = ["Q4_K_M", "Q4_0", "Q8_0"]
FILES = [(shape, t) for shape in SHAPES for t in TYPES]


@pytest.fixture(scope="module")
def synthetic():
    return load_script("synthetic")


def make(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out), "--threads", str(THREADS)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("synthetic")
    r = make(out, *SHAPES, "--types", ",".join(TYPES))
    assert r.returncode == 0, r.stderr
    return out, [Path(line) for line in r.stdout.splitlines()]


def test_writes_each_type_and_deletes_the_source(made) -> None:
    out, printed = made
    want = [out / f"{shape}-{t}.gguf" for shape, t in FILES]
    assert printed == want
    assert sorted(out.iterdir()) == sorted(want)  # no F16 source, no temporary file left


def test_files_that_exist_are_skipped(made) -> None:
    out, printed = made
    before = {p: p.stat().st_mtime_ns for p in printed}
    r = make(out, *SHAPES, "--types", ",".join(TYPES))
    assert r.returncode == 0, r.stderr
    assert [Path(line) for line in r.stdout.splitlines()] == printed
    assert r.stderr.count("exists, skipped") == len(printed)
    assert {p: p.stat().st_mtime_ns for p in out.iterdir()} == before


@pytest.mark.parametrize("shape, type_name", FILES)
def test_tensors_are_the_shape_and_the_type_asked_for(made, synthetic, shape: str, type_name: str) -> None:
    import llama_cpp

    out, _ = made
    s = synthetic.SHAPES[shape]
    info = inspect(out / f"{shape}-{type_name}.gguf")
    assert info.architecture == s.arch
    assert info.metadata["general.file_type"] == getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
    tensors = {t.name: t for t in info.tensors}
    plan = synthetic.tensor_plan(s)
    assert sorted(tensors) == sorted(t.name for t in plan)  # the quantizer writes them in its own order
    for spec in plan:
        t = tensors[spec.name]
        assert tuple(reversed(t.shape)) == spec.shape, spec.name
        if len(spec.shape) == 1:
            assert T(t.type).name == "F32", spec.name  # norms, biases and RoPE factors stay float
        elif spec.name.split(".")[-2] in ("attn_q", "ffn_gate", "ffn_up"):
            assert T(t.type).name == MAIN_TYPE[type_name], spec.name
    assert ("output.weight" in tensors) is (not s.tied)
    assert any(name.endswith("attn_q.bias") for name in tensors) is s.qkv_bias


@pytest.mark.parametrize("shape", SHAPES)
def test_metadata_and_vocabulary_are_the_architectures(made, synthetic, model_path: Path, shape: str) -> None:
    out, _ = made
    s = synthetic.SHAPES[shape]
    path = out / f"{shape}-Q8_0.gguf"
    meta = inspect(path).metadata
    want = {"block_count": s.n_layer, "embedding_length": s.n_embd, "feed_forward_length": s.n_ff, "attention.head_count": s.n_head,
            "attention.head_count_kv": s.n_head_kv, "rope.dimension_count": s.head_dim, "context_length": s.n_ctx}  # fmt: skip
    for key, value in want.items():
        assert meta[f"{s.arch}.{key}"] == value, key
    assert meta[f"{s.arch}.rope.freq_base"] == pytest.approx(s.rope_base)
    assert meta[f"{s.arch}.attention.layer_norm_rms_epsilon"] == pytest.approx(s.norm_eps)
    # llama.cpp reads the padded vocabulary as the embedded model's, plus the padding
    ours, embedded = Tokenizer.load(path), Tokenizer.load(model_path)
    assert ours.info.n_vocab == s.n_vocab and embedded.info.n_vocab < s.n_vocab
    text = "<|im_start|>user\nSynthetic weights, real shapes: 1,536 × 8,960 — ünïcödé too.<|im_end|>"
    assert ours.tokenize(text, True, True) == embedded.tokenize(text, True, True)
    assert (ours.info.bos_id, ours.info.eos_id, ours.info.eog_ids) == (embedded.info.bos_id, embedded.info.eos_id, embedded.info.eog_ids)
    assert ours.token_bytes(s.n_vocab - 1) == b""  # a [PADn] token, drawn by a random model, prints nothing
    ours.close(), embedded.close()


def llama3_factors_as_the_converter_computes(head_dim: int, base: float, factor: float, low: float, high: float, old_ctx: int) -> list[float]:
    """llama.cpp's convert_hf_to_gguf.py (LlamaModel.generate_extra_tensors), one frequency at a time."""
    out = []
    for i in range(0, head_dim, 2):
        wavelen = 2 * math.pi * base ** (i / head_dim)
        if wavelen < old_ctx / high:
            out.append(1.0)
        elif wavelen > old_ctx / low:
            out.append(factor)
        else:
            smooth = (old_ctx / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return out


@pytest.mark.parametrize("head_dim", [64, 128])
def test_llama3_rope_factors(synthetic, head_dim: int) -> None:
    ours = synthetic.llama3_rope_factors(head_dim, 5e5, synthetic.LLAMA3_ROPE)
    want = llama3_factors_as_the_converter_computes(head_dim, 5e5, *synthetic.LLAMA3_ROPE)
    np.testing.assert_allclose(ours, want, rtol=1e-6)
    assert ours.min() == 1.0 and ours.max() == 32.0 and (ours > 1).any() and (ours < 32).any()  # all three regimes


def test_a_matrix_larger_than_a_chunk_is_drawn_whole(synthetic, monkeypatch: pytest.MonkeyPatch) -> None:
    """The full-size embeddings are drawn in several chunks (tiny's fit in one): every value
    is drawn, at the intended scale, and the same seed gives the same matrix."""
    monkeypatch.setattr(synthetic, "CHUNK", 1000)
    spec = synthetic.TensorSpec("blk.0.ffn_up.weight", (37, 100), "matrix")
    tiny = synthetic.SHAPES["tiny"]
    values = synthetic.tensor_values(tiny, spec, np.random.default_rng(5))
    assert values.shape == (37, 100) and values.dtype == np.float16
    assert np.count_nonzero(values) > 0.99 * values.size  # no chunk left unwritten
    assert abs(float(values.astype(np.float32).std()) - synthetic.WEIGHT_STD) < 0.1 * synthetic.WEIGHT_STD
    np.testing.assert_array_equal(values, synthetic.tensor_values(tiny, spec, np.random.default_rng(5)))


@pytest.mark.parametrize("shape, type_name", FILES)
def test_both_engines_run_it(made, shape: str, type_name: str) -> None:
    """Each engine loads the file, tokenizes, and generates; their logits agree as on real
    quantized models (each rounds its activations a little differently)."""
    out, _ = made
    path = out / f"{shape}-{type_name}.gguf"
    tokens = np.random.default_rng(3).integers(100, 40_000, size=48).tolist()
    logits = []
    for cls in (LlamaCppBackend, NativeBackend):
        backend = cls.load(path, LoadParams(n_ctx=128, n_threads=THREADS))
        try:
            logits.append(backend.forward(Batch.for_sequence(tokens, 0, all_logits=True)).copy())  # llama.cpp's are its own buffer
            backend.kv_clear(0)
            prompt = backend.tokenize("The quick brown fox", add_special=True)
            result = Engine(backend).complete(prompt, SamplingParams(temperature=0, max_tokens=6, ignore_eos=True))
            assert len(prompt) > 1 and result.completion_tokens == len(result.tokens) == 6
        finally:
            backend.close()
    theirs, ours = logits
    assert theirs.shape == ours.shape == (len(tokens), 49_536) and np.isfinite(ours).all()
    assert np.abs(ours - theirs).mean() < 0.05 * np.abs(theirs).mean()


def test_bench_model_measures_them_on_both_engines(made) -> None:
    out, _ = made
    models = [str(out / "tiny-Q4_K_M.gguf"), str(out / "tiny-llama-Q4_0.gguf")]
    r = run_cli("bench", "model", *models, "-p", "16", "-n", "4", "-r", "1", "--engine", "llama.cpp,native", "-t", "1", "--json")
    assert r.returncode == 0, r.stderr
    rows = json.loads(r.stdout)
    assert {(row["model"], row["engine"], row["test"]) for row in rows} == {(m, e, t) for m in models for e in ("llama.cpp", "native") for t in ("pp16", "tg4")}
    assert all(row["avg_ts"] > 0 for row in rows)


def test_other_types_and_keeping_the_source(synthetic, tmp_path: Path) -> None:
    import llama_cpp

    r = make(tmp_path, "tiny", "--types", "q2_k,BF16", "--keep-source")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["tiny-BF16.gguf", "tiny-F16.gguf", "tiny-Q2_K.gguf"]
    for type_name in ("Q2_K", "BF16"):
        info = inspect(tmp_path / f"tiny-{type_name}.gguf")
        assert info.metadata["general.file_type"] == getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{type_name}")
        assert {T(t.type).name for t in info.tensors if t.name.endswith("ffn_up.weight")} == {MAIN_TYPE[type_name]}
    source = {t.name: T(t.type).name for t in inspect(tmp_path / "tiny-F16.gguf").tensors}
    assert {source[s.name] for s in synthetic.tensor_plan(synthetic.SHAPES["tiny"]) if s.kind == "matrix"} == {"F16"}


@pytest.mark.parametrize("args, needle", [(["qwen9-1t"], "unknown shape qwen9-1t"), (["tiny", "--types", "Q4_K_M,Q7_X"], "unknown type Q7_X")])
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    assert_one_line_error(make(tmp_path, *args), needle)
    assert not list(tmp_path.iterdir())
