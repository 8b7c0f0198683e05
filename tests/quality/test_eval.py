"""`localinfer eval`: perplexity and KL divergence through the backend interface, checked
against numbers computed here from llama.cpp's own logits (llama-cpp-python's Llama)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from llama_cpp import Llama

from localinfer.backends.base import LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native import NativeBackend
from localinfer.quality.evaluate import evaluate

from ..conftest import THREADS, run_cli
from ..native.test_native_vs_llamacpp import TEXT

CTX = 128


@pytest.fixture(scope="module")
def text_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("text") / "alice.txt"
    path.write_text((TEXT + "\n\n") * 3, encoding="utf-8")
    return path


def llama_cpp_perplexity(model: Path, tokens: list[int], ctx: int) -> float:
    """The definition, on logits from llama.cpp's high-level API: score the second half of
    each whole chunk of ctx tokens (SmolLM2 adds no BOS, so the chunk is unchanged)."""
    llm = Llama(str(model), n_ctx=ctx, n_threads=THREADS, flash_attn=True, logits_all=True, verbose=False)
    nll = []
    for c in range(len(tokens) // ctx):
        chunk = tokens[c * ctx : (c + 1) * ctx]
        llm.reset()
        llm.eval(chunk)
        logits = np.array(llm.scores[:ctx], dtype=np.float64)
        for i in range(ctx // 2, ctx - 1):
            row = logits[i] - logits[i].max()
            nll.append(np.log(np.exp(row).sum()) - row[chunk[i + 1]])
    llm.close()
    return float(np.exp(np.mean(nll)))


def test_perplexity_matches_llama_cpp_logits(model_path: Path, text_file: Path) -> None:
    backend = LlamaCppBackend.load(model_path, LoadParams(n_ctx=CTX, n_threads=THREADS))
    tokens = backend.tokenize(text_file.read_text(), add_special=False)
    ours = evaluate(backend, tokens, CTX)
    backend.close()
    assert ours.chunks == len(tokens) // CTX >= 3
    assert ours.tokens == ours.chunks * (CTX // 2 - 1)
    assert ours.perplexity == pytest.approx(llama_cpp_perplexity(model_path, tokens, CTX), rel=1e-4)


def test_a_model_against_itself_diverges_by_nothing(backend: LlamaCppBackend, text_file: Path) -> None:
    tokens = backend.tokenize(text_file.read_text(), add_special=False)
    result = evaluate(backend, tokens, CTX, reference=backend)
    assert result.kld["max"] < 1e-9 and result.top1_agreement == 1.0


def test_q4_1_against_its_f32_widening(model_path: Path, f32_path: Path, text_file: Path) -> None:
    """The embedded Q4_1 against the same weights in F32 (made by llama.cpp): a small but
    real divergence, and the native engine measures the same quantities as llama.cpp."""
    params = LoadParams(n_ctx=CTX, n_threads=THREADS)
    quantized, reference = LlamaCppBackend.load(model_path, params), LlamaCppBackend.load(f32_path, params)
    tokens = quantized.tokenize(text_file.read_text(), add_special=False)
    on_llama = evaluate(quantized, tokens, CTX, reference=reference)
    quantized.close()
    reference.close()
    assert 0 < on_llama.kld["mean"] < 0.5 and on_llama.kld["p99"] <= on_llama.kld["max"]
    assert 0.8 < on_llama.top1_agreement <= 1.0
    native = NativeBackend.load(model_path, LoadParams(n_ctx=CTX, n_threads=THREADS, kernels="c"))
    native_ref = NativeBackend.load(f32_path, LoadParams(n_ctx=CTX, n_threads=THREADS, kernels="c"))
    on_native = evaluate(native, tokens, CTX, reference=native_ref)
    assert on_native.perplexity == pytest.approx(on_llama.perplexity, rel=0.03)
    assert on_native.kld["mean"] == pytest.approx(on_llama.kld["mean"], rel=0.5)


def test_cli_json(text_file: Path) -> None:
    plain = run_cli("eval", "--text", str(text_file), "--ctx", str(CTX), "--json", "smollm2:135m")
    assert plain.returncode == 0, plain.stderr
    out = json.loads(plain.stdout)
    assert set(out) == {"perplexity", "tokens"} and out["perplexity"] > 1
    with_ref = run_cli("eval", "--text", str(text_file), "--ctx", str(CTX), "--ref", "smollm2:135m", "--engine", "native", "--json", "smollm2:135m")
    assert with_ref.returncode == 0, with_ref.stderr
    out = json.loads(with_ref.stdout)
    assert set(out) == {"perplexity", "tokens", "kld", "top1_agreement"} and set(out["kld"]) == {"mean", "p99", "max"}
    assert out["top1_agreement"] == 1.0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--text", "/nonexistent.txt"], "error: no such text file: /nonexistent.txt"),
        (["--ctx", "4096"], "fewer than one chunk of --ctx 4096"),
    ],
)
def test_cli_errors_are_one_line(args: list[str], message: str, text_file: Path) -> None:
    if "--text" not in args:
        args = ["--text", str(text_file), *args]
    result = run_cli("eval", *args, "smollm2:135m")
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_default_text_is_the_shipped_public_domain_book() -> None:
    result = run_cli("eval", "--ctx", str(CTX), "--chunks", "2", "--json", "smollm2:135m")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["tokens"] == 2 * (CTX // 2 - 1)
    from localinfer.cli.eval import default_text

    assert default_text().read_text().startswith("ALICE'S ADVENTURES IN WONDERLAND")
