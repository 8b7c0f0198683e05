"""kv_read / kv_write, the two operations the prompt cache needs from a backend: a range of a
sequence's KV cache as bytes, put back into another sequence, must give the logits that
prefilling the same tokens gives, on both engines (their layouts differ; nothing above knows)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer.backends import get_backend
from localinfer.backends.base import Backend, Batch, LoadParams

from ..conftest import THREADS

TEXT = "The lighthouse keeper climbed the stairs every evening, counting each step aloud. " * 12


@pytest.fixture(scope="module", params=["llama.cpp", "native"])
def loaded(request: pytest.FixtureRequest, model_path: Path) -> Backend:
    b = get_backend(request.param).load(model_path, LoadParams(n_ctx=1024, n_threads=THREADS, n_seq_max=2))
    yield b
    b.close()


def last_logits(b: Backend, seq: int, tokens: list[int], start: int) -> np.ndarray:
    return b.forward(Batch.for_sequence(tokens[start:], start, seq))[0]


def test_blocks_read_and_written_back_give_prefill_s_logits(loaded: Backend) -> None:
    """Restored into the cells a prefill would use (llama.cpp's logits depend on where its
    shared pool keeps a sequence's cells, so the reference is the same sequence, cleared)."""
    tokens = loaded.tokenize(TEXT)
    assert len(tokens) > 150
    split, end = 128, len(tokens) - 1  # two blocks, the second partial, then the last token fed
    loaded.kv_clear(0)
    loaded.forward(Batch.for_sequence(tokens[:end], 0, 0))
    blocks = [loaded.kv_read(0, 0, split), loaded.kv_read(0, split, end)]
    expected = last_logits(loaded, 0, tokens, end)
    loaded.kv_clear(0)
    assert loaded.kv_write(0, 0, blocks[0]) == split
    assert loaded.kv_write(0, split, blocks[1]) == end
    np.testing.assert_array_equal(last_logits(loaded, 0, tokens, end), expected)


def test_bytes_that_do_not_fit_leave_the_sequence_as_it_was(loaded: Backend) -> None:
    tokens = loaded.tokenize(TEXT)[:64]
    for seq in (0, 1):
        loaded.kv_clear(seq)
    loaded.forward(Batch.for_sequence(tokens, 0, 0))
    block = loaded.kv_read(0, 0, 32)
    assert loaded.kv_write(1, 0, block[: len(block) // 2 + 3]) == 0  # truncated
    assert loaded.kv_write(1, 0, b"") == 0
    assert loaded.kv_write(1, 0, block) == 32
