"""The llama.cpp backend through our interface, checked against llama.cpp's own high-level API."""

import numpy as np
import pytest
from llama_cpp import Llama

from localinfer.backends.base import Batch
from localinfer.engine.engine import Engine
from localinfer.engine.types import SamplingParams

from ..conftest import THREADS, check_batched_sequences_match_single_runs

PROMPTS = ["The capital of France is", "def fibonacci(n):", "Once upon a time, in a small village,"]
N_TOKENS = 32


@pytest.fixture(scope="module")
def reference(model_path):
    """llama.cpp's high-level Llama, with the same context settings as our backend."""
    llm = Llama(str(model_path), n_ctx=2048, n_threads=THREADS, flash_attn=True, verbose=False)
    yield llm
    llm.close()


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_matches_llama_cpp(engine: Engine, reference: Llama, prompt: str) -> None:
    tokens = engine.tokenize_prompt(prompt)
    assert tokens == reference.tokenize(prompt.encode(), add_bos=engine.backend.vocab.add_bos, special=True)
    expected = []
    for tok in reference.generate(tokens, temp=0, top_k=1, reset=True):
        if reference.token_eos() == tok or len(expected) == N_TOKENS:
            break
        expected.append(tok)
    ours = engine.complete(tokens, SamplingParams(temperature=0, max_tokens=len(expected)))
    assert ours.tokens == expected
    assert ours.text == reference.detokenize(expected).decode("utf-8", errors="replace")


def test_batched_sequences_match_single_runs(backend) -> None:
    check_batched_sequences_match_single_runs(backend)


def test_kv_truncate_rolls_back_and_kv_copy_shares_a_prefix(backend) -> None:
    toks = backend.tokenize("One two three four five", add_special=False)
    full = backend.forward(Batch.for_sequence(toks, 0, 1))[0]
    backend.kv_truncate(1, len(toks) - 2)  # drop the last two tokens...
    again = backend.forward(Batch.for_sequence(toks[-2:], len(toks) - 2, 1))[0]  # ...and redo them
    backend.kv_copy(1, 2, len(toks) - 1)  # seq 2 shares all but the last token
    shared = backend.forward(Batch.for_sequence(toks[-1:], len(toks) - 1, 2))[0]
    for seq in (1, 2):
        backend.kv_clear(seq)
    assert np.abs(again - full).max() < 1e-3
    assert np.abs(shared - full).max() < 1e-3


def test_the_engines_logits_are_a_view_with_forwards_values(backend) -> None:
    """forward_transient (the engine's step) hands back llama.cpp's own buffer, not a copy, with
    the same rows forward() copies out: several sequences, several wanted rows each, and a
    batch longer than one decode chunk (copied, since each chunk overwrites the buffer)."""
    a = backend.tokenize("The quick brown fox jumps over the lazy dog", add_special=False)
    b = backend.tokenize("Once upon a time there was", add_special=False)
    batch = Batch.of_rows([(0, a, 0, 3), (1, b, 0, 2)])
    for seq in (0, 1):
        backend.kv_clear(seq)
    copied = backend.forward(batch)
    for seq in (0, 1):
        backend.kv_clear(seq)
    viewed = backend.forward_transient(batch)
    assert viewed.base is not None and not viewed.flags.owndata and viewed.shape == copied.shape == (5, backend.vocab.n_vocab)
    np.testing.assert_array_equal(viewed, copied)
    backend.kv_clear(0)
    long = (a * 200)[: backend._n_batch + 10]
    whole = backend.forward_transient(Batch.for_sequence(long, 0, 0))
    backend.kv_clear(0)
    np.testing.assert_array_equal(whole, backend.forward(Batch.for_sequence(long, 0, 0)))
    for seq in (0, 1):
        backend.kv_clear(seq)
