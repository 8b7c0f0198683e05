"""A reply as it streams into its MessageView: whole Markdown blocks go to the Markdown widget,
the block still being written stays plain text, and the end result is the same Markdown as the
whole reply rendered at once (markdown-it and Textual's own widget are the references)."""

from __future__ import annotations

import asyncio

from markdown_it import MarkdownIt
from textual.app import App, ComposeResult
from textual.containers import VerticalScroll
from textual.widgets import Markdown

from localinfer.tui.widgets import TAIL_STEP, MessageView, QuickStatic, whole_blocks

REPLY = """Here is a function that checks whether a number is prime:

```python
def is_prime(n: int) -> bool:
    if n < 2:
        return False

    return all(n % d for d in range(2, int(n**0.5) + 1))
```

It tries every divisor up to the square root of `n`:

- **2** is the only even prime;
- a composite number has a divisor no larger than its square root.

| n | prime |
|---|---|
| 7 | yes |

1. Call it.
2. Print the result. A long line of prose that wraps on a narrow terminal, so that the block being written grows by more than one line at a time as it streams in.
"""


def top_level_blocks(text: str) -> list[tuple[str, str]]:
    """markdown-it's top-level blocks of `text`: (type, source lines)."""
    lines = text.splitlines(keepends=True)
    return [(t.type, "".join(lines[t.map[0] : t.map[1]])) for t in MarkdownIt("gfm-like").parse(text) if t.level == 0 and t.map]


def pieces(text: str, size: int) -> list[str]:
    return [text[i : i + size] for i in range(0, len(text), size)]


def test_whole_blocks_are_the_blocks_more_text_cannot_change() -> None:
    final = top_level_blocks(REPLY)
    for end in range(len(REPLY) + 1):
        prefix = REPLY[:end]
        n = whole_blocks(prefix)
        whole = top_level_blocks(prefix[:n])
        assert whole == final[: len(whole)], f"after {end} characters"  # a whole block is as the full reply has it
        assert len(top_level_blocks(prefix)) - len(whole) <= 1  # at most the last block waits


class Conversation(App):
    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield MessageView("assistant", streaming=True)
            yield Markdown(REPLY, id="reference")


def block_kinds(markdown: Markdown) -> list[str]:
    return [type(block).__name__ for block in markdown.children]


def test_a_streamed_reply_ends_as_the_same_markdown_and_its_tail_grows_in_steps() -> None:
    async def test() -> None:
        app = Conversation()
        async with app.run_test(size=(60, 40)) as pilot:
            view = app.query_one(MessageView)
            markdown = view.query_one(Markdown)
            tail = view.query_one(".tail", QuickStatic)
            streamed = ""
            for piece in pieces(REPLY, 7):
                await view.stream(piece)
                streamed += piece
                await pilot.pause()
                assert markdown.source + tail.visual.plain == streamed  # nothing lost, nothing twice
                lines = tail.visual.get_height(tail.styles, tail.content_region.width) if tail.visual.plain else 0
                assert tail.size.height % TAIL_STEP == 0 and lines <= tail.size.height < lines + TAIL_STEP
            await view.end_stream()
            await pilot.pause()
            assert not view.query(".tail") and not view.streaming
            assert markdown.source == REPLY
            assert block_kinds(markdown) == block_kinds(app.query_one("#reference", Markdown))

    asyncio.run(test())
