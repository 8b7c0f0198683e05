"""The decode loop on the real model: determinism, stops, limits, UTF-8 streaming, aborts."""

from localinfer.engine.engine import Engine
from localinfer.engine.types import CompletionOutput, SamplingParams, TokenEvent

CHAT = [{"role": "user", "content": "Write one sentence about the sea."}]


def collect(engine: Engine, messages, params) -> tuple[list[TokenEvent], CompletionOutput]:
    events = list(engine.chat(messages, params))
    *tokens, final = events
    assert isinstance(final, CompletionOutput)
    return tokens, final


def test_streamed_text_equals_final_text(engine: Engine) -> None:
    tokens, final = collect(engine, CHAT, SamplingParams(temperature=0, max_tokens=40))
    assert "".join(e.text for e in tokens) == final.text
    assert final.completion_tokens == len(final.tokens) <= 40
    assert final.timings.ttft_ms > 0 and final.timings.tokens_per_s > 0


def test_seeded_sampling_is_reproducible(engine: Engine) -> None:
    params = SamplingParams(temperature=1.0, seed=1234, max_tokens=24)
    assert collect(engine, CHAT, params)[1].tokens == collect(engine, CHAT, params)[1].tokens


def test_max_tokens_gives_length(engine: Engine) -> None:
    _, final = collect(engine, CHAT, SamplingParams(temperature=0, max_tokens=5))
    assert final.finish_reason == "length" and final.completion_tokens == 5


def test_stop_string_ends_generation_and_is_not_printed(engine: Engine) -> None:
    _, free = collect(engine, CHAT, SamplingParams(temperature=0, max_tokens=40))
    stop = free.text.split()[2]  # a word the model is going to say
    tokens, final = collect(engine, CHAT, SamplingParams(temperature=0, max_tokens=40, stop=(stop,)))
    assert final.finish_reason == "stop"
    assert stop not in final.text and free.text.startswith(final.text)


def test_end_of_generation_token_stops(engine: Engine) -> None:
    _, final = collect(engine, [{"role": "user", "content": "Say hi."}], SamplingParams(temperature=0, max_tokens=200))
    assert final.finish_reason == "stop" and final.completion_tokens < 200


def test_multibyte_prompt_and_output_survive_streaming(engine: Engine) -> None:
    """Force a reply full of multi-byte characters, whose tokens split them mid-character."""
    text = "日本語のテキスト 🎉 café naïve — ünïcödé"
    tokens = engine.tokenize_prompt(text)
    pieces = [engine.backend.token_bytes(t) for t in tokens]
    assert any(not _decodes(p) for p in pieces), "some token should hold a partial character"
    # Teacher-force: feed the text, then let the model continue; every event must be whole characters.
    events = list(engine.generate(tokens, SamplingParams(temperature=0, max_tokens=30)))
    final = events[-1]
    assert all("\ufffd" not in e.text for e in events[:-1])
    assert "".join(e.text for e in events[:-1]) == final.text
    final.text.encode("utf-8")  # round-trips
    # And detokenizing the prompt's own tokens in a stream gives the prompt back.
    from localinfer.engine.detokenize import StreamDetokenizer

    d = StreamDetokenizer(engine.backend.token_bytes)
    assert "".join(d.push(t) for t in tokens) + d.flush() == text


def _decodes(b: bytes) -> bool:
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def test_closing_a_stream_aborts_and_frees_the_sequence(engine: Engine) -> None:
    stream = engine.chat(CHAT, SamplingParams(temperature=0, max_tokens=100))
    next(stream)
    stream.close()  # what Ctrl-C does
    assert not engine.has_work()
    _, final = collect(engine, CHAT, SamplingParams(temperature=0, max_tokens=10))
    assert final.completion_tokens == 10  # the cache was freed: the next request runs normally
