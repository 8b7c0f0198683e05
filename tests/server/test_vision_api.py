"""Images through a real server on loopback (issue 50), with the openai, anthropic and ollama
clients: an image_url part with a data: URL, an Anthropic image block with a base64 source, and
Ollama's base64 `images` on /api/chat and /api/generate,
answer from llama.cpp's own logits after the image (tests/vision_models.py, in the same test);
links (without serve --allow-fetch; with it: tests/server/test_image_fetch.py), damaged or
empty images and images sent to a text-only model are 400s in the dialect's shape, never a
500 and never an image silently dropped."""

from __future__ import annotations

import base64
import shutil
from collections.abc import Iterator
from pathlib import Path

import anthropic
import httpx
import numpy as np
import ollama
import pytest

from localinfer.backends.base import MEDIA_MARKER
from localinfer.backends.llamacpp import Tokenizer
from localinfer.engine.loader import LoadOptions, open_engine
from tests.vision_models import llamacpp_vision_logits, png_bytes, sample_image, write_pair

from .test_serve import Server, serving

QUESTION = "What is in this picture?"


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("vision-api"), "llava")


@pytest.fixture(scope="module")
def server(llava: tuple[Path, Path]) -> Iterator[Server]:
    yield from serving(llava[0], "--allow-paths", "--max-loaded", "2")


def data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


def ask(server: Server, url: str, model: str | None = None) -> httpx.Response:
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": url}}]
    body = {"model": model or server.model, "messages": [{"role": "user", "content": content}], "max_tokens": 1, "temperature": 0}
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)


def llamacpps_first_token(llava: tuple[Path, Path], content: str, image: np.ndarray, chat: bool = True) -> str:
    """The text of llama.cpp's most likely token after `content` (in the model's chat template,
    rendered as the server renders it, unless not `chat`), its marker standing for `image`."""
    engine = open_engine(str(llava[0]), LoadOptions(threads=2))
    try:
        text = engine.render_chat([{"role": "user", "content": content}]) if chat else content
    finally:
        engine.close()
    want = int(np.argmax(llamacpp_vision_logits(*llava, text, [image])))
    tokenizer = Tokenizer.load(llava[0])
    try:
        return "" if want in tokenizer.info.eog_ids else tokenizer.token_bytes(want).decode("utf-8", errors="replace")
    finally:
        tokenizer.close()


def test_an_image_url_part_answers_from_llamacpps_logits(server: Server, llava: tuple[Path, Path]) -> None:
    image = sample_image(60, 80, seed=21)
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_url(png_bytes(image))}}]
    got = server.client().chat.completions.create(model=server.model, messages=[{"role": "user", "content": content}], max_tokens=1, temperature=0)  # type: ignore[list-item]
    assert got.choices[0].message.content == llamacpps_first_token(llava, QUESTION + MEDIA_MARKER, image) and got.usage.completion_tokens == 1


def test_an_anthropic_image_block_answers_from_llamacpps_logits(server: Server, llava: tuple[Path, Path]) -> None:
    image = sample_image(60, 80, seed=23)
    source = {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png_bytes(image)).decode()}
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=120)
    got = client.messages.create(model=server.model, max_tokens=1, extra_body={"temperature": 0},
                                 messages=[{"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]}])  # type: ignore[list-item]  # fmt: skip
    text = "".join(block.text for block in got.content if block.type == "text")
    assert text == llamacpps_first_token(llava, MEDIA_MARKER + QUESTION, image)
    bad = httpx.post(server.url + "/v1/messages", json={"model": server.model, "max_tokens": 1, "messages": [{"role": "user", "content": [
        {"type": "image", "source": {"type": "url", "url": "https://example.com/a.png"}}]}]}, timeout=60)  # fmt: skip
    assert bad.status_code == 400 and "does not fetch" in bad.json()["error"]["message"], bad.text


def test_a_responses_input_image_answers_from_llamacpps_logits(server: Server, llava: tuple[Path, Path]) -> None:
    image = sample_image(60, 80, seed=24)
    content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": data_url(png_bytes(image))}]
    got = server.client().responses.create(model=server.model, input=[{"role": "user", "content": content}], max_output_tokens=1, temperature=0, store=True)  # type: ignore[list-item]
    assert got.output_text == llamacpps_first_token(llava, QUESTION + MEDIA_MARKER, image)
    # a follow-up on the stored turn: its image is not kept, so it asks about the text alone
    follow = server.client().responses.create(model=server.model, input="And now?", previous_response_id=got.id, max_output_tokens=1, temperature=0)
    assert follow.error is None and follow.usage.output_tokens == 1  # an answer (cut at 1 token), not a 400 for a lost image


def test_ollamas_images_answer_from_llamacpps_logits(server: Server, llava: tuple[Path, Path]) -> None:
    image = sample_image(60, 80, seed=22)
    b64 = base64.b64encode(png_bytes(image)).decode()
    client, options = ollama.Client(host=server.url, timeout=120), {"temperature": 0, "num_predict": 1}
    chat = client.chat(model=server.model, messages=[{"role": "user", "content": QUESTION, "images": [b64]}], options=options)
    assert chat.message.content == llamacpps_first_token(llava, MEDIA_MARKER + QUESTION, image)  # a message's images stand before its text
    raw = client.generate(model=server.model, prompt=QUESTION, images=[b64], raw=True, options=options)
    assert raw.response == llamacpps_first_token(llava, MEDIA_MARKER + QUESTION, image, chat=False)
    bad = httpx.post(server.url + "/api/chat", json={"model": server.model, "messages": [{"role": "user", "content": "hi", "images": ["%%"]}]}, timeout=60)
    assert bad.status_code == 400 and "base64 bytes are damaged" in bad.json()["error"], bad.text
    assert "vision" in client.show(server.model).capabilities  # Ollama's word for a model that reads images


@pytest.mark.parametrize(
    "url, message",
    [
        ("https://example.com/cat.png", "does not fetch: send the image itself as a data: URL (data:image/png;base64,...), or start the server with --allow-fetch"),
        ("data:image/png;base64,%%%not-base64", "base64 bytes are damaged"),
        ("data:image/png,rawbytes", "not a data: URL with base64 bytes"),
        (data_url(b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR" + b"\x00" * 8 + b"\x08\x02\x00\x00\x00"), "is a 0 x 0 PNG"),
        (data_url(b"GIF89a" + (30000).to_bytes(2, "little") * 2 + b"\x00" * 16), "is a 30000 x 30000 GIF"),
    ],
    ids=["link", "bad-base64", "not-base64", "zero-by-zero", "decompression-bomb"],
)
def test_a_bad_image_is_a_400_in_openais_shape(server: Server, url: str, message: str) -> None:
    answer = ask(server, url)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert message in error["message"] and error["param"] == "messages"


def test_an_image_to_a_text_only_model_is_a_400(server: Server, llava: tuple[Path, Path], tmp_path: Path) -> None:
    alone = tmp_path / "text-only.gguf"
    shutil.copy(llava[0], alone)  # the same text model, no projector beside it
    answer = ask(server, data_url(png_bytes(sample_image(20, 20, seed=2))), model=str(alone))
    assert answer.status_code == 400 and "reads no images" in answer.json()["error"]["message"], answer.text


def test_serve_mmproj_pairs_the_start_model_with_a_projector_elsewhere(llava: tuple[Path, Path], tmp_path: Path) -> None:
    """`serve MODEL --mmproj FILE`, as llama-server's --mmproj: the text model alone in its
    folder reads images with the projector named; a model loaded on demand keeps its own
    (none here: a text model alone is refused an image)."""
    alone = tmp_path / "text" / "tiny-llava.gguf"
    alone.parent.mkdir()
    shutil.copy(llava[0], alone)
    other = tmp_path / "other" / "text-only.gguf"
    other.parent.mkdir()
    shutil.copy(llava[0], other)
    image = sample_image(60, 80, seed=24)
    server = Server(str(alone), "--mmproj", str(llava[1]), "--allow-paths", "--max-loaded", "2")
    server.model = str(alone)
    try:
        content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": data_url(png_bytes(image))}}]
        got = server.client().chat.completions.create(model=server.model, messages=[{"role": "user", "content": content}], max_tokens=1, temperature=0)  # type: ignore[list-item]
        assert got.choices[0].message.content == llamacpps_first_token(llava, QUESTION + MEDIA_MARKER, image)
        refused = ask(server, data_url(png_bytes(image)), model=str(other))
        assert refused.status_code == 400 and "reads no images" in refused.json()["error"]["message"], refused.text
    finally:
        code, log = server.stop()
        assert code == 0, log
