"""`localinfer run --image` (issue 50): the real command on a tiny LLaVA pair written in the
test (tests/vision_models.py), its projector found beside the model, answering from llama.cpp's
own logits after the image (llama-mtmd-cli's path, in the same test); and each bad image as one
line before the model loads."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import MEDIA_MARKER
from localinfer.backends.llamacpp import Tokenizer
from tests.vision_models import llamacpp_vision_logits, png_bytes, sample_image, write_pair

from ..conftest import run_cli

PROMPT = "What is in this picture?"


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("run_image"), "llava")


def test_the_first_token_is_llamacpps_after_the_image(llava: tuple[Path, Path], tmp_path: Path) -> None:
    image = sample_image(60, 80, seed=11)
    (tmp_path / "photo.png").write_bytes(png_bytes(image))
    done = run_cli("run", str(llava[0]), PROMPT, "--image", str(tmp_path / "photo.png"), "--raw", "--json", "-n", "1", "--temperature", "0", "--threads", "2")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["engine"] == "llama.cpp" and answer["usage"]["completion_tokens"] == 1
    want = int(np.argmax(llamacpp_vision_logits(*llava, MEDIA_MARKER + "\n" + PROMPT, [image])))  # --raw: the marker, a newline, the prompt
    tokenizer = Tokenizer.load(llava[0])
    try:
        piece = tokenizer.token_bytes(want).decode("utf-8", errors="replace")
    finally:
        tokenizer.close()
    assert answer["text"] == ("" if want in tokenizer.info.eog_ids else piece)


def write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    "data, message",
    [
        (b"GIF89a" + (30000).to_bytes(2, "little") * 2 + b"\x00" * 16, "is a 30000 x 30000 GIF: images of at most 16384 pixels a side"),
        (b"\x89PNG\r\n\x1a\n\x00\x00\x00\x0dIHDR" + b"\x00" * 8 + b"\x08\x02\x00\x00\x00", "is a 0 x 0 PNG: an image has pixels"),
        (b"%PDF-1.7 not an image", "not a PNG, JPEG, WebP, GIF or BMP image"),
        (b"\xff\xd8\xff\xe0\x00\x10JFIF", "a JPEG image whose header is cut short or damaged"),
    ],
    ids=["decompression-bomb", "zero-by-zero", "unknown-format", "truncated-jpeg"],
)
def test_a_bad_image_is_one_line_before_the_model_loads(llava: tuple[Path, Path], tmp_path: Path, data: bytes, message: str) -> None:
    done = run_cli("run", str(llava[0]), PROMPT, "--image", str(write(tmp_path / "bad.img", data)), "-n", "1")
    assert done.returncode == 1 and message in done.stderr and "Traceback" not in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1


def test_an_image_to_a_text_only_model_is_refused_not_dropped(llava: tuple[Path, Path], tmp_path: Path) -> None:
    photo = write(tmp_path / "photo.png", png_bytes(sample_image(20, 20, seed=1)))
    done = run_cli("run", str(llava[0]), PROMPT, "--image", str(photo), "--mmproj", "none", "--raw", "-n", "1")
    assert done.returncode == 1 and "reads no images" in done.stderr and "Traceback" not in done.stderr
