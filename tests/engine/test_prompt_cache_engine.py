"""The prompt cache through the engine, on both engines, on the embedded Q4_1 and its F32
widening: a prompt of two whole blocks and a partial one answers the same greedy text cold
(computed, the reference), put back from RAM, and put back from disk by a new engine over
the same folder, as a restarted process would be; all of it but the last token is put back
(the partial block under a key of its own), and a longer prompt that starts alike gets the
whole blocks alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.engine.prompt_cache import BLOCK_TOKENS, CacheOptions
from localinfer.engine.types import CompletionOutput, SamplingParams

from ..conftest import THREADS

GREEDY = SamplingParams(temperature=0, max_tokens=12)
DOCUMENT = " ".join(f"Entry {i}: the lighthouse at cape {i % 7} was lit at dusk and put out at dawn." for i in range(40))


def answer(engine, prompt: list[int]) -> CompletionOutput:  # type: ignore[no-untyped-def]
    return engine.complete(prompt, GREEDY)


@pytest.mark.parametrize("engine_name", ["llama.cpp", "native"])
@pytest.mark.parametrize("model", ["q4_1", "f32"])
def test_the_same_answer_cold_from_ram_and_from_disk(engine_name: str, model: str, model_path: Path, f32_path: Path, tmp_path: Path) -> None:
    path = {"q4_1": model_path, "f32": f32_path}[model]
    options = LoadOptions(engine=engine_name, ctx=2048, threads=THREADS, gpu_layers=0, prompt_cache=CacheOptions(ram_bytes=1 << 30, disk_bytes=1 << 30, folder=tmp_path))
    engine = open_engine(str(path), options)
    try:
        assert engine.prompt_cache is not None and engine.prompt_cache.wait_ready()
        prompt = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": DOCUMENT + "\nWhich cape comes first?"}]))
        whole, all_but_last = (len(prompt) - 1) // BLOCK_TOKENS * BLOCK_TOKENS, len(prompt) - 1
        assert whole >= 2 * BLOCK_TOKENS and all_but_last % BLOCK_TOKENS  # two whole blocks or more, and a partial one
        cold = answer(engine, prompt)
        assert cold.cached_tokens == 0
        answer(engine, engine.tokenize_prompt("Something else entirely."))  # the one slot no longer holds the prompt
        from_ram = answer(engine, prompt)
        assert from_ram.cached_from == {"ram": all_but_last} and from_ram.text == cold.text
        answer(engine, engine.tokenize_prompt("Something else entirely."))
        longer = answer(engine, prompt + engine.tokenize_prompt(" And the last one?")[1:])
        assert longer.cached_from == {"ram": whole}  # the partial block's key is the shorter prompt's alone
    finally:
        engine.close()  # writes what is queued
    restarted = open_engine(str(path), options)
    try:
        assert restarted.prompt_cache is not None and restarted.prompt_cache.wait_ready()
        from_disk = answer(restarted, prompt)
        assert from_disk.cached_from == {"disk": all_but_last} and from_disk.text == cold.text
        assert from_disk.usage()["prompt_tokens_details"] == {"cached_tokens": all_but_last}
    finally:
        restarted.close()


def test_no_prompt_cache_keeps_nothing(model_path: Path, tmp_path: Path) -> None:
    engine = open_engine(str(model_path), LoadOptions(engine="llama.cpp", threads=THREADS, prompt_cache=CacheOptions(enabled=False, folder=tmp_path)))
    try:
        assert engine.prompt_cache is None
        answer(engine, engine.tokenize_prompt(DOCUMENT[:300]))
    finally:
        engine.close()
    assert list(tmp_path.iterdir()) == []
