"""The engine under many callers, on the real model: threads that submit and abort while
the engine's own thread runs step(), a request whose forward fails, the per-slot share of
llama.cpp's unified cache, chunked prefill, back-pressure, and a closed model.

Answers are compared token for token on the F32 widening of the embedded model. On the
quantized original, each 8-bit rounding of an activation is a cliff, so the shape of a
batch (which other requests share it) moves the logits by up to ~1.5 and can flip a
near-tie, in llama.cpp as in any engine that quantizes activations; on F32 the same
comparison differs by ~0.02, so a different token there would mean real cross-talk."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.engine.engine import MAX_BACKLOG, Engine
from localinfer.engine.types import CompletionOutput, SamplingParams
from localinfer.errors import BackendError, ContextOverflow

from ..conftest import THREADS

GREEDY = SamplingParams(temperature=0, max_tokens=12)
PROMPTS = ["Why is the sky blue?", "Name three fruits.", "What is 2 + 2?", "Say hello in French.", "What is the capital of Italy?", "Describe a cat."]


def tokens_for(engine: Engine, prompt: str) -> list[int]:
    return engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": prompt}]))


def drain(stream) -> tuple[list[int], CompletionOutput]:
    tokens = []
    while True:
        event = stream.get(timeout=120)
        assert event is not None, "the stream stalled"
        if isinstance(event, CompletionOutput):
            return tokens, event
        tokens.append(event.token)


@pytest.fixture(scope="module")
def backend(f32_path: Path) -> LlamaCppBackend:
    b = LlamaCppBackend.load(f32_path, LoadParams(n_ctx=2048, n_threads=THREADS, n_seq_max=4))
    yield b
    b.close()


@pytest.fixture(scope="module")
def alone(backend) -> dict[str, list[int]]:
    """Each prompt's greedy answer, run alone."""
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    return {p: engine.complete(tokens_for(engine, p), GREEDY).tokens for p in PROMPTS}


def test_threads_submit_and_abort_while_the_engine_runs(backend, alone) -> None:
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    engine.start()
    results: dict[str, CompletionOutput] = {}
    failures: list[BaseException] = []

    def client(prompts: list[str], abort_after: int | None) -> None:
        try:
            for prompt in prompts:
                stream = engine.submit(tokens_for(engine, prompt), GREEDY)
                if abort_after is not None:
                    for _ in range(abort_after):
                        stream.get(timeout=120)
                    engine.abort(stream.request_id)
                results[prompt] = drain(stream)[1]
        except BaseException as e:  # noqa: BLE001 - reported below, with the thread's name
            failures.append(e)

    threads = [threading.Thread(target=client, args=(PROMPTS[i::3], 2 if i == 2 else None)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    engine.stop()
    assert not failures, failures
    for prompt in PROMPTS:
        out = results[prompt]
        if prompt in PROMPTS[2::3]:
            assert out.finish_reason == "abort"
        else:
            assert out.tokens == alone[prompt], prompt  # no cross-talk between slots
    assert engine.free_slots == backend.facts.n_seq_max and not engine.has_work()


def test_a_failed_request_ends_alone_with_an_error(backend, alone) -> None:
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    engine.start()
    good = engine.submit(tokens_for(engine, PROMPTS[0]), GREEDY)
    bad = engine.submit([1, backend.vocab.n_vocab + 10, 3], GREEDY)  # a token id the model does not have
    _, failed = drain(bad)
    tokens, ok = drain(good)
    engine.stop()
    assert failed.finish_reason == "error" and isinstance(failed.error, BackendError)
    with pytest.raises(BackendError):
        failed.raise_error()
    assert tokens == alone[PROMPTS[0]] and ok.finish_reason in ("stop", "length")
    assert engine.free_slots == backend.facts.n_seq_max


def test_each_slot_gets_its_share_of_the_unified_cache(model_path: Path) -> None:
    backend = LlamaCppBackend.load(model_path, LoadParams(n_ctx=128, n_threads=THREADS, n_seq_max=4))
    try:
        assert backend.facts.n_ctx == 128  # each sequence's share of one pool of 4 x 128
        engine = Engine(backend, slots=backend.facts.n_seq_max)
        with pytest.raises(ContextOverflow, match=f"holds {backend.facts.n_ctx}"):
            engine.submit(list(range(10, 10 + backend.facts.n_ctx)), GREEDY)
        # four requests that run to the end of their share at once never overflow the cache
        params = SamplingParams(temperature=0, repeat_penalty=1.0)
        streams = [engine.submit(engine.tokenize_prompt("Count from one to one thousand: one, two, three,"), params) for _ in range(4)]
        while engine.has_work():
            engine.step()
        for stream in streams:
            out = [e for e in iter(stream.get_nowait, None)][-1]
            assert out.finish_reason in ("stop", "length") and out.error is None
            assert out.prompt_tokens + out.completion_tokens <= backend.facts.n_ctx
    finally:
        backend.close()


def test_abort_ends_the_stream_and_frees_the_slot(backend) -> None:
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    stream = engine.submit(tokens_for(engine, PROMPTS[1]), SamplingParams(temperature=0, max_tokens=100))
    engine.step()
    engine.step()
    engine.abort(stream.request_id)
    events = list(iter(stream.get_nowait, None))
    assert isinstance(events[-1], CompletionOutput) and events[-1].finish_reason == "abort"
    assert engine.free_slots == backend.facts.n_seq_max and not engine.has_work()


@pytest.mark.parametrize("slowdown", [0, 2.5], ids=["fixed-chunks", "time-budget"])
def test_chunked_prefill_interleaves_with_decoding(backend, slowdown: float) -> None:
    chunk = 16
    engine = Engine(backend, slots=backend.facts.n_seq_max, prefill_chunk=chunk, decode_slowdown=slowdown)
    running = engine.submit(tokens_for(engine, PROMPTS[0]), SamplingParams(temperature=0, max_tokens=60))
    while engine.last_step.decoded == 0:
        engine.step()
    long_prompt = tokens_for(engine, "Summarise this: " + "The quick brown fox jumps over the lazy dog. " * 12)
    assert len(long_prompt) > 5 * chunk
    arriving = engine.submit(long_prompt, GREEDY)
    steps = []
    while True:
        before = running.backlog
        engine.step()
        steps.append((engine.last_step.prefilled.get(arriving.request_id, 0), running.backlog - before))
        if not engine.last_step.prefilled:
            break
    while engine.has_work():
        engine.step()
    chunked = [e for e in iter(arriving.get_nowait, None)][-1]
    to_prefill = len(long_prompt) - chunked.cached_tokens  # the chat template's start may be cached already
    prefills = [n for n, _ in steps if n]
    assert sum(prefills) == to_prefill and max(prefills) <= chunk
    if not slowdown:  # fixed chunks; with a time budget they may be cut shorter while the other stream decodes
        assert max(prefills) == chunk and len(prefills) == -(-to_prefill // chunk)
    assert all(new_tokens == 1 for _, new_tokens in steps[:-1])  # the running stream got a token every step
    whole = Engine(backend, slots=backend.facts.n_seq_max).complete(long_prompt, GREEDY)  # prefilled in one piece
    assert chunked.tokens == whole.tokens


def test_a_reader_that_falls_behind_holds_its_request(backend) -> None:
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    stream = engine.submit(engine.tokenize_prompt("Count from one to one thousand: one, two, three,"), SamplingParams(temperature=0, repeat_penalty=1.0))
    for _ in range(MAX_BACKLOG + 20):
        engine.step()
    assert stream.backlog == MAX_BACKLOG and engine.has_work()  # paused, not dropped
    engine.abort(stream.request_id)


def test_a_closed_model_raises_instead_of_touching_freed_memory(model_path: Path) -> None:
    backend = LlamaCppBackend.load(model_path, LoadParams(n_ctx=256, n_threads=THREADS))
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    prompt = engine.tokenize_prompt("Hi")
    engine.close()
    for call in (lambda: backend.forward(Batch.for_sequence(prompt, 0)), lambda: backend.kv_clear(0), lambda: backend.tokenize("Hi"), lambda: engine.submit(prompt)):
        with pytest.raises(BackendError, match="closed"):
            call()
    backend.close()  # twice is fine


def test_prefix_reuse_prefills_only_the_new_tokens(backend) -> None:
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    turn = [{"role": "user", "content": "Name three fruits."}]
    first = engine.complete(engine.tokenize_prompt(engine.render_chat(turn)), GREEDY)
    turn += [{"role": "assistant", "content": first.text}, {"role": "user", "content": "And three vegetables?"}]
    prompt = engine.tokenize_prompt(engine.render_chat(turn))
    second = engine.complete(prompt, GREEDY)
    # the first turn's prompt and answer are in the slot; the second turn's prompt starts with them
    first_prompt = engine.tokenize_prompt(engine.render_chat(turn[:1]))
    assert second.cached_tokens >= len(first_prompt)
    assert second.usage()["prompt_tokens_details"] == {"cached_tokens": second.cached_tokens}
    assert second.tokens == Engine(backend, slots=backend.facts.n_seq_max).complete(prompt, GREEDY).tokens  # a fresh engine recomputes it all


def check_a_busy_slot_lends_its_prefix(backend) -> None:
    """Two requests with one long system prompt: the second copies it from the first's slot
    while the first is still running, instead of recomputing it, and answers as if alone."""
    engine = Engine(backend, slots=backend.facts.n_seq_max, prefill_chunk=16)
    system = {"role": "system", "content": "You are a careful assistant. " * 20}
    a = engine.tokenize_prompt(engine.render_chat([system, {"role": "user", "content": "Name a colour."}]))
    b = engine.tokenize_prompt(engine.render_chat([system, {"role": "user", "content": "Name an animal."}]))
    first = engine.submit(a, SamplingParams(temperature=0, max_tokens=40))
    while engine.last_step.decoded == 0:
        engine.step()
    second = engine.submit(b, GREEDY)
    while engine.has_work():
        engine.step()
    out_b = [e for e in iter(second.get_nowait, None)][-1]
    assert out_b.cached_tokens == next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    assert out_b.tokens == Engine(backend, slots=backend.facts.n_seq_max).complete(b, GREEDY).tokens
    assert [e for e in iter(first.get_nowait, None)][-1].error is None


def test_a_busy_slot_lends_its_prefix(backend) -> None:
    check_a_busy_slot_lends_its_prefix(backend)


def test_native_engine_chunks_and_lends_prefixes(f32_path: Path) -> None:
    """The same on the native backend, whose cache is one array per sequence (kv_copy
    copies there, where llama.cpp's unified cache shares cells)."""
    from localinfer.backends.native import NativeBackend

    native = NativeBackend.load(f32_path, LoadParams(n_ctx=1024, n_threads=THREADS, n_seq_max=3))
    try:
        check_a_busy_slot_lends_its_prefix(native)
    finally:
        native.close()


def test_embedding_while_streams_decode(backend) -> None:
    """An embedding asked from another thread runs on the engine's thread, between steps,
    in a slot of its own: the same vector as alone, and the streams are undisturbed."""
    import numpy as np

    text = [backend.tokenize("The cat sat on the mat.", add_special=True)]
    alone = Engine(backend, slots=backend.facts.n_seq_max).embed(text)
    engine = Engine(backend, slots=backend.facts.n_seq_max)
    engine.start()
    streams = [engine.submit(tokens_for(engine, q), GREEDY) for q in PROMPTS[:2]]
    vectors = []
    thread = threading.Thread(target=lambda: vectors.append(engine.embed(text)))
    thread.start()
    thread.join(timeout=120)
    outs = [drain(s)[1] for s in streams]
    engine.stop()
    assert vectors[0].shape == alone.shape == (1, backend.facts.n_embd) and np.allclose(vectors[0], alone, atol=1e-4)
    assert all(o.error is None for o in outs) and engine.free_slots == backend.facts.n_seq_max
