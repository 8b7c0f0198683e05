"""The prompt cache with images (issue 50): a prompt whose image straddles a block boundary is
put back from RAM, and from disk by a restarted engine, all but its last token, answering as
it did computed; a prompt whose cached blocks end inside an image is put back only to the
image's start (an image is prefilled whole), and answers as a fresh engine without a cache
does. Another image in the same place shares no block past the text before it. On a LLaVA
pair and on a Qwen2-VL pair, whose M-RoPE image puts all its cells at its first position, so
that a block ending inside it holds the whole image."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.engine import Engine
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.engine.prompt_cache import BLOCK_TOKENS, CacheOptions
from localinfer.engine.types import CompletionOutput, SamplingParams, TokenEvent

from ..conftest import THREADS
from ..vision_models import png_bytes, sample_image, write_pair

GREEDY = SamplingParams(temperature=0.0, max_tokens=4, logprobs=5)
SIDES = {"llava": (84, 112), "qwen2vl": (280, 336)}  # qwen2vl: a 10 x 12 grid, 120 cells over 12 positions
WORDS = "the old lighthouse keeper wrote down every ship that passed in the night".split()


def options(folder: Path | None) -> LoadOptions:
    cache = CacheOptions(ram_bytes=1 << 28, disk_bytes=1 << 28, folder=folder) if folder else CacheOptions(enabled=False)
    return LoadOptions(ctx=1024, threads=THREADS, prompt_cache=cache)


def straddling(engine: Engine, image: bytes) -> str:
    """Text, an image and a question, the image's run crossing the first block boundary."""
    for n in range(40, 400):
        text = " ".join(WORDS[i % len(WORDS)] for i in range(n)) + " " + MEDIA_MARKER
        tokens, media = engine.tokenize_media(text, [image])
        (start, chunk), = media.items()
        if start + chunk.n_pos > BLOCK_TOKENS:
            assert start < BLOCK_TOKENS, "the image is too short to straddle a block: grow it"
            return text
    raise AssertionError("no length put the image across the block boundary")


@dataclass
class Answer:
    out: CompletionOutput
    tops: list  # each token's most likely alternatives and their log-probabilities

    @property
    def cached_from(self) -> dict[str, int]:
        return self.out.cached_from


def ask(engine: Engine, text: str, image: bytes) -> Answer:
    tokens, media = engine.tokenize_media(text, [image])
    *steps, out = engine.generate(tokens, GREEDY, media)
    assert isinstance(out, CompletionOutput)
    return Answer(out, [step.top_logprobs for step in steps if isinstance(step, TokenEvent)])


def evict(engine: Engine) -> None:
    """Another prompt through the engine's one slot, which then no longer holds the last."""
    engine.complete(engine.tokenize_prompt("Something else entirely."), GREEDY)


def same(a: Answer, b: Answer) -> bool:
    """The same tokens from logits alike but for the rounding of a batch of another size (a
    put-back prompt computes its last token alone, a cold one within its prefill)."""
    ids = [[t for t, _ in top] for top in a.tops] == [[t for t, _ in top] for top in b.tops]
    values = np.allclose([[v for _, v in top] for top in a.tops], [[v for _, v in top] for top in b.tops], rtol=1e-3, atol=1e-3)
    return a.out.tokens == b.out.tokens and ids and bool(values)


@pytest.mark.parametrize("pair", SIDES)
def test_an_image_across_a_block_is_put_back_from_ram_and_disk_and_cut_at_its_edge(tmp_path: Path, pair: str) -> None:
    model, _ = write_pair(tmp_path, pair)
    image, other = (png_bytes(sample_image(*SIDES[pair], seed=seed)) for seed in (41, 42))
    engine = open_engine(str(model), options(tmp_path / "cache"))
    try:
        assert engine.prompt_cache is not None and engine.prompt_cache.wait_ready()
        text = straddling(engine, image)
        tokens, media = engine.tokenize_media(text + " What is it?", [image])
        (start, chunk), = media.items()
        assert start < BLOCK_TOKENS < start + chunk.n_pos
        cold = ask(engine, text + " What is it?", image)
        assert cold.out.cached_tokens == 0
        evict(engine)  # the one slot no longer holds it
        again = ask(engine, text + " What is it?", image)
        assert again.cached_from == {"ram": len(tokens) - 1} and same(again, cold)
        evict(engine)
        cut = ask(engine, text + " Name its colours.", image)  # the first block matches; it ends inside the image
        assert cut.cached_from == {"ram": start}
        evict(engine)
        swapped = ask(engine, text + " What is it?", other)  # another image: its run differs from its first position
        assert set(swapped.cached_from) <= {"slot"}  # no block: the first holds the image's first positions
    finally:
        engine.close()
    fresh = open_engine(str(model), options(None))
    try:
        assert same(ask(fresh, text + " Name its colours.", image), cut)
    finally:
        fresh.close()
    restarted = open_engine(str(model), options(tmp_path / "cache"))
    try:
        assert restarted.prompt_cache is not None and restarted.prompt_cache.wait_ready()
        from_disk = ask(restarted, text + " What is it?", image)
        assert from_disk.cached_from == {"disk": len(tokens) - 1} and same(from_disk, cold)
    finally:
        restarted.close()
