"""bench/synthetic.py's mixtures of experts (bench/synthetic_moe.py): Qwen3-30B-A3B and
gpt-oss-20b at their real per-layer shapes, two layers each and the embedded tokenizer's
vocabulary (`--layers 2 --vocab 49536`, as a user makes them: 2 GB, not 30), read back and
run by llama.cpp; their block types are checked against llama.cpp's own quantizer on small
probes of the same architectures, and the whole shapes' bytes against the real files'."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.engine.engine import Engine
from localinfer.engine.types import SamplingParams
from localinfer.modelfile import inspect

from ..cli.test_errors import assert_one_line_error
from ..conftest import THREADS, llama_quantize
from . import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "synthetic.py"
SHAPES = ["qwen3-30b-a3b", "gpt-oss-20b"]
LAYERS = 2  # gpt-oss: a sliding-window layer (0) and a global one (1); qwen3moe: ffn_down_exps in Q4_K (0) and Q6_K (1)
VOCAB = 49_536  # the embedded tokenizer's 49,152 tokens and some padding, as the dense tiny shapes have
CUT = ["--layers", str(LAYERS), "--vocab", str(VOCAB)]
# the real files' sizes in bytes, from the listings docs/models.md cites for the catalog's
# qwen3:30b-a3b (Qwen/Qwen3-30B-A3B-GGUF) and gpt-oss:20b (ggml-org/gpt-oss-20b-GGUF)
REAL_BYTES = {"qwen3-30b-a3b": 18_556_685_824, "gpt-oss-20b": 12_109_566_560}


@pytest.fixture(scope="module")
def moe():
    return load_script("synthetic_moe")


def make(out: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args, "--out", str(out)], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def made(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[Path]]:
    out = tmp_path_factory.mktemp("synthetic-moe")
    r = make(out, *SHAPES, *CUT)
    assert r.returncode == 0, r.stderr
    return out, [Path(line) for line in r.stdout.splitlines()]


def test_writes_one_file_per_shape_in_its_real_type(made) -> None:
    out, printed = made
    want = [out / f"qwen3-30b-a3b-L{LAYERS}-V{VOCAB}-Q4_K_M.gguf", out / f"gpt-oss-20b-L{LAYERS}-V{VOCAB}-MXFP4_MOE.gguf"]
    assert printed == want
    assert sorted(out.iterdir()) == sorted(want)  # no temporary file left
    r = make(out, *SHAPES, *CUT)
    assert r.returncode == 0 and [Path(line) for line in r.stdout.splitlines()] == want and r.stderr.count("exists, skipped") == 2


@pytest.mark.parametrize("shape", SHAPES)
def test_tensors_and_metadata_are_llama_cpps(made, moe, shape: str) -> None:
    """Every tensor of the plan (llama.cpp's names, the real files' types) and the keys
    llama.cpp reads, read back with our GGUF scan."""
    import llama_cpp

    out, _ = made
    s = moe.MOE_SHAPES[shape].cut(LAYERS, VOCAB)
    info = inspect(out / f"{s.name}-{s.ftype}.gguf")
    tensors = {t.name: t for t in info.tensors}
    plan = moe.tensor_plan(s)
    assert sorted(tensors) == sorted(t.name for t in plan)
    for t in plan:
        assert (tuple(reversed(tensors[t.name].shape)), T(tensors[t.name].type)) == (t.shape, t.type), t.name
    meta, a = info.metadata, s.arch
    assert info.architecture == a and meta["general.file_type"] == getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{s.ftype}")
    want = {"block_count": LAYERS, "embedding_length": s.n_embd, "attention.head_count": s.n_head, "attention.head_count_kv": s.n_head_kv,
            "attention.key_length": s.head_dim, "expert_count": s.n_expert, "expert_used_count": s.n_expert_used,
            "expert_feed_forward_length": s.n_ff_exp, "context_length": s.n_ctx}  # fmt: skip
    assert {key: meta[f"{a}.{key}"] for key in want} == want
    assert meta[f"{a}.rope.freq_base"] == pytest.approx(s.rope_base)
    assert (info.n_expert, info.n_expert_used) == (s.n_expert, s.n_expert_used)
    if a == "gpt-oss":  # llama_model_openai_moe: sinks, biases, post_attention_norm as the FFN's norm, YaRN, the window
        assert {"blk.0.attn_sinks.weight", "blk.1.ffn_down_exps.bias", "blk.0.ffn_gate_inp.bias", "blk.1.post_attention_norm.weight"} <= tensors.keys()
        assert not any(name.endswith("ffn_norm.weight") for name in tensors)
        assert (meta[f"{a}.attention.sliding_window"], meta[f"{a}.rope.scaling.type"], meta[f"{a}.rope.scaling.original_context_length"]) == (128, "yarn", 4096)
        assert meta[f"{a}.rope.scaling.factor"] == pytest.approx(32.0)
    else:  # llama_model_qwen3moe: q/k norms, an untied output, Q6_K where use_more_bits says
        assert {"blk.0.attn_q_norm.weight", "blk.1.attn_k_norm.weight", "output.weight"} <= tensors.keys()
        assert [T(tensors[f"blk.{i}.ffn_down_exps.weight"].type).name for i in range(LAYERS)] == ["Q4_K", "Q6_K"]


@pytest.mark.parametrize("shape", SHAPES)
def test_llama_cpp_runs_them(made, moe, shape: str) -> None:
    """llama.cpp loads each file, its logits at the end of 160 positions (past gpt-oss's
    128-position window) are finite and differ from row to row, and it generates."""
    out, _ = made
    s = moe.MOE_SHAPES[shape].cut(LAYERS, VOCAB)
    tokens = np.random.default_rng(3).integers(100, 40_000, size=160).tolist()
    backend = LlamaCppBackend.load(out / f"{s.name}-{s.ftype}.gguf", LoadParams(n_ctx=256, n_threads=THREADS))
    try:
        logits = backend.forward(Batch.of_rows([(0, tokens, 0, 8)])).copy()  # the last 8 rows; llama.cpp's logits are its own buffer
        assert logits.shape == (8, s.n_vocab) and np.isfinite(logits).all()
        assert logits.std(axis=1).min() > 0 and (np.abs(logits[1:] - logits[0]).max(axis=1) > 0).all()  # no row repeats the first
        backend.kv_clear(0)
        prompt = backend.tokenize("The quick brown fox", add_special=True)
        result = Engine(backend).complete(prompt, SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        assert result.completion_tokens == len(result.tokens) == 4
    finally:
        backend.close()


def probe(s, n_layer: int):  # s: MoeShape
    """The architecture at small sizes (rows still whole blocks of every type), for llama.cpp's
    quantizer to choose types on: 16 experts, not 8 (llama.cpp raises some types for 8)."""
    if s.arch == "gpt-oss":
        return replace(s, n_layer=n_layer, n_embd=64, n_ff=64, n_head=8, n_head_kv=1, head_dim=16, n_expert=16, n_expert_used=4, n_ff_exp=64, n_vocab=512)
    return replace(s, n_layer=n_layer, n_embd=256, n_ff=512, n_head=8, n_head_kv=1, head_dim=32, n_expert=16, n_expert_used=2, n_ff_exp=256, n_vocab=512)


@pytest.mark.parametrize("shape, n_layer", [("qwen3-30b-a3b", 8), ("gpt-oss-20b", 2)])
def test_block_types_are_llama_cpps_choices(moe, tmp_path: Path, shape: str, n_layer: int) -> None:
    """An F16 probe of the architecture, quantized by llama.cpp's own quantizer to the shape's
    ftype, gets the block types the plan gives the real shape's names: for Q4_K_M the
    use_more_bits layers' attn_v and ffn_down_exps in Q6_K (8 layers: 0, 3, 6, 7), for
    MXFP4_MOE the experts in MXFP4 and the other matrices in Q8_0."""
    import llama_cpp

    s = probe(moe.MOE_SHAPES[shape], n_layer)
    plan = moe.tensor_plan(s)
    rng = np.random.default_rng(0)
    w = GGUFWriter(str(tmp_path / "probe-F16.gguf"), s.arch)
    moe.add_metadata(w, s, llama_cpp.LLAMA_FTYPE_MOSTLY_F16)  # no tokenizer: the quantizer reads none
    for t in plan:
        values = 0.02 * rng.standard_normal(t.shape).astype(np.float32)
        w.add_tensor(t.name, values.astype(np.float16) if t.kind == "matrix" else values)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    quantized = llama_quantize(tmp_path / "probe-F16.gguf", tmp_path / "probe.gguf", getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{s.ftype}"))
    theirs = {t.name: T(t.type).name for t in inspect(quantized).tensors}
    assert theirs == {t.name: t.type.name for t in plan}
    if s.ftype == "Q4_K_M":
        assert [i for i in range(n_layer) if theirs[f"blk.{i}.attn_v.weight"] == "Q6_K"] == [0, 3, 6, 7]


def test_the_whole_shapes_are_the_real_files_less_their_metadata(moe) -> None:
    """At full size, the tensors' bytes fall short of the real files' by their metadata alone
    (the tokenizer and chat template: a few MB), so the types and shapes are theirs: gpt-oss's
    attention in BF16 instead of Q8_0 would add 0.6 GB, Q6_K's layers one more 52 MB each."""
    for name, real in REAL_BYTES.items():
        written = sum(t.nbytes for t in moe.tensor_plan(moe.MOE_SHAPES[name]))
        assert 0 < real - written < 16e6, (name, real - written)


class Interrupted(Exception):
    pass


def test_an_interrupted_write_leaves_nothing(moe, tmp_path: Path) -> None:
    """Stopped after a few tensors (Ctrl-C, a full disk), the write leaves no file behind."""
    s = probe(moe.MOE_SHAPES["gpt-oss-20b"], 2)
    seen = []

    def progress(done: int, total: int, name: str) -> None:
        seen.append(name)
        if len(seen) == 5:
            raise Interrupted

    with pytest.raises(Interrupted):
        moe.write(s, tmp_path / "probe.gguf", 0, progress, lambda w, n_vocab: None)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("args, needle", [
    (["gpt-oss-20b", "--layers", "25"], "--layers 25 is not between 1 and the shape's layer count (gpt-oss-20b has 24)"),
    (["qwen3-30b-a3b", "--layers", "0"], "--layers 0 is not between 1"),
    (["gpt-oss-20b", "--types", "Q4_K_M"], "gpt-oss-20b is made only in its real file's types, MXFP4_MOE"),
    (["qwen3-30b-a3b", "--vocab", "1000"], "--vocab 1000 is fewer than the tokenizer's 49,152 tokens"),
])  # fmt: skip
def test_bad_input_is_one_line(tmp_path: Path, args: list[str], needle: str) -> None:
    assert_one_line_error(make(tmp_path, *args), needle)
    assert not list(tmp_path.iterdir())


def test_help_says_speed_scales_with_the_layer_count() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--help"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0 and "scale with the layer count" in " ".join(r.stdout.split())
