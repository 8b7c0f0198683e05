"""Images in a prompt, as the engine schedules them. Each image's chunk (Backend.media_chunks)
stands in the request's token list as a run of placeholder ids, one per position it moves
the sequence on, all the same negative id made from its pixels' hash (never a vocabulary
id). So context checks, timings and prefix reuse count it as they count tokens, the same
image twice is the same run (its KV reused, as a text prefix is), and a prefill stops at a
run's start to hand the whole chunk to forward_media: an image is encoded whole or not at all.
"""

from __future__ import annotations

from localinfer.backends.base import MEDIA_MARKER, MediaChunk


def marked(text: str, n_images: int) -> str:
    """A message's text with its images' markers before it, where llama-mtmd-cli places them."""
    return MEDIA_MARKER * n_images + "\n" + text if n_images else text


def placeholder(key: str) -> int:
    """The id an image's positions stand as: negative, from its pixels' hash."""
    return -1 - int(key[:15] or "0", 16) % (2**31 - 1)


def media_prompt(pieces: list[list[int] | MediaChunk]) -> tuple[list[int], dict[int, MediaChunk]]:
    """The prompt's tokens, each image's run of placeholders in its place, and each image's
    chunk by where its run starts."""
    tokens: list[int] = []
    media: dict[int, MediaChunk] = {}
    for piece in pieces:
        if isinstance(piece, MediaChunk):
            media[len(tokens)] = piece
            tokens += [placeholder(piece.key)] * piece.n_pos
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
