"""The native engine against llama.cpp, the reference we did not write.

On the embedded Q4_1 model and on a Q4_K_M made from it by llama.cpp's own quantizer in
the test: teacher-forced logits agree on the top-1 token at >= 99% of 256 positions, and
greedy continuations are identical for 32 tokens on 5 prompts. Both kernel sets run.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native import NativeBackend
from localinfer.engine.engine import Engine
from localinfer.engine.types import SamplingParams
from localinfer.modelfile import inspect

from ..conftest import THREADS

# Lewis Carroll, Alice's Adventures in Wonderland (1865), public domain.
TEXT = (
    "Alice was beginning to get very tired of sitting by her sister on the bank, and of having nothing to do: "
    "once or twice she had peeped into the book her sister was reading, but it had no pictures or conversations "
    "in it, 'and what is the use of a book,' thought Alice 'without pictures or conversations?' So she was "
    "considering in her own mind (as well as she could, for the hot day made her feel very sleepy and stupid), "
    "whether the pleasure of making a daisy-chain would be worth the trouble of getting up and picking the daisies, "
    "when suddenly a White Rabbit with pink eyes ran close by her. There was nothing so very remarkable in that; "
    "nor did Alice think it so very much out of the way to hear the Rabbit say to itself, 'Oh dear! Oh dear! I "
    "shall be late!' (when she thought it over afterwards, it occurred to her that she ought to have wondered at "
    "this, but at the time it all seemed quite natural); but when the Rabbit actually took a watch out of its "
    "waistcoat-pocket, and looked at it, and then hurried on, Alice started to her feet, for it flashed across "
    "her mind that she had never before seen a rabbit with either a waistcoat-pocket, or a watch to take out of "
    "it, and burning with curiosity, she ran across the field after it."
)
N_FORCED = 256
PROMPTS = [
    "Why is the sky blue?",
    "Write a Python function that checks whether a number is prime.",
    "List three facts about the Moon.",
    "Translate to French: The weather is nice today and I would like to go for a walk.",
    "What is 17 times 23? Explain step by step.",
]
N_GREEDY = 32
KERNEL_SETS = ["c", "numba"]


@pytest.fixture(scope="session")
def q4_k_m_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A Q4_K_M of the embedded model, made by llama.cpp's quantizer (llama_model_quantize)."""
    import llama_cpp

    out = tmp_path_factory.mktemp("q4km") / "smollm2-135m-q4_k_m.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M
    params.allow_requantize = True  # the source is itself Q4_1
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(str(model_path).encode(), str(out).encode(), ctypes.byref(params)) == 0
    types = inspect(out).tensor_types
    assert types.get("Q4_K") and types.get("Q6_K"), types  # the K-quant kernels really run
    return out


@pytest.fixture(scope="module", params=["embedded-q4_1", "q4_k_m"])
def model_file(request: pytest.FixtureRequest, model_path: Path) -> Path:
    return model_path if request.param == "embedded-q4_1" else request.getfixturevalue("q4_k_m_path")


@pytest.fixture(scope="module")
def reference(model_file: Path):
    b = LlamaCppBackend.load(model_file, LoadParams(n_ctx=1024, n_threads=THREADS))
    yield b
    b.close()


@pytest.fixture(scope="module", params=KERNEL_SETS)
def native(request: pytest.FixtureRequest, model_file: Path):
    b = NativeBackend.load(model_file, LoadParams(n_ctx=1024, n_threads=THREADS, kernels=request.param))
    assert b.kernels.name == request.param
    yield b
    b.close()


def test_teacher_forced_logits_agree(native: NativeBackend, reference: LlamaCppBackend, record_property) -> None:
    tokens = reference.tokenize(TEXT, add_special=False)[:N_FORCED]
    assert len(tokens) == N_FORCED
    batch = Batch.for_sequence(tokens, 0, all_logits=True)
    ours, theirs = native.forward(batch), reference.forward(batch)
    native.kv_clear(0)
    reference.kv_clear(0)
    agree = float(np.mean(ours.argmax(axis=1) == theirs.argmax(axis=1)))
    diff = np.abs(ours - theirs)
    summary = f"top-1 agreement {agree:.4f}, max |diff| {diff.max():.4f}, mean |diff| {diff.mean():.4f}"
    record_property("logits", summary)
    print(f"\n{native.facts.path.name} [{native.kernels.describe()}]: {summary}")
    assert agree >= 0.99, summary


def test_greedy_continuations_identical(native: NativeBackend, reference: LlamaCppBackend) -> None:
    greedy = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=N_GREEDY)
    ours_engine, ref_engine = Engine(native), Engine(reference)
    for prompt in PROMPTS:
        tokens = ref_engine.tokenize_prompt(ref_engine.render_chat([{"role": "user", "content": prompt}]))
        expected = ref_engine.complete(tokens, greedy)
        got = ours_engine.complete(tokens, greedy)
        assert len(expected.tokens) == N_GREEDY, "the reference stopped early; pick a prompt with a longer answer"
        assert got.tokens == expected.tokens, f"{prompt!r}:\n ours: {got.text!r}\n llama.cpp: {expected.text!r}"


def test_prefill_in_one_batch_equals_token_by_token(native: NativeBackend) -> None:
    """The batched kernels (prefill) and the single-row ones (decode) compute the same model."""
    tokens = native.tokenize("The quick brown fox jumps over the lazy dog because", add_special=False)
    batched = native.forward(Batch.for_sequence(tokens, 0, seq_id=1, all_logits=True))
    stepped = np.concatenate([native.forward(Batch.for_sequence([t], i, seq_id=2)) for i, t in enumerate(tokens)])
    native.kv_clear(1)
    native.kv_clear(2)
    assert (batched.argmax(axis=1) == stepped.argmax(axis=1)).all()
    assert np.abs(batched - stepped).max() < 0.05
