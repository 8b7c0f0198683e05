"""Images on the llama.cpp backend (issue 50): a text model loaded with its projector cuts a
prompt into text tokens and image chunks, and prefilling them (text through forward, images
through forward_media) gives llama.cpp's own logits after the image: llama-mtmd-cli's path
(tests/vision_models.llamacpp_vision_logits), run in the same test, on each pair of PAIRS:
Gemma 3's among them, whose image mtmd decodes with causal attention off (the fixtures' test
shows its logits would differ otherwise). Also the projector found
beside its model and checked against it, and each bad input as one clear error."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer import projector
from localinfer.backends.base import MEDIA_MARKER, Batch, LoadParams, MediaChunk
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.errors import BackendError, InvalidModelFile, UserError
from localinfer.modelfile import inspect

from ..conftest import THREADS
from ..vision_models import PAIRS, llamacpp_vision_logits, png_bytes, sample_image, write_mlp_projector, write_pair

PROMPT = "Look at this " + MEDIA_MARKER + " and tell me what it is"


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    return {name: write_pair(tmp_path_factory.mktemp(name), name) for name in PAIRS}


@pytest.fixture(scope="module")
def backends(pairs: dict[str, tuple[Path, Path]]):
    loaded = {name: LlamaCppBackend.load(model, LoadParams(n_ctx=512, n_threads=THREADS, mmproj=mmproj)) for name, (model, mmproj) in pairs.items()}
    yield loaded
    for backend in loaded.values():
        backend.close()


def prefill(backend: LlamaCppBackend, pieces: list[list[int] | MediaChunk], seq_id: int = 0) -> np.ndarray:
    """The pieces into an emptied sequence, in order: the logits after the last text token."""
    backend.kv_clear(seq_id)
    position, logits = 0, None
    for piece in pieces:
        if isinstance(piece, MediaChunk):
            backend.forward_media(piece, seq_id, position)
            position += piece.n_pos
        else:
            logits = backend.forward(Batch.for_sequence(piece, position, seq_id))[-1]
            position += len(piece)
    assert logits is not None
    return logits


@pytest.mark.parametrize("name", PAIRS)
def test_a_prompt_with_an_image_gives_llamacpps_logits(pairs: dict[str, tuple[Path, Path]], backends, name: str) -> None:
    image = sample_image(84, 112, seed=3)
    pieces = backends[name].media_chunks(PROMPT, [png_bytes(image)])
    kinds = ["image" if isinstance(p, MediaChunk) else "text" for p in pieces]
    assert kinds[0] == "text" and "image" in kinds and kinds[-1] == "text"
    want = llamacpp_vision_logits(*pairs[name], PROMPT, [image])
    # the same library, kernels and order of operations: the same bits, though our context is
    # one cache shared by several sequences
    np.testing.assert_array_equal(prefill(backends[name], pieces), want)


@pytest.mark.parametrize("name", PAIRS)
def test_an_images_chunk_is_named_by_its_pixels(backends, name: str) -> None:
    one, other = png_bytes(sample_image(56, 56, seed=1)), png_bytes(sample_image(56, 56, seed=2))
    chunks = [p for p in backends[name].media_chunks(PROMPT + PROMPT, [one, one]) if isinstance(p, MediaChunk)]
    assert len(chunks) == 2 and chunks[0].key == chunks[1].key
    (third,) = [p for p in backends[name].media_chunks(PROMPT, [other]) if isinstance(p, MediaChunk)]
    assert third.key != chunks[0].key
    # a second sequence beside the first gets the same logits from the same pieces
    pieces = backends[name].media_chunks(PROMPT, [one])
    np.testing.assert_array_equal(prefill(backends[name], pieces, 0), prefill(backends[name], pieces, 1))


def test_qwen2vl_images_move_the_position_by_their_grids_side(backends) -> None:
    (chunk,) = [p for p in backends["qwen2vl"].media_chunks(PROMPT, [png_bytes(sample_image(84, 112, seed=0))]) if isinstance(p, MediaChunk)]
    assert (chunk.n_tokens, chunk.n_pos) == (12, 4)  # a 3 x 4 grid of 28-pixel cells: M-RoPE moves on by max(3, 4)


def test_bad_images_and_markers_are_one_line_errors(backends) -> None:
    llava = backends["llava"]
    with pytest.raises(UserError, match="could not be decoded"):
        llava.media_chunks(PROMPT, [b"\x89PNG\r\n\x1a\n truncated"])
    with pytest.raises(UserError, match="marks 1 images but 2 were given"):
        llava.media_chunks(PROMPT, [png_bytes(sample_image(8, 8, 0))] * 2)


def test_a_model_loaded_without_a_projector_says_how_to_give_one(pairs: dict[str, tuple[Path, Path]]) -> None:
    with LlamaCppBackend.load(pairs["llava"][0], LoadParams(n_ctx=256, n_threads=THREADS)) as backend:
        with pytest.raises(UserError, match="--mmproj"):
            backend.media_chunks(PROMPT, [png_bytes(sample_image(8, 8, 0))])


def test_another_models_projector_is_refused_before_and_by_llamacpp(pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    wrong = write_mlp_projector(tmp_path / "mmproj-other.gguf", text_width=48)
    model = pairs["llava"][0]
    with pytest.raises(UserError, match="48-wide image embeddings but tiny-llava.gguf is 64 wide"):
        projector.read(wrong, inspect(model))
    with pytest.raises(BackendError, match="could not load the projector mmproj-other.gguf"):
        LlamaCppBackend.load(model, LoadParams(n_ctx=256, n_threads=THREADS, mmproj=wrong))


def test_the_projector_beside_a_model_is_found_and_described(pairs: dict[str, tuple[Path, Path]]) -> None:
    model, mmproj = pairs["qwen2vl"]
    warnings: list[str] = []
    found = projector.for_model(None, model, inspect(model), warnings)
    assert found is not None and found.path == mmproj and not warnings
    assert (found.kind, found.patch_size, found.projection_dim) == ("qwen2vl_merger", 14, 64)
    assert found.describe().startswith(f"projector {mmproj.name} (qwen2vl_merger")
    assert projector.for_model("none", model, inspect(model), warnings) is None


def test_none_two_or_a_stranger_beside_a_model_leave_it_text_only(pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    lone = tmp_path / "lone" / "model.gguf"
    lone.parent.mkdir()
    lone.write_bytes(pairs["llava"][0].read_bytes())
    info, warnings = inspect(lone), []
    assert projector.for_model(None, lone, info, warnings) is None and not warnings
    write_mlp_projector(lone.parent / "mmproj-other.gguf", text_width=48)
    assert projector.for_model(None, lone, info, warnings) is None
    assert warnings == ["mmproj-other.gguf beside the model is not its projector, so images are off: mmproj-other.gguf makes 48-wide image "
                        "embeddings but model.gguf is 64 wide: it is another model's projector"]  # fmt: skip
    (lone.parent / "mmproj-b.gguf").write_bytes(pairs["llava"][1].read_bytes())
    assert projector.for_model(None, lone, info, warnings) is None and "2 projectors lie beside model.gguf" in warnings[-1]
    with pytest.raises(InvalidModelFile, match="is not a projector: its architecture is 'llama'"):
        projector.for_model(str(lone), lone, info, warnings)
