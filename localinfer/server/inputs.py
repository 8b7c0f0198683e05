"""Embedding and rerank inputs, and a chat's images, from any dialect's request: checked, every
one before any is computed (or a model loaded), so that a bad one is a 400 that names it and
nothing is half done."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from localinfer.engine.engine import Engine
from localinfer.errors import UserError
from localinfer.images import ImageInput
from localinfer.server.errors import ApiError
from localinfer.server.fetch import FetchLimits, fetched_images

MAX_INPUTS = 2048  # inputs of one request, as OpenAI's embeddings API takes


def input_tokens(engine: Engine, inputs: list[str | list[int]], field: str = "input") -> list[list[int]]:
    """Each input's tokens (a text tokenized as an embedding input, or token ids checked
    against the vocabulary), the count and every input checked first: a 400 names the one."""
    if not inputs:
        raise ApiError(400, f"{field} is empty", param=field)
    if len(inputs) > MAX_INPUTS:
        raise ApiError(400, f"{field} has {len(inputs)} items; at most {MAX_INPUTS} go in one request", param=field)
    tokens = []
    for index, item in enumerate(inputs):
        if not item:
            raise ApiError(400, f"{field} {index} is empty", param=field)
        if isinstance(item, str):
            tokens.append(engine.tokenize_input(item))
        elif all(0 <= t < engine.backend.vocab.n_vocab for t in item):
            tokens.append(list(item))
        else:
            raise ApiError(400, f"{field} {index} has a token id outside this model's vocabulary", param=field)
    return tokens


def check_dimensions(engine: Engine, dimensions: int | None) -> None:
    """A Matryoshka cut can only be shorter than the model's vectors."""
    n_embd = engine.backend.facts.n_embd
    if dimensions is not None and dimensions > n_embd:
        raise ApiError(400, f"this model's embeddings have {n_embd} dimensions; dimensions can only cut them shorter", param="dimensions")


async def request_images(read: Callable[[], Sequence[ImageInput]], field: str, fetch: FetchLimits | None) -> list[bytes]:
    """A request's images as `read` decodes and checks them from its body, its links fetched
    under `fetch` (None: refused), before a model loads: a bad one costs nothing and is a 400
    naming `field`."""
    try:
        return await fetched_images(read(), fetch)
    except UserError as e:
        raise ApiError(400, str(e), param=field) from None
