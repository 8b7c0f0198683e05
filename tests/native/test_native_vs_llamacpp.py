"""The native engine against llama.cpp, the reference we did not write.

Three models, all made from the embedded one by llama.cpp itself: the embedded Q4_1, a
Q4_K_M from llama.cpp's quantizer, and an F32 from the same quantizer (the Q4_1 weights
widened to floats, so no activation is ever quantized).

On F32 the issue's criteria hold as written: top-1 agreement >= 99% over 256 teacher-forced
tokens, and identical greedy continuations for 32 tokens on 5 prompts.

On the quantized models both engines quantize every activation to 8 bits before each
product, and a rounding step is a cliff: a change of one part in a million anywhere moves
the logits by ~0.17 on average (bench/native_agreement.py measures it). llama.cpp then
disagrees with itself: its two attention paths (flash attention on and off) agree on only
~95% of top-1 tokens. There we hold the native engine to llama.cpp's own spread, measured
in the test, instead of to a bar llama.cpp does not meet itself. docs/benchmarks.md has
the figures against the issue's targets.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from llama_cpp import Llama

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native import NativeBackend
from localinfer.engine.engine import Engine
from localinfer.engine.types import SamplingParams
from localinfer.modelfile import inspect

from ..conftest import THREADS, complete_together

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
N_CTX = 1024


@pytest.fixture(scope="module", params=["f32", "q4_1", "q4_k_m"])
def model_file(request: pytest.FixtureRequest, model_path: Path) -> Path:
    return {"q4_1": lambda: model_path, "q4_k_m": lambda: request.getfixturevalue("q4_k_m_path"), "f32": lambda: request.getfixturevalue("f32_path")}[request.param]()


@pytest.fixture(scope="module")
def reference(model_file: Path):
    """llama.cpp through our backend: its defaults (flash attention on, F16 KV cache)."""
    b = LlamaCppBackend.load(model_file, LoadParams(n_ctx=N_CTX, n_threads=THREADS))
    yield b
    b.close()


@pytest.fixture(scope="module", params=["c", "numba"])
def native(request: pytest.FixtureRequest, model_file: Path):
    b = NativeBackend.load(model_file, LoadParams(n_ctx=N_CTX, n_threads=THREADS, kernels=request.param))
    assert b.kernels.name == request.param
    yield b
    b.close()


def is_quantized(path: Path) -> bool:
    return set(inspect(path).tensor_types) != {"F32"}


def forced_logits(backend, tokens: list[int]) -> np.ndarray:
    logits = backend.forward(Batch.for_sequence(tokens, 0, all_logits=True))
    backend.kv_clear(0)
    return logits


def llama_cpp_without_flash_attention(path: Path, tokens: list[int]) -> np.ndarray:
    """llama.cpp's other attention path, straight from llama-cpp-python's own API."""
    llm = Llama(str(path), n_ctx=N_CTX, n_threads=THREADS, flash_attn=False, logits_all=True, verbose=False)
    try:
        llm.eval(tokens)
        return np.array(llm.scores[: len(tokens)], dtype=np.float32)
    finally:
        llm.close()


def agreement(a: np.ndarray, b: np.ndarray) -> tuple[float, float, float]:
    diff = np.abs(a - b)
    return float(np.mean(a.argmax(axis=1) == b.argmax(axis=1))), float(diff.mean()), float(diff.max())


def test_teacher_forced_logits(native: NativeBackend, reference: LlamaCppBackend, record_property) -> None:
    tokens = reference.tokenize(TEXT, add_special=False)[:N_FORCED]
    assert len(tokens) == N_FORCED
    theirs = forced_logits(reference, tokens)
    top1, mean, worst = agreement(forced_logits(native, tokens), theirs)
    line = f"{native.facts.path.name} [{native.kernels.name}]: top-1 {top1:.4f}, mean |diff| {mean:.4f}, max |diff| {worst:.4f}"
    if not is_quantized(native.facts.path):
        print(f"\n{line}")
        record_property("agreement", line)
        assert top1 >= 0.99 and mean < 0.02, line
        return
    self_top1, self_mean, self_worst = agreement(llama_cpp_without_flash_attention(native.facts.path, tokens), theirs)
    line += f" | llama.cpp's own spread (flash attention off vs on): top-1 {self_top1:.4f}, mean |diff| {self_mean:.4f}, max {self_worst:.4f}"
    print(f"\n{line}")
    record_property("agreement", line)
    assert top1 >= self_top1 - 0.03, line
    assert mean <= 1.5 * self_mean, line


def test_greedy_continuations_identical_on_f32(f32_path: Path) -> None:
    greedy = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=N_GREEDY)
    ref_backend = LlamaCppBackend.load(f32_path, LoadParams(n_ctx=N_CTX, n_threads=THREADS))
    ref = Engine(ref_backend)
    expected = {}
    for prompt in PROMPTS:
        tokens = ref.tokenize_prompt(ref.render_chat([{"role": "user", "content": prompt}]))
        expected[prompt] = (tokens, ref.complete(tokens, greedy))
        assert len(expected[prompt][1].tokens) == N_GREEDY, "the reference stopped early; pick a prompt with a longer answer"
    ref_backend.close()
    for kernels in ("c", "numba"):  # all prompts in one batch: a row's logits do not depend on its neighbours
        native = NativeBackend.load(f32_path, LoadParams(n_ctx=N_CTX, n_threads=THREADS, kernels=kernels, n_seq_max=len(PROMPTS)))
        ours = Engine(native, slots=len(PROMPTS))
        done = complete_together(ours, [(tokens, greedy) for tokens, _ in expected.values()])
        for (prompt, (_, want)), got in zip(expected.items(), done):
            assert got.tokens == want.tokens, f"[{kernels}] {prompt!r}:\n ours: {got.text!r}\n llama.cpp: {want.text!r}"
        native.close()


def test_prefill_in_one_batch_equals_token_by_token(f32_path: Path) -> None:
    """The batched kernels (prefill) and the single-row ones (decode) compute the same model."""
    for kernels in ("c", "numba"):
        native = NativeBackend.load(f32_path, LoadParams(n_ctx=N_CTX, n_threads=THREADS, n_seq_max=3, kernels=kernels))
        tokens = native.tokenize("The quick brown fox jumps over the lazy dog because", add_special=False)
        batched = native.forward(Batch.for_sequence(tokens, 0, seq_id=1, all_logits=True))
        stepped = np.concatenate([native.forward(Batch.for_sequence([t], i, seq_id=2)) for i, t in enumerate(tokens)])
        assert (batched.argmax(axis=1) == stepped.argmax(axis=1)).all()
        assert np.abs(batched - stepped).max() < 0.05  # float16 rounding of the cache, summation order
        native.close()


def test_a_q8_0_cache_agrees_with_llama_cpps(f32_path: Path, record_property) -> None:
    """Both engines with q8_0 keys and values (each rotated and quantized as llama.cpp does).
    An 8-bit rounding step is a cliff again, so the bar is our own spread: the C and Numba
    kernels, the same block math summed in another order, measured here."""
    types = ("q8_0", "q8_0")
    ref = LlamaCppBackend.load(f32_path, LoadParams(n_ctx=N_CTX, n_threads=THREADS, cache_types=types))
    tokens = ref.tokenize(TEXT, add_special=False)[:N_FORCED]
    theirs = forced_logits(ref, tokens)
    ref.close()
    ours = {}
    for kernels in ("c", "numba"):
        native = NativeBackend.load(f32_path, LoadParams(n_ctx=N_CTX, n_threads=THREADS, kernels=kernels, cache_types=types))
        ours[kernels] = forced_logits(native, tokens)
        native.close()
    _, spread, _ = agreement(ours["c"], ours["numba"])
    for kernels, logits in ours.items():
        top1, mean, worst = agreement(logits, theirs)
        line = f"q8_0 cache [{kernels}] vs llama.cpp: top-1 {top1:.4f}, mean |diff| {mean:.4f}, max {worst:.4f} | c vs numba mean |diff| {spread:.4f}"
        print(f"\n{line}")
        record_property(f"q8_0 agreement {kernels}", line)
        assert top1 >= 0.98 and mean <= 1.5 * spread, line
