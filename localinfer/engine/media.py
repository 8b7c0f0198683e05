"""Images in a prompt, as the engine schedules them. Each image's chunk (Backend.media_chunks)
stands in the request's token list as a run of placeholder ids, one per position it moves
the sequence on: negative ids (never a vocabulary id) drawn from its pixels' hash, a
different one at each position, so that two images' runs differ unless their hashes do. So
context checks, timings, prefix reuse and the prompt cache's block keys count an image as
they count tokens, the same image twice is the same run (its KV reused, as a text prefix is),
and a prefill stops at a run's start to hand the whole chunk to forward_media: an image is
encoded whole or not at all.
"""

from __future__ import annotations

import hashlib

import numpy as np

from localinfer.backends.base import MEDIA_MARKER, MediaChunk


def marked(text: str, n_images: int) -> str:
    """A message's text with its images' markers before it, where llama-mtmd-cli places them."""
    return MEDIA_MARKER * n_images + "\n" + text if n_images else text


def placeholders(key: str, n: int) -> list[int]:
    """The ids an image's n positions stand as: negative int32s drawn from its pixels' hash.
    One id alone has 31 bits, which a prompt cache on disk holding many images could see two
    images share; a run of n of them cannot."""
    drawn = np.frombuffer(hashlib.shake_128(key.encode()).digest(4 * n), dtype=np.uint32)
    return (-1 - (drawn.astype(np.int64) % (2**31 - 1))).tolist()


def extra_cells(media: dict[int, MediaChunk], n: int) -> int:
    """The cells past one a position that the images within a prompt's first n positions
    fill: 0 but for images laid out in 2-D (M-RoPE), which fill more cells than positions.
    The KV cache holds cells, so that is what a context is counted in."""
    return sum(chunk.n_tokens - chunk.n_pos for start, chunk in media.items() if start + chunk.n_pos <= n)


def cells_end(media: dict[int, MediaChunk], end: int) -> int:
    """One past the last position a sequence's cells sit at once it holds the prompt's first
    `end` positions: `end`, but where that cuts an image laid out in 2-D (Qwen-VL's M-RoPE),
    whose cells all sit at its first position, one past that position."""
    for start, chunk in media.items():
        if chunk.n_tokens != chunk.n_pos and start < end < start + chunk.n_pos:
            return start + 1
    return end


def media_prompt(pieces: list[list[int] | MediaChunk]) -> tuple[list[int], dict[int, MediaChunk]]:
    """The prompt's tokens, each image's run of placeholders in its place, and each image's
    chunk by where its run starts."""
    tokens: list[int] = []
    media: dict[int, MediaChunk] = {}
    for piece in pieces:
        if isinstance(piece, MediaChunk):
            media[len(tokens)] = piece
            tokens += placeholders(piece.key, piece.n_pos)
        else:
            tokens += piece
    return tokens, media


def whole(media: dict[int, MediaChunk], n: int) -> int:
    """The longest prefix of at most n tokens that cuts no image: a cached prefix that ends
    inside one is cut back to its start, since an image cannot be half prefilled."""
    for start, chunk in media.items():
        if start < n < start + chunk.n_pos:
            return start
    return n


def text_until(media: dict[int, MediaChunk], at: int, n: int) -> int:
    """How many of the n prompt tokens from `at` are text before the next image (n if none)."""
    starts = [start for start in media if start >= at]
    return min(n, min(starts) - at) if starts else n
