"""The native backend behind the runtime's interface: KV operations, batching, clear
errors for what it does not run, memory, and the CLI's --engine native / --kernels."""

from __future__ import annotations

import ctypes
import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.native import NativeBackend
from localinfer.backends.native.config import ARCHITECTURES, UnsupportedModel

from ..conftest import THREADS, check_batched_sequences_match_single_runs, run_cli


@pytest.fixture(scope="module")
def native(model_path: Path):
    b = NativeBackend.load(model_path, LoadParams(n_ctx=1024, n_threads=THREADS, n_seq_max=4))
    yield b
    b.close()


def last_logits(b: NativeBackend, tokens: list[int], start: int, seq: int) -> np.ndarray:
    return b.forward(Batch.for_sequence(tokens, start, seq))[0]


def test_batched_sequences_match_single_runs(f32_path: Path) -> None:
    """On F32 weights, where no activation is quantized, so batching cannot move a rounding."""
    native = NativeBackend.load(f32_path, LoadParams(n_ctx=256, n_threads=THREADS, n_seq_max=4))
    try:
        check_batched_sequences_match_single_runs(native)
    finally:
        native.close()


def test_logit_rows_round_the_same_whatever_runs_beside_them(native: NativeBackend) -> None:
    """A decode row placed before another sequence's prompt rows in one forward: the prompt
    rows may take the kernels' fast path (AMX), the rows that make logits never do, so both
    sequences' logits equal those of running each alone, bit for bit."""
    a = native.tokenize("The quick brown fox jumps over the lazy dog, and then", add_special=False)
    b = native.tokenize("Water boils at", add_special=False)
    alone_a = last_logits(native, a, 0, 1)
    last_logits(native, b, 0, 2)
    alone_b = last_logits(native, [a[0]], len(b), 2)
    native.kv_clear(1)
    native.kv_clear(2)
    last_logits(native, b, 0, 2)
    mixed = Batch(
        tokens=np.array([a[0], *a], dtype=np.int32),
        positions=np.array([len(b), *range(len(a))], dtype=np.int32),
        seq_ids=np.array([2] + [1] * len(a), dtype=np.int32),
        want_logits=np.array([True] + [False] * (len(a) - 1) + [True]),
    )
    got_b, got_a = native.forward(mixed)
    native.kv_clear(1)
    native.kv_clear(2)
    np.testing.assert_array_equal(got_a, alone_a)
    np.testing.assert_array_equal(got_b, alone_b)


def test_kv_truncate_and_copy(native: NativeBackend) -> None:
    prefix = native.tokenize("One, two, three, four,", add_special=False)
    tail = native.tokenize(" five, six", add_special=False)
    full = last_logits(native, prefix + tail, 0, 1)
    # Truncate back to the prefix and decode the tail again: the same logits.
    native.kv_truncate(1, len(prefix))
    again = last_logits(native, tail, len(prefix), 1)
    assert np.abs(again - full).max() < 1e-4
    # Share the prefix with another sequence and continue there instead.
    native.kv_copy(1, 3, len(prefix))
    copied = last_logits(native, tail, len(prefix), 3)
    assert np.abs(copied - full).max() < 1e-4
    native.kv_clear(1)
    native.kv_clear(3)


def test_context_overflow_is_a_clear_error(model_path: Path) -> None:
    from localinfer.errors import ContextOverflow

    b = NativeBackend.load(model_path, LoadParams(n_ctx=16, n_threads=THREADS))
    with pytest.raises(ContextOverflow, match="raise --ctx"):
        b.forward(Batch.for_sequence(list(range(20)), 0))


@pytest.mark.parametrize("kernels", ["c", "numba"])
def test_resident_memory_beyond_the_mapping_is_bounded(kernels: str) -> None:
    """Weights stay mapped: what the engine adds is the KV cache and activations, not a copy.
    Measured by the CLI's own --verbose report, in a fresh process, on a 500-token prompt."""
    prompt = "Summarize: " + "word " * 500
    result = run_cli("run", "--engine", "native", "--kernels", kernels, "--verbose", "--max-tokens", "32", "--temperature", "0", prompt)
    assert result.returncode == 0, result.stderr
    found = re.search(
        r"weights ([\d.]+) MB mapped \| resident beyond the mapping ([\d.]+) MB "
        r"\(KV cache ([\d.]+) MB, activations ([\d.]+) MB, prompt cache in RAM ([\d.]+) MB\)",
        result.stderr,
    )
    assert found, result.stderr
    mapped, resident, kv, activations, kept = map(float, found.groups())
    assert kv > 10 and activations > 0  # ~530 positions x 23 KB of float16 keys and values
    assert kept > 0  # the prompt's blocks, kept for the next request: by design, and counted
    assert resident < 2 * kv + activations + kept, result.stderr
    assert resident - kept < mapped / 2, result.stderr  # no copy of the weights


def write_gguf(path: Path, arch: str) -> Path:
    w = GGUFWriter(str(path), arch)
    w.add_block_count(1)
    w.add_context_length(128)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_tensor("token_embd.weight", np.zeros((32, 64), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_architecture_names_it_and_points_to_llama_cpp(tmp_path: Path) -> None:
    path = write_gguf(tmp_path / "tiny-gemma2.gguf", "gemma2")
    with pytest.raises(UnsupportedModel, match=r"'gemma2'.*--engine llama\.cpp"):
        NativeBackend.load(path, LoadParams(n_ctx=64))
    result = run_cli("run", "--engine", "native", str(path), "hi")
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        f"error: the native engine does not run the 'gemma2' architecture (it runs {', '.join(ARCHITECTURES)}); use --engine llama.cpp"
    ]


def test_unsupported_block_type_is_named_at_load(model_path: Path, tmp_path: Path) -> None:
    """llama.cpp's TQ2_0 (ternary) for SmolLM2's ffn_down rows: a type no kernel set runs."""
    import llama_cpp

    out = tmp_path / "tq2_0.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_TQ2_0
    params.allow_requantize = True
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(str(model_path).encode(), str(out).encode(), ctypes.byref(params)) == 0
    with pytest.raises(UnsupportedModel, match=r"type TQ2_0 \(tensor [\w.]+\) is not supported by the native engine's c kernels; use --engine llama\.cpp"):
        NativeBackend.load(out, LoadParams(n_ctx=64, kernels="c"))


@pytest.mark.parametrize("kernels", ["c", "numba"])
def test_cli_runs_native_and_says_which_kernels_ran(kernels: str) -> None:
    result = run_cli("run", "--engine", "native", "--kernels", kernels, "--temperature", "0", "--max-tokens", "12", "--verbose", "What is the capital of France?")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip()
    assert f"native kernels: {kernels} " in result.stderr
    assert "resident beyond the mapping" in result.stderr


def test_kernels_from_the_environment() -> None:
    result = run_cli("run", "--engine", "native", "--temperature", "0", "--max-tokens", "4", "--verbose", "Hi", env={"LOCALINFER_KERNELS": "numba"})
    assert result.returncode == 0, result.stderr
    assert "native kernels: numba " in result.stderr


def test_bad_kernel_set_is_a_usage_error() -> None:
    result = run_cli("run", "--engine", "native", "--kernels", "fortran", "Hi")
    assert result.returncode == 2
    assert "'fortran' is not one of: auto, c, numba" in result.stderr
    assert "Traceback" not in result.stderr
