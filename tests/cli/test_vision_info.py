"""`show MODEL` and `doctor MODEL` on a vision model: the projector beside it, its type, and the
tokens an image takes, against llama.cpp's mtmd loading the same tiny pair
(tests/vision_models.py) and counting an image's tokens for images of two sizes.

LLaVA's "mlp" and Gemma 3's projectors resize every image to their fixed input (Gemma 3's then
pools its patches 4 x 4), so mtmd counts the same tokens for both sizes and `show` must give
that number from the file's metadata alone; Qwen2-VL's keeps an image's own grid, so mtmd's
counts differ and `show` must say they vary. The projector's type is the one gguf-py's reader
finds in the file.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.vision_models import MARKER, PAIRS, chunk_layout, rgb_bitmaps, sample_image, tokenized, vision_context, write_llava_text, write_mlp_projector, write_pair

from ..conftest import read_gguf, run_cli

WIDE = {"COLUMNS": "400"}  # rich wraps a table's cells at the terminal's width
SIZES = [(112, 112), (112, 224)]  # multiples of 28 within Qwen2-VL's 8..4096 tokens: its grid is the image's own


def mtmd_image_tokens(model: Path, mmproj: Path) -> list[int]:
    """The tokens mtmd's chunks give one image of each of SIZES."""
    counts = []
    with vision_context(model, mmproj) as (_, _, mctx):
        for seed, (height, width) in enumerate(SIZES):
            with rgb_bitmaps([sample_image(height, width, seed)]) as bitmaps, tokenized(mctx, f"look {MARKER} here", bitmaps) as chunks:
                counts.append(sum(c.n_tokens for c in chunk_layout(chunks) if c.kind == "image"))
    return counts


def projector_type(mmproj: Path) -> str:
    fields = read_gguf(mmproj).fields
    key = "clip.vision.projector_type" if "clip.vision.projector_type" in fields else "clip.projector_type"
    return bytes(fields[key].parts[-1]).decode()


@pytest.fixture(scope="module", params=list(PAIRS))
def pair(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """(text model, its projector beside it, the line `show` must print after "vision")."""
    model, mmproj = write_pair(tmp_path_factory.mktemp(request.param), request.param)
    counts = mtmd_image_tokens(model, mmproj)
    assert all(counts), counts
    if counts[0] == counts[1]:  # fixed: the "mlp" projector
        tokens = f"image tokens per image {counts[0]}"
    else:
        assert request.param == "qwen2vl", counts
        tokens = "image tokens per image vary with image size"
    return model, mmproj, f"yes (projector {mmproj.name}, {projector_type(mmproj)}, {tokens})"


def table_rows(text: str) -> dict[str, str]:
    """show's table as {key: value} (keys are one word, the columns two spaces apart)."""
    return {line.split("  ", 1)[0]: line.split("  ", 1)[1].strip() for line in text.splitlines() if "  " in line and not line.startswith(" ")}


def test_show_says_the_model_reads_images(pair: tuple[Path, Path, str]) -> None:
    model, mmproj, line = pair
    text = run_cli("show", str(model), env=WIDE)
    assert text.returncode == 0, text.stderr
    assert table_rows(text.stdout)["vision"] == line
    info = json.loads(run_cli("show", str(model), "--json").stdout)
    vision = info["vision"]
    assert Path(vision["path"]).resolve() == mmproj.resolve() and vision["projector_type"] == projector_type(mmproj)
    fixed = "vary" not in line
    assert vision["image_tokens_vary"] is not fixed
    assert vision["image_tokens"] == (int(line.rsplit(" ", 1)[1].rstrip(")")) if fixed else None)
    assert f"yes ({vision['summary']})" == line and "vision_notes" not in info


def test_doctor_says_the_model_reads_images_and_picks_an_engine_that_does(pair: tuple[Path, Path, str]) -> None:
    from localinfer.backends import get_backend

    model, mmproj, line = pair
    done = run_cli("doctor", str(model), "--json")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)["model"]
    assert Path(report["vision"]["path"]).resolve() == mmproj.resolve()
    assert get_backend(report["engine"]).capabilities().vision, report  # what `run` takes: an engine that reads images
    text = run_cli("doctor", str(model), env=WIDE)
    assert text.returncode == 0, text.stderr
    lines = [ln.strip() for ln in text.stdout.splitlines()]
    at = next(i for i, ln in enumerate(lines) if ln.split()[:2] == ["model", str(model)])
    assert f"vision: {line}" in lines[at + 1 : at + 3]  # under the model's own line


def test_a_text_model_has_no_vision(model_path: Path) -> None:
    info = json.loads(run_cli("show", str(model_path), "--json").stdout)
    assert info["vision"] is False and "vision_notes" not in info
    assert "vision" not in table_rows(run_cli("show", str(model_path), env=WIDE).stdout)
    report = json.loads(run_cli("doctor", str(model_path), "--json").stdout)["model"]
    assert report["vision"] is False
    assert not any(ln.strip().startswith("vision") for ln in run_cli("doctor", str(model_path), env=WIDE).stdout.splitlines())


def test_another_models_projector_beside_it_is_said_not_taken(tmp_path: Path) -> None:
    """A projector of another width beside the model: mtmd refuses the pair, and `show` says
    vision is off and why, rather than yes."""
    model = write_llava_text(tmp_path / "tiny-llava.gguf")
    mmproj = write_mlp_projector(tmp_path / "mmproj-other.gguf", text_width=32)
    with pytest.raises(RuntimeError, match="could not load"):
        with vision_context(model, mmproj):
            pass
    info = json.loads(run_cli("show", str(model), "--json").stdout)
    assert info["vision"] is False
    (note,) = info["vision_notes"]
    assert mmproj.name in note and "32-wide" in note
    assert table_rows(run_cli("show", str(model), env=WIDE).stdout)["vision"] == f"no ({note})"


def test_a_catalog_model_without_its_projector_says_how_to_get_it(tmp_path: Path) -> None:
    """A catalog vision model pulled before its projector was in the catalog: the text runs,
    and show names the pull that fetches the projector."""
    from localinfer.cli.show import vision_of
    from localinfer.store.refs import ModelSource

    model = write_llava_text(tmp_path / "tiny-llava.gguf")
    src = ModelSource(name="tiny-llava:4b", kind="path", path=model, mmproj_file="mmproj-model-f16.gguf")
    projector, notes = vision_of(src, model)
    assert projector is None and len(notes) == 1
    assert "mmproj-model-f16.gguf is not downloaded" in notes[0] and "'localinfer pull tiny-llava:4b'" in notes[0]
