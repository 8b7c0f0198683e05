"""Fitting a conversation into the context window, as chat clients do: the oldest turns
go first, the system prompt never does, and a message's images go with it. Shared by
`run`'s interactive mode and the chat app."""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.backends.base import MediaChunk
from localinfer.engine.media import extra_cells, marked
from localinfer.engine.templates import Message
from localinfer.engine.types import Think
from localinfer.errors import ContextOverflow


@dataclass
class FittedPrompt:
    tokens: list[int]
    messages: list[Message]  # what was rendered: the system prompt and the newest turns
    dropped: int  # how many of the oldest messages were left out
    media: dict[int, MediaChunk]  # the kept messages' images, for Engine.submit


def answer_room(n_ctx: int, max_tokens: int | None) -> int:
    """Tokens kept free for the answer: max_tokens if set, else a quarter of the context,
    and never more than half of it (a long conversation must still be answerable)."""
    return min(max_tokens or n_ctx // 4, n_ctx // 2)


def conversation_prompt(engine, messages: list[Message], think: Think = True) -> tuple[list[int], dict[int, MediaChunk]]:
    """The tokens and images of `messages` in the chat template. A message may carry
    "images" (image files' bytes), which stand before its text."""
    images = [image for m in messages for image in m.get("images", ())]
    shown = [{**{k: v for k, v in m.items() if k != "images"}, "content": marked(str(m["content"]), len(m["images"]))} if m.get("images") else m for m in messages]
    return engine.tokenize_media(engine.render_chat(shown, think=think), images)


def fit_conversation(engine, messages: list[Message], room: int, think: Think = True) -> FittedPrompt:
    """The prompt for `messages`, dropping the oldest non-system messages until the prompt
    and `room` fit in the context. The last message is always kept; if it alone cannot
    fit, ContextOverflow says so and nothing is dropped. `think`: a reasoning model thinks first (or how hard)."""
    system = [m for m in messages[:1] if m["role"] == "system"]
    turns = messages[len(system) :]
    n_ctx = engine.n_ctx
    dropped = 0
    while True:
        kept = system + turns[dropped:]
        tokens, media = conversation_prompt(engine, kept, think)
        size = len(tokens) + extra_cells(media, len(tokens))  # the cells it fills: 2-D images fill more than their positions
        last = dropped >= len(turns) - 1
        if size + room <= n_ctx or (last and size < n_ctx):
            return FittedPrompt(tokens, kept, dropped, media)
        if last:
            raise ContextOverflow(
                f"this message makes a prompt of {size} tokens but the context holds {n_ctx}; "
                "send a shorter one, or restart with a larger --ctx"
            )
        dropped += 1
        # never start the kept part on an assistant reply: a turn is a user message and its answer
        while dropped < len(turns) - 1 and turns[dropped]["role"] != "user":
            dropped += 1
