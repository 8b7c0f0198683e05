"""Image links (http(s) URLs) under `serve --allow-fetch` (issue 50): a real server on the tiny
vision pair fetches them from a second loopback server made here, which serves a PNG made in
the test, a redirect to it, and the ways a link goes wrong (a 404, a page that is not an
image, a body that never ends, a redirect away from http or in a circle, a slow body, a port
nobody listens on). A linked image answers as the same image sent inline, which answers
from llama.cpp's own logits; each failure is a 400 naming the field and the reason. Without
--allow-fetch a link is a 400 that says to start the server with it
(tests/server/test_vision_api.py)."""

from __future__ import annotations

import asyncio
import base64
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anthropic
import httpx
import pytest

from localinfer.backends.base import MEDIA_MARKER
from localinfer.errors import UserError
from localinfer.images import ImageLink
from localinfer.server.fetch import FetchLimits, fetched_images
from tests.vision_models import png_bytes, sample_image, write_pair

from .test_serve import Server, serving
from .test_vision_api import QUESTION, ask, data_url, llamacpps_first_token

IMAGE = sample_image(60, 80, seed=31)
PNG = png_bytes(IMAGE)
WAIT = 60  # seconds: a bound on waiting for a condition, never a pause


class ImageHost(ThreadingHTTPServer):
    """The loopback server links point at; its conditions let a test follow its handlers."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Pages)
        self.url = f"http://127.0.0.1:{self.server_address[1]}"
        self.slow_started, self.release = threading.Event(), threading.Event()
        self.endless_cut = threading.Event()  # the reader of /endless hung up


class Pages(BaseHTTPRequestHandler):
    server: ImageHost

    def do_GET(self) -> None:  # noqa: N802 (http.server's name)
        redirects = {"/moved": "/cat.png", "/to-ftp": "ftp://127.0.0.1/cat.png", "/loop": "/loop"}
        if self.path in redirects:
            self.reply(302, b"", location=redirects[self.path])
        elif self.path == "/cat.png":
            self.reply(200, PNG, "image/png")
        elif self.path == "/page.html":
            self.reply(200, b"<html><body>not an image</body></html>", "text/html")
        elif self.path == "/endless":
            self.endless()
        elif self.path == "/slow.png":
            self.slow()
        else:
            self.reply(404, b"not found", "text/plain")

    def reply(self, status: int, body: bytes, kind: str = "text/plain", location: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        if location:
            self.send_header("Location", location)
        self.end_headers()
        self.wfile.write(body)

    def endless(self) -> None:
        """A PNG's first bytes, then zeros until the reader hangs up (no Content-Length: the
        body ends when the connection does, so only counting stops a reader)."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.end_headers()
        try:
            self.wfile.write(PNG[:64])
            while True:
                self.wfile.write(bytes(1 << 20))
        except (BrokenPipeError, ConnectionResetError):
            self.server.endless_cut.set()

    def slow(self) -> None:
        """The PNG's first bytes, then the rest once the test releases it."""
        self.send_response(200)
        self.send_header("Content-Type", "image/png")
        self.send_header("Content-Length", str(len(PNG)))
        self.end_headers()
        self.wfile.write(PNG[:16])
        self.wfile.flush()
        self.server.slow_started.set()
        if self.server.release.wait(WAIT):
            try:
                self.wfile.write(PNG[16:])
            except (BrokenPipeError, ConnectionResetError):
                pass  # the fetch gave up first

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 (http.server's name)
        pass


@pytest.fixture
def images() -> Iterator[ImageHost]:
    host = ImageHost()
    thread = threading.Thread(target=host.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield host
    host.release.set()
    host.shutdown()
    host.server_close()
    thread.join(WAIT)


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("image-fetch"), "llava")


@pytest.fixture(scope="module")
def server(llava: tuple[Path, Path]) -> Iterator[Server]:
    yield from serving(llava[0], "--allow-fetch")


@pytest.fixture(scope="module")
def inline_answer(server: Server, llava: tuple[Path, Path]) -> str:
    """The answer to QUESTION about IMAGE sent as a data: URL, which is llama.cpp's."""
    answer = ask(server, data_url(PNG))
    assert answer.status_code == 200, answer.text
    text = answer.json()["choices"][0]["message"]["content"]
    assert text == llamacpps_first_token(llava, QUESTION + MEDIA_MARKER, IMAGE)
    return text


def closed_port() -> int:
    """A loopback port nobody listens on (it was free a moment ago)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_linked_image_answers_as_the_same_image_sent_inline(server: Server, images: ImageHost, inline_answer: str) -> None:
    content = [{"type": "text", "text": QUESTION}, {"type": "image_url", "image_url": {"url": images.url + "/cat.png"}}]
    got = server.client().chat.completions.create(model=server.model, messages=[{"role": "user", "content": content}], max_tokens=1, temperature=0)  # type: ignore[list-item]
    assert got.choices[0].message.content == inline_answer and got.usage is not None and got.usage.completion_tokens == 1


def test_a_responses_input_image_link_follows_a_redirect(server: Server, images: ImageHost, inline_answer: str) -> None:
    content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": images.url + "/moved"}]
    got = server.client().responses.create(model=server.model, input=[{"role": "user", "content": content}], max_output_tokens=1, temperature=0)  # type: ignore[list-item]
    assert got.output_text == inline_answer
    content[1]["image_url"] = images.url + "/missing"
    bad = httpx.post(server.url + "/v1/responses", json={"model": server.model, "input": [{"role": "user", "content": content}]}, timeout=WAIT)
    assert bad.status_code == 400 and "answered 404" in bad.json()["error"]["message"] and bad.json()["error"]["param"] == "input", bad.text


def test_an_anthropic_url_source_is_fetched(server: Server, images: ImageHost, llava: tuple[Path, Path]) -> None:
    client = anthropic.Anthropic(base_url=server.url, api_key="none", max_retries=0, timeout=WAIT)

    def answer(source: dict[str, str]) -> str:
        got = client.messages.create(model=server.model, max_tokens=1, extra_body={"temperature": 0},
                                     messages=[{"role": "user", "content": [{"type": "image", "source": source}, {"type": "text", "text": QUESTION}]}])  # type: ignore[list-item,typeddict-item]  # fmt: skip
        return "".join(block.text for block in got.content if block.type == "text")

    inline = answer({"type": "base64", "media_type": "image/png", "data": base64.b64encode(PNG).decode()})
    assert answer({"type": "url", "url": images.url + "/cat.png"}) == inline == llamacpps_first_token(llava, MEDIA_MARKER + QUESTION, IMAGE)
    with pytest.raises(anthropic.BadRequestError, match="not a PNG, JPEG, WebP, GIF or BMP image"):
        answer({"type": "url", "url": images.url + "/page.html"})


@pytest.mark.parametrize(
    "path, message",
    [
        ("/missing", "answered 404 Not Found"),
        ("/page.html", "not a PNG, JPEG, WebP, GIF or BMP image"),
        ("/endless", "sends more than the 64 MiB a request's fetched images may hold"),
        ("/to-ftp", "redirects to ftp://127.0.0.1/cat.png: only http(s) links are followed"),
        ("/loop", "redirects more than 3 times"),
        (None, "cannot fetch"),
    ],
    ids=["404", "not-an-image", "too-big", "redirect-to-ftp", "redirect-loop", "unreachable"],
)
def test_a_link_that_fails_is_a_400_naming_the_reason(server: Server, images: ImageHost, path: str | None, message: str) -> None:
    url = images.url + path if path else f"http://127.0.0.1:{closed_port()}/cat.png"
    answer = ask(server, url)
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert error["message"].startswith("image 1") and message in error["message"] and error["param"] == "messages", error
    if path == "/endless":
        assert images.endless_cut.wait(WAIT)  # the server hung up on the body instead of reading on


def test_a_slow_link_holds_up_only_its_own_request(server: Server, images: ImageHost, inline_answer: str) -> None:
    result: list[httpx.Response] = []
    waiting = threading.Thread(target=lambda: result.append(ask(server, images.url + "/slow.png")))
    waiting.start()
    try:
        assert images.slow_started.wait(WAIT)
        assert httpx.get(server.url + "/health", timeout=WAIT).status_code == 200  # the event loop is not blocked by the fetch
        assert not result  # the request still waits for its image
    finally:
        images.release.set()
        waiting.join(WAIT)
    assert result[0].status_code == 200 and result[0].json()["choices"][0]["message"]["content"] == inline_answer


def test_a_slow_body_runs_out_of_time(images: ImageHost) -> None:
    with pytest.raises(UserError, match=r"^image 1: fetching .*/slow.png took over 0.2 s"):
        asyncio.run(fetched_images([ImageLink(images.url + "/slow.png", "image 1")], FetchLimits(seconds=0.2)))
    assert images.slow_started.is_set() and not images.release.is_set()  # it gave up while the body still waited


def test_a_requests_links_share_one_byte_budget(images: ImageHost) -> None:
    link = images.url + "/cat.png"
    limits = FetchLimits(max_bytes=len(PNG) * 3 // 2)
    assert asyncio.run(fetched_images([b"inline", ImageLink(link, "image 2")], limits)) == [b"inline", PNG]
    with pytest.raises(UserError, match="^image 2: .* sends more than"):
        asyncio.run(fetched_images([ImageLink(link, "image 1"), ImageLink(link, "image 2")], limits))
