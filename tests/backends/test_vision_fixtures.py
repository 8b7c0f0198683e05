"""The vision fixtures (tests/vision_models.py) hold: each tiny text model loads in the pinned
llama.cpp with its projector through mtmd, an image becomes the tokens its projector says
(and the positions M-RoPE says), and the logits after it are finite, depend on the image,
repeat bit for bit, and are what decoding mtmd's embeddings by hand gives (the path an
engine that batches sequences itself takes)."""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest

import llama_cpp as C
from llama_cpp import mtmd_cpp as M

from ..embedding_models import N_EMBD, tokenize
from ..vision_models import (
    GEMMA_CONTROLS,
    GEMMA_IMAGE_TOKENS,
    LLAVA_IMAGE_TOKENS,
    MARKER,
    PAIRS,
    VISION_TOKENS,
    ChunkInfo,
    chunk_layout,
    eval_logits,
    file_bitmap,
    llamacpp_vision_logits,
    png_bytes,
    qwen2vl_grid,
    rgb_bitmaps,
    sample_image,
    tokenized,
    vision_context,
    write_llava_text,
    write_mlp_projector,
    write_pair,
)

BEFORE, AFTER = "Look at this ", " and tell me what it is"
PROMPT = BEFORE + MARKER + AFTER


@pytest.fixture(scope="module")
def pairs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    folder = tmp_path_factory.mktemp("vision_models")
    return {name: write_pair(folder, name) for name in PAIRS}


def layout_of(pair: tuple[Path, Path], prompt: str, images: list[np.ndarray]) -> list[ChunkInfo]:
    with vision_context(*pair) as (_, _, mctx), rgb_bitmaps(images) as bitmaps, tokenized(mctx, prompt, bitmaps) as chunks:
        return chunk_layout(chunks)


@pytest.mark.parametrize("name", PAIRS)
def test_each_projector_loads_with_its_text_model(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    """Vision only, M-RoPE exactly for the Qwen2-VL pair (its text model's rope type),
    attention both ways inside an image exactly for Gemma 3's, the default marker."""
    with vision_context(*pairs[name]) as (_, _, mctx):
        assert M.mtmd_support_vision(mctx) and not M.mtmd_support_audio(mctx)
        assert M.mtmd_decode_use_mrope(mctx) is (name == "qwen2vl")
        assert M.mtmd_decode_use_non_causal(mctx, None) is (name == "gemma3")
        assert M.mtmd_get_marker(mctx).decode() == MARKER == "<__media__>"


@pytest.mark.parametrize("size", [(56, 56), (84, 112), (20, 30), (300, 17)])
def test_a_llava_image_is_16_tokens_whatever_its_size(pairs: dict[str, tuple[Path, Path]], size: tuple[int, int]) -> None:
    """Resized to the fixed 56 x 56 input: (56 / 14)^2 = 16 tokens, one position each, between
    the text before the marker (BOS first) and after it, each tokenized as llama_tokenize does."""
    text, image, rest = layout_of(pairs["llava"], PROMPT, [sample_image(*size, seed=0)])
    assert (text.kind, image.kind, rest.kind) == ("text", "image", "text")
    assert image.n_tokens == image.n_pos == LLAVA_IMAGE_TOKENS == 16
    with vision_context(*pairs["llava"]) as (model, _, _):
        vocab = C.llama_model_get_vocab(model)
        assert text.tokens == tuple(tokenize(vocab, BEFORE, add_special=True, parse_special=True))
        assert text.tokens[0] == C.llama_vocab_bos(vocab)
        assert rest.tokens == tuple(tokenize(vocab, AFTER, add_special=False, parse_special=True))


@pytest.mark.parametrize("size", [(84, 112), (56, 140), (112, 112)])
def test_a_qwen2vl_image_is_its_grid_of_28_pixel_cells(pairs: dict[str, tuple[Path, Path]], size: tuple[int, int]) -> None:
    """rows x columns tokens of 2 x 2 merged 14-pixel patches, between <|vision_start|> and
    <|vision_end|> (mtmd adds them); the chunk advances the position by max(rows, columns)."""
    rows, columns = qwen2vl_grid(*size)
    text, image, rest = layout_of(pairs["qwen2vl"], PROMPT, [sample_image(*size, seed=0)])
    assert (image.kind, image.ny, image.nx) == ("image", rows, columns)
    assert image.n_tokens == rows * columns and image.n_pos == max(rows, columns)
    with vision_context(*pairs["qwen2vl"]) as (model, _, _):
        vocab = C.llama_model_get_vocab(model)
        start, end = (tokenize(vocab, t, add_special=False, parse_special=True) for t in VISION_TOKENS)
    assert len(start) == len(end) == 1
    assert text.tokens[-1] == start[0] and rest.tokens[0] == end[0]


@pytest.mark.parametrize("size", [(64, 64), (84, 112), (300, 17)])
def test_a_gemma3_image_is_16_tokens_between_its_delimiters(pairs: dict[str, tuple[Path, Path]], size: tuple[int, int]) -> None:
    """Resized to the fixed 64 x 64 input, 16 x 16 patches pooled 4 x 4: 16 tokens, one
    position each, after <start_of_image> and before <end_of_image> (mtmd adds both)."""
    text, image, rest = layout_of(pairs["gemma3"], PROMPT, [sample_image(*size, seed=0)])
    assert image.kind == "image" and image.n_tokens == image.n_pos == GEMMA_IMAGE_TOKENS == 16
    with vision_context(*pairs["gemma3"]) as (model, _, _):
        vocab = C.llama_model_get_vocab(model)
        start, end = (tokenize(vocab, t, add_special=False, parse_special=True) for t in GEMMA_CONTROLS[2:])
    assert len(start) == len(end) == 1
    assert text.tokens[0] == C.llama_vocab_bos(vocab) and text.tokens[-1] == start[0] and rest.tokens[0] == end[0]


def test_gemma3s_image_tokens_attend_both_ways(pairs: dict[str, tuple[Path, Path]]) -> None:
    """mtmd decodes a Gemma 3 image with causal attention off, so each of its tokens sees the
    whole image; decoded causally, the logits after it are another's by far more than
    rounding. So an engine that missed the switch fails the equality tests on this pair."""
    image = sample_image(84, 112, seed=6)
    with vision_context(*pairs["gemma3"]) as (_, ctx, mctx), rgb_bitmaps([image]) as bitmaps, tokenized(mctx, PROMPT, bitmaps) as chunks:
        image_chunk = M.mtmd_input_chunks_get(chunks, 1)  # text, image, text
        assert M.mtmd_input_chunk_get_type(image_chunk) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE
        assert M.mtmd_decode_use_non_causal(mctx, image_chunk)
        helper = eval_logits(ctx, mctx, chunks)[0]
        np.testing.assert_array_equal(eval_by_hand(ctx, mctx, chunks), helper)
        assert np.abs(eval_by_hand(ctx, mctx, chunks, non_causal=False) - helper).max() > 1e-2
        assert C.llama_get_causal_attn(ctx)  # restored for the text that follows


@pytest.mark.parametrize("size", [(10, 10), (100, 150), (1, 500)])
def test_a_qwen2vl_image_of_any_size_is_resized_to_at_least_8_tokens(pairs: dict[str, tuple[Path, Path]], size: tuple[int, int]) -> None:
    (image,) = [c for c in layout_of(pairs["qwen2vl"], PROMPT, [sample_image(*size, seed=0)]) if c.kind == "image"]
    assert image.n_tokens == image.nx * image.ny >= 8


@pytest.mark.parametrize("name", PAIRS)
def test_logits_are_finite_depend_on_the_image_and_repeat(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    """Two images give logits apart by far more than rounding; the same image again, in the
    same context after the cache is cleared or in a fresh one, gives the same bits; and the
    position after the prompt is the sum of mtmd's n_pos, fewer than its tokens for M-RoPE."""
    a, b = sample_image(84, 112, seed=1), sample_image(84, 112, seed=2)
    runs = []
    with vision_context(*pairs[name]) as (_, ctx, mctx):
        for image in (a, b, a):
            with rgb_bitmaps([image]) as bitmaps, tokenized(mctx, PROMPT, bitmaps) as chunks:
                layout = chunk_layout(chunks)
                logits, n_past = eval_logits(ctx, mctx, chunks)
                assert n_past == sum(c.n_pos for c in layout)
                assert (n_past < sum(c.n_tokens for c in layout)) is (name == "qwen2vl")
                runs.append(logits)
    assert all(np.isfinite(r).all() for r in runs)
    assert np.abs(runs[0] - runs[1]).max() > 1e-2
    np.testing.assert_array_equal(runs[0], runs[2])
    np.testing.assert_array_equal(llamacpp_vision_logits(*pairs[name], PROMPT, [a]), runs[0])


@pytest.mark.parametrize("name", PAIRS)
def test_a_png_gives_the_logits_of_its_pixels(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    """mtmd's helper decodes the PNG written here (stb_image) to the very pixels it holds."""
    image = sample_image(84, 112, seed=3)
    with vision_context(*pairs[name]) as (_, ctx, mctx):
        with file_bitmap(mctx, png_bytes(image)) as bitmap:
            assert (M.mtmd_bitmap_get_nx(bitmap), M.mtmd_bitmap_get_ny(bitmap)) == (112, 84)
            with tokenized(mctx, PROMPT, [bitmap]) as chunks:
                from_png = eval_logits(ctx, mctx, chunks)[0]
        with rgb_bitmaps([image]) as bitmaps, tokenized(mctx, PROMPT, bitmaps) as chunks:
            np.testing.assert_array_equal(eval_logits(ctx, mctx, chunks)[0], from_png)


def test_bad_inputs_are_errors_not_aborts(pairs: dict[str, tuple[Path, Path]], tmp_path: Path) -> None:
    """Markers and images that differ in number (mtmd_tokenize returns 2), an image of no
    pixels (the same), a prompt ending in an image (no logits to read), bytes that are no
    image, and a projector made for another text width (mtmd_init_from_file returns NULL):
    each a Python error, the process alive."""
    image = sample_image(56, 56, seed=0)
    with vision_context(*pairs["llava"]) as (_, ctx, mctx):
        with rgb_bitmaps([np.zeros((0, 0, 3), np.uint8)]) as bitmaps:
            with pytest.raises(ValueError, match="returned 2: .*invalid bitmap dimensions: nx = 0, ny = 0"), tokenized(mctx, PROMPT, bitmaps):
                pass
        with rgb_bitmaps([image, image]) as bitmaps:
            with pytest.raises(ValueError, match="returned 2: .*number of media markers in text \\(1\\) does not match number of bitmaps \\(2\\)"), tokenized(mctx, PROMPT, bitmaps):
                pass
        with rgb_bitmaps([image]) as bitmaps, tokenized(mctx, BEFORE + MARKER, bitmaps) as chunks:
            with pytest.raises(ValueError, match="must end in text"):
                eval_logits(ctx, mctx, chunks)
        with pytest.raises(ValueError, match="could not decode"), file_bitmap(mctx, png_bytes(image)[:40]):
            pass
    narrow = write_mlp_projector(tmp_path / "mmproj-48.gguf", text_width=48)
    with pytest.raises(RuntimeError, match="mismatch between text model"), vision_context(pairs["llava"][0], narrow):
        pass


def eval_by_hand(ctx: C.llama_context_p, mctx: M.mtmd_context_p, chunks: M.mtmd_input_chunks_p, non_causal: bool = True) -> np.ndarray:
    """mtmd_helper_eval_chunks spelled out with llama_batch_ext, as an engine that builds its
    own batches would: text tokens at one position each; an image chunk encoded
    (mtmd_encode_chunk), its [n_tokens, n_embd] rows read (mtmd_get_output_embd) and added
    one row per entry at mtmd's decoder positions, four of them (t, y, x, z) under M-RoPE,
    and decoded with causal attention off where mtmd says so (unless not `non_causal`);
    the position then advanced by the chunk's n_pos. [n_vocab] logits of the last token."""
    C.llama_memory_clear(C.llama_get_memory(ctx), True)
    mrope, pos = M.mtmd_decode_use_mrope(mctx), 0
    batch = C.llama_batch_ext_init(ctx)
    try:
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            C.llama_batch_ext_clear(batch)
            if M.mtmd_input_chunk_get_type(chunk) == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                count = ctypes.c_size_t()
                tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
                for j in range(count.value):
                    idx = C.llama_batch_ext_add_token(batch, 0, tokens[j])
                    C.llama_batch_ext_set_pos(batch, idx, ctypes.byref(C.llama_pos(pos + j)))
                C.llama_batch_ext_set_output_logits(batch, idx, True)
                rows = None
            else:
                assert M.mtmd_encode_chunk(mctx, chunk) == 0
                image = M.mtmd_input_chunk_get_tokens_image(chunk)
                n_tokens = M.mtmd_image_tokens_get_n_tokens(image)
                rows = np.ctypeslib.as_array(M.mtmd_get_output_embd(mctx), shape=(n_tokens, N_EMBD)).copy()
                for j in range(n_tokens):
                    e = C.llama_embd(rows[j].ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, N_EMBD)
                    idx = C.llama_batch_ext_add_embd(batch, 0, e)
                    p = M.mtmd_image_tokens_get_decoder_pos(image, pos, j)
                    at = (C.llama_pos * 4)(p.t, p.y, p.x, p.z) if mrope else (C.llama_pos * 1)(p.t)
                    C.llama_batch_ext_set_pos(batch, idx, at)
            both_ways = rows is not None and non_causal and M.mtmd_decode_use_non_causal(mctx, chunk)
            C.llama_set_causal_attn(ctx, not both_ways)
            try:
                assert C.llama_process(ctx, C.LLAMA_PROCESS_TYPE_DECODE, batch) == 0
            finally:
                C.llama_set_causal_attn(ctx, True)
            pos += M.mtmd_input_chunk_get_n_pos(chunk)
    finally:
        C.llama_batch_ext_free(batch)
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(C.llama_get_model(ctx)))
    return np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()


@pytest.mark.parametrize("name", PAIRS)
def test_decoding_mtmds_embeddings_by_hand_gives_the_helpers_logits(pairs: dict[str, tuple[Path, Path]], name: str) -> None:
    prompt = f"First {MARKER} then {MARKER} compare them"
    images = [sample_image(84, 112, seed=4), sample_image(56, 140, seed=5)]
    with vision_context(*pairs[name]) as (_, ctx, mctx), rgb_bitmaps(images) as bitmaps, tokenized(mctx, prompt, bitmaps) as chunks:
        helper = eval_logits(ctx, mctx, chunks)[0]
        np.testing.assert_array_equal(eval_by_hand(ctx, mctx, chunks), helper)


@pytest.mark.parametrize("name", PAIRS)
def test_the_same_seed_writes_the_same_bytes(tmp_path: Path, name: str) -> None:
    folders = [tmp_path / n for n in ("a", "b", "c")]
    for folder in folders:
        folder.mkdir()
    first, again, other = (write_pair(folder, name, seed=s) for folder, s in zip(folders, (3, 3, 4)))
    for x, y, z in zip(first, again, other):
        assert x.read_bytes() == y.read_bytes() != z.read_bytes()
