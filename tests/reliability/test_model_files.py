"""Fuzzed model files (issue 15, item 1): a short seeded run of bench/fuzz_gguf.py, and a
regression test for each thing the long runs found. Each mutant is the tiny llama GGUF with
named header fields changed, so a test says exactly which field it breaks."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.native import NativeBackend
from localinfer.errors import InvalidModelFile
from localinfer.modelfile import inspect

from ..cli.test_errors import assert_one_line_error
from ..conftest import run_cli
from .tiny_gguf import Layout, layout, write_tiny_model

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seed(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, Layout]:
    data = write_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny.gguf").read_bytes()
    return data, layout(data)


def edited(seed: tuple[bytes, Layout], path: Path, **values: int | bytes) -> Path:
    """The seed with fields (by label, dots as __) set to integers or raw bytes."""
    data, lay = seed
    out = bytearray(data)
    for label, value in values.items():
        f = next(f for f in lay.fields if f.label == label.replace("__", "."))
        out[f.start : f.start + f.size] = value if isinstance(value, bytes) else value.to_bytes(f.size, "little")
    path.write_bytes(bytes(out))
    return path


def one_line_refusal(path: Path, *needles: str) -> str:
    """Loading `path` on the native engine is an InvalidModelFile of one printable line."""
    with pytest.raises(InvalidModelFile) as e:
        NativeBackend.load(path, LoadParams(n_ctx=16, n_threads=1))
    message = str(e.value)
    assert "\n" not in message and message.isprintable(), message
    for needle in needles:
        assert needle in message, message
    return message


def test_the_tiny_model_runs(seed: tuple[bytes, Layout], tmp_path: Path) -> None:
    path = tmp_path / "ok.gguf"
    path.write_bytes(seed[0])
    backend = NativeBackend.load(path, LoadParams(n_ctx=16, n_threads=1))
    logits = backend.forward(Batch.for_sequence([1, 5, 7], 0))
    backend.close()
    assert logits.shape == (1, 48) and np.isfinite(logits).all()


def test_a_short_seeded_fuzz_run_finds_nothing() -> None:
    """2,000 mutants through the scanner, the native load and forward, and the quantizer."""
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "fuzz_gguf.py"), "--cases", "2000", "--seed", "15", "--json"], capture_output=True, text=True, timeout=600)
    report = json.loads(r.stdout)
    assert report["findings"] == [] and r.returncode == 0, report["findings"]
    assert report["cases"] == 2000
    # every stage was reached and refused something, and some mutants were harmless
    assert {"accepted", "refused at scan", "refused at native", "refused at quantize"} <= set(report["outcomes"]), report["outcomes"]


# --- what the fuzzer found --------------------------------------------------------------


def test_a_tensor_shape_that_disagrees_with_the_sizes_is_refused_before_any_kernel(seed, tmp_path: Path) -> None:
    """Was an AssertionError (a norm of 60 floats) or a kernel writing past its output (a
    matrix with more rows than the layer's width)."""
    one_line_refusal(edited(seed, tmp_path / "a.gguf", blk__0__attn_norm__weight__dim0=60), "blk.0.attn_norm.weight", "[60]", "[64]")
    one_line_refusal(edited(seed, tmp_path / "b.gguf", blk__1__attn_q__weight__dim1=32), "blk.1.attn_q.weight")
    one_line_refusal(edited(seed, tmp_path / "c.gguf", output__weight__dim1=24), "output.weight")


def test_control_characters_in_a_tensor_name_stay_out_of_the_message(seed, tmp_path: Path) -> None:
    """A name with a newline made a 150-line error; a long one is refused, as llama.cpp does."""
    f = next(f for f in seed[1].fields if f.label == "output_norm.weight.name")
    weird = b"out\nput\x1b[31m_norm.weight"[: f.size].ljust(f.size, b"x")
    message = one_line_refusal(edited(seed, tmp_path / "a.gguf", output_norm__weight__name=weird, output_norm__weight__n_dims=7), "7 dimensions")
    assert "\\n" in message and "\x1b" not in message
    message = one_line_refusal(edited(seed, tmp_path / "b.gguf", tensor_name__length=200), "too long")  # runs on into the next fields
    assert len(message) < 400


def test_overlapping_unaligned_and_ragged_tensors_are_refused(seed, tmp_path: Path) -> None:
    data, lay = seed
    offset = {f.label: int.from_bytes(data[f.start : f.start + f.size], "little") for f in lay.fields if f.kind == "offset"}
    one_line_refusal(edited(seed, tmp_path / "a.gguf", blk__1__attn_k__weight__offset=offset["blk.1.attn_q.weight.offset"]), "overlap")
    one_line_refusal(edited(seed, tmp_path / "b.gguf", blk__1__attn_k__weight__offset=offset["blk.1.attn_k.weight.offset"] + 1), "not aligned")
    one_line_refusal(edited(seed, tmp_path / "c.gguf", blk__0__attn_q__weight__dim0=48), "blocks of 32")


def test_a_repeated_vocabulary_token_is_refused_before_llama_cpp_aborts(seed, tmp_path: Path) -> None:
    """llama.cpp ends the process (GGML_ASSERT, SIGABRT) on a vocabulary with a token twice."""
    bad = edited(seed, tmp_path / "dup.gguf", **{"tokenizer__ggml__tokens[7]": b"t6"})
    one_line_refusal(bad, "vocabulary twice")
    assert_one_line_error(run_cli("run", "--engine", "llama.cpp", str(bad), "hi"), "vocabulary twice")


def test_nan_and_nested_metadata(seed, tmp_path: Path) -> None:
    nan = struct.pack("<f", float("nan"))
    one_line_refusal(edited(seed, tmp_path / "eps.gguf", llama__attention__layer_norm_rms_epsilon=nan), "RMS epsilon nan")
    one_line_refusal(edited(seed, tmp_path / "base.gguf", llama__rope__freq_base=struct.pack("<f", float("inf"))), "rope.freq_base = inf")
    # an integer size stored as a NaN float32 (type 6) reads as absent, not as a ValueError
    ctx = edited(seed, tmp_path / "ctx.gguf", llama__context_length__type=6, llama__context_length=nan)
    assert inspect(ctx).context_length is None
    nested = edited(seed, tmp_path / "nested.gguf", **{"tokenizer__ggml__scores__element_type": 9})
    with pytest.raises(InvalidModelFile, match="array of arrays"):
        inspect(nested)


def test_a_template_that_is_not_utf8_loads(seed, tmp_path: Path) -> None:
    """Was a UnicodeDecodeError from the vocabulary's chat template."""
    data, lay = seed
    f = next(f for f in lay.fields if f.label == "tokenizer.chat_template")
    bad = edited(seed, tmp_path / "t.gguf", tokenizer__chat_template=b"\xd4" + data[f.start + 1 : f.start + f.size])
    backend = NativeBackend.load(bad, LoadParams(n_ctx=16, n_threads=1))
    assert backend.facts.chat_template.startswith("\ufffd")
    backend.close()
