"""Images through the Engine (issue 50): a prompt with an image is scheduled as text chunks
and one whole image chunk, answers from llama.cpp's own logits after the image (llama-mtmd-
cli's path, tests/vision_models.py, in the same test), and the same image twice reuses its
prefix: the second request prefills only the text after it and answers as a fresh engine does.
On a LLaVA pair, a Qwen2-VL pair (M-RoPE: an image moves the position on by its grid's
side, not its token count) and a Gemma 3 pair (an image's tokens attend to each other both
ways, as mtmd decodes them; its own chat template too)."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import MEDIA_MARKER, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.engine.engine import Engine
from localinfer.engine.media import placeholders
from localinfer.engine.speculative import DraftConfig
from localinfer.engine.types import CompletionOutput, SamplingParams, TokenEvent
from localinfer.errors import UserError

from ..conftest import THREADS
from ..vision_models import GEMMA_CONTROLS, GEMMA_IMAGE_TOKENS, PAIRS, llamacpp_vision_logits, png_bytes, sample_image, write_pair

GREEDY = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0)
FIRST = "Look at this " + MEDIA_MARKER
ASKS = (" and tell me what it is", " and name its colours")


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return {name: write_pair(tmp_path_factory.mktemp(name), name) for name in PAIRS}


def engine_of(pair: tuple[Path, Path], slots: int = 1) -> closing[Engine]:
    model, mmproj = pair
    return closing(Engine(LlamaCppBackend.load(model, LoadParams(n_ctx=512, n_threads=THREADS, n_seq_max=slots, mmproj=mmproj)), slots=slots))


def ask(engine: Engine, prompt: str, image: bytes) -> CompletionOutput:
    tokens, media = engine.tokenize_media(prompt, [image])
    return engine.complete(tokens, GREEDY, media)


@pytest.mark.parametrize("name", PAIRS)
def test_an_answer_after_an_image_starts_from_llamacpps_logits(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    image = sample_image(84, 112, seed=5)
    want = llamacpp_vision_logits(*pairs[name], FIRST + ASKS[0], [image])
    with engine_of(pairs[name]) as engine:
        tokens, media = engine.tokenize_media(FIRST + ASKS[0], [png_bytes(image)])
        (start, chunk), = media.items()
        assert tokens[start : start + chunk.n_pos] == placeholders(chunk.key, chunk.n_pos) and all(t < 0 for t in tokens[start : start + chunk.n_pos])
        out = engine.complete(tokens, GREEDY, media)
    assert out.tokens[0] == int(np.argmax(want))
    assert out.prompt_tokens == len(tokens) - chunk.n_pos + chunk.n_tokens  # the image's tokens, though M-RoPE moves the position less


@pytest.mark.parametrize("name", PAIRS)
def test_the_same_image_twice_reuses_its_prefix(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    image, other = png_bytes(sample_image(84, 112, seed=6)), png_bytes(sample_image(84, 112, seed=7))
    with engine_of(pairs[name]) as warm:
        ask(warm, FIRST + ASKS[0], image)
        tokens, media = warm.tokenize_media(FIRST + ASKS[1], [image])
        again = warm.complete(tokens, GREEDY, media)
        (start, chunk), = media.items()
        assert again.cached_tokens >= start + chunk.n_pos  # the text before it and the image itself
        assert ask(warm, FIRST + ASKS[1], other).cached_tokens == start  # another image: only the text before it
    with engine_of(pairs[name]) as fresh:
        alone = ask(fresh, FIRST + ASKS[1], image)
    assert again.tokens == alone.tokens and again.cached_tokens > 0 == alone.cached_tokens


def test_a_gemma3_chat_reads_its_image_as_llamacpp_does(pairs: dict[str, tuple[Path, Path]]) -> None:
    """Gemma 3's own chat template around a user turn that holds the image's marker: the
    engine's prompt is mtmd's (one BOS, though the template writes one and the model adds
    one; the image between <start_of_image> and <end_of_image>), and its first answer token's
    top log-probabilities are those of llama.cpp's logits after the same rendered text, as
    llama-server hands it to mtmd (the template's BOS left to the tokenizer)."""
    image = sample_image(84, 112, seed=10)
    with engine_of(pairs["gemma3"]) as engine:
        rendered = engine.render_chat([{"role": "user", "content": MEDIA_MARKER + "\nWhat is in this picture?"}])
        assert rendered == "<bos><start_of_turn>user\n" + MEDIA_MARKER + "\nWhat is in this picture?<end_of_turn>\n<start_of_turn>model\n"
        tokens, media = engine.tokenize_media(rendered, [png_bytes(image)])
        (start, chunk), = media.items()
        assert tokens.count(engine.backend.vocab.bos_id) == 1 and chunk.n_pos == GEMMA_IMAGE_TOKENS
        before, after = (engine.backend.tokenize(t, add_special=False, parse_special=True) for t in GEMMA_CONTROLS[2:])
        assert tokens[start - 1 : start] == before and tokens[start + chunk.n_pos : start + chunk.n_pos + 1] == after
        first, *_ = engine.generate(tokens, SamplingParams(temperature=0.0, max_tokens=1, logprobs=5), media)
    want = llamacpp_vision_logits(*pairs["gemma3"], rendered.removeprefix("<bos>"), [image]).astype(np.float64)
    want -= want.max() + np.log(np.exp(want - want.max()).sum())  # log-softmax
    top = np.argsort(-want)[:5]
    assert isinstance(first, TokenEvent) and first.top_logprobs is not None and first.token == top[0]
    assert [t for t, _ in first.top_logprobs] == top.tolist()
    np.testing.assert_allclose([lp for _, lp in first.top_logprobs], want[top], rtol=0, atol=1e-5)


def test_images_and_plain_prompts_share_the_engine_side_by_side(pairs: dict[str, tuple[Path, Path]]) -> None:
    """Two slots: an image request and a text one decoded in the same steps each answer as alone."""
    image = png_bytes(sample_image(56, 56, seed=8))
    with engine_of(pairs["llava"], slots=2) as engine:
        tokens, media = engine.tokenize_media(FIRST + ASKS[0], [image])
        text = engine.tokenize_prompt("Tell me a story about a cat")
        alone = [engine.complete(tokens, GREEDY, media).tokens, engine.complete(text, GREEDY).tokens]
        engine.slots.forget_all()
        streams = [engine.submit(tokens, GREEDY, media), engine.submit(text, GREEDY)]
        together: list[list[int]] = [[], []]
        for _ in range(100):  # each answer is 6 tokens: a few steps
            if all(isinstance(answer, CompletionOutput) for answer in together):
                break
            engine.step()
            for i, stream in enumerate(streams):
                while (event := stream.get_nowait()) is not None:
                    together[i] = event if isinstance(event, CompletionOutput) else together[i] + [event.token]
    assert [answer.tokens for answer in together] == alone


def test_a_prompt_ending_in_an_image_or_marking_the_wrong_count_is_refused(pairs: dict[str, tuple[Path, Path]]) -> None:
    image = png_bytes(sample_image(56, 56, seed=9))
    with engine_of(pairs["llava"]) as engine:
        with pytest.raises(UserError, match="marks 2 images but 1 were given"):
            engine.tokenize_media(FIRST + FIRST, [image])
        tokens, media = engine.tokenize_media(FIRST + ASKS[0], [image])
        (start, chunk), = media.items()
        with pytest.raises(UserError, match="ends with an image"):
            engine.submit(tokens[: start + chunk.n_pos], GREEDY, media)


def test_an_engine_that_speculates_answers_image_requests_beside_drafted_ones(pairs: dict[str, tuple[Path, Path]]) -> None:
    """Speculation (prompt lookup, made to draft whenever it can) leaves an image request
    undrafted and drafts the text one decoded beside it, on the engine's own thread: both
    answer as an engine that does not speculate answers them."""
    image = png_bytes(sample_image(56, 56, seed=9))
    model, mmproj = pairs["llava"]
    backend = LlamaCppBackend.load(model, LoadParams(n_ctx=512, n_threads=THREADS, n_seq_max=2, mmproj=mmproj))
    prompts = ["Look at this " + MEDIA_MARKER + " and say what it is", "Repeat: the cat sat on the mat, the cat sat on the mat, the cat"]
    with closing(Engine(backend, slots=2, draft=DraftConfig(assumed_costs=tuple(np.linspace(1.0, 1.5, DraftConfig().max_draft + 1))))) as engine:
        asks = [engine.tokenize_media(prompts[0], [image]), (engine.tokenize_prompt(prompts[1]), {})]
        engine.start()
        streams = [engine.submit(tokens, GREEDY, media) for tokens, media in asks]
        drafted = [final(stream) for stream in streams]
    with engine_of(pairs["llava"]) as plain:
        want = [plain.complete(tokens, GREEDY, media).tokens for tokens, media in [plain.tokenize_media(prompts[0], [image]), (plain.tokenize_prompt(prompts[1]), {})]]
    assert [out.error for out in drafted] == [None, None]
    assert [out.tokens for out in drafted] == want


def final(stream) -> CompletionOutput:  # type: ignore[no-untyped-def]
    """The stream's CompletionOutput, waited for a bounded time."""
    for _ in range(10_000):
        event = stream.get(timeout=120)
        if isinstance(event, CompletionOutput):
            return event
    raise AssertionError("the stream never ended")


def test_a_2d_image_fills_the_context_by_its_tokens_not_its_positions(pairs: dict[str, tuple[Path, Path]]) -> None:
    """Qwen2-VL's 14 x 20 image moves the position on by 20 but fills 280 KV cells: the context
    check, the prompt's usage and the KV-cache count count the cells."""
    model, mmproj = pairs["qwen2vl"]
    backend = LlamaCppBackend.load(model, LoadParams(n_ctx=256, n_threads=THREADS, mmproj=mmproj))
    with closing(Engine(backend)) as engine:
        tokens, media = engine.tokenize_media(FIRST + ASKS[0], [png_bytes(sample_image(392, 560, seed=11))])
        (start, chunk), = media.items()
        cells = len(tokens) - chunk.n_pos + chunk.n_tokens
        assert (chunk.n_tokens, chunk.n_pos) == (280, 20) and len(tokens) < engine.n_ctx < cells
        with pytest.raises(UserError, match=f"the prompt is {cells} tokens but the context holds {engine.n_ctx}"):
            engine.submit(tokens, GREEDY, media)
        tokens, media = engine.tokenize_media(FIRST + ASKS[0], [png_bytes(sample_image(56, 84, seed=12))])
        (start, chunk), = media.items()
        out = engine.complete(tokens, GREEDY, media)
        assert out.prompt_tokens == len(tokens) - chunk.n_pos + chunk.n_tokens > len(tokens)
        assert engine.kv_cells_used == out.prompt_tokens + out.completion_tokens - 1  # the last token is sampled, never fed
