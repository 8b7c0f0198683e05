"""The chat app's widgets: one per message, the prompt box, the status line, the chat list.
They hold no state of the app's and write nothing: they show what they are given, and post
messages up (Textual's "attributes down, messages up")."""

from __future__ import annotations

from collections.abc import Sequence

from markdown_it import MarkdownIt
from textual import events
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.css.scalar import Scalar
from textual.message import Message
from textual.widgets import Collapsible, Label, ListItem, Markdown, Static, TextArea

from localinfer.tui.attachments import Attachment
from localinfer.tui.replies import ReplyFigures
from localinfer.tui.store import Chat, ChatMessage

TAIL_STEP = 4  # lines the block being written grows by at a time: one layout per 4 lines of text
ROLE_TITLES = {"user": "You", "assistant": "Assistant", "system": "System"}


class QuickStatic(Static):
    """A Static whose update asks for a new layout only when its height changes: a layout
    rearranges the whole screen (several ms in Python, on a core the decode threads want),
    while a repaint redraws only this widget's lines. With `step` > 1 it grows that many
    lines at a time, so text that streams in lays the screen out once every `step` lines."""

    def __init__(self, *args: object, step: int = 1, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.step = step

    def show(self, text: str) -> None:
        self.update(text, layout=False)
        width = self.content_region.width
        if not width:  # not laid out yet
            self.refresh(layout=True)
            return
        lines = self.visual.get_height(self.styles, width) if text else 0
        height = -(-lines // self.step) * self.step
        if self.step > 1 and self.styles.height != Scalar.from_number(height):
            self.styles.height = height  # a layout
        elif self.step == 1 and lines != self.content_region.height:
            self.refresh(layout=True)


class MessageView(Vertical, can_focus=True):
    """A message: a title line, a reasoning model's thinking (collapsed: "Thinking", with how
    long and how many tokens), and its Markdown. A reply streams into it while it is written."""

    def __init__(self, role: str, content: str = "", message: ChatMessage | None = None, note: str = "", streaming: bool = False,
                 images: Sequence[Attachment] = ()) -> None:  # fmt: skip
        super().__init__(classes=f"message {role}")
        self.role = role
        self.message = message
        self.images = tuple(images)  # a line each: name, pixels, format and size
        self.content = content
        self.note = note
        self.reasoning = (message.reasoning or "") if message is not None else ""
        self.streaming = streaming  # a reply being written: its last block shows as plain text until it is whole
        self._tail = ""  # that block's text

    def compose(self) -> ComposeResult:
        yield Label(self._title(), classes="title")
        for image in self.images:
            yield Label(f"Image: {image.describe()}", classes="attachment", markup=False)
        if self.reasoning:
            yield self._thinking()
        yield Markdown(self.content)
        if self.streaming:
            yield QuickStatic("", classes="tail", markup=False, step=TAIL_STEP)

    async def stream(self, text: str) -> None:
        """More of the reply being written. Each block goes to the Markdown widget once, when
        it is whole; the block still growing is plain text, which costs a fraction of a
        Markdown re-render per update (why: docs/architecture.md, the chat app)."""
        self._tail += text
        whole = whole_blocks(self._tail)
        if whole:
            await self.query_one(Markdown).append(self._tail[:whole])
            self._tail = self._tail[whole:]
        self.query_one(".tail", QuickStatic).show(self._tail)

    async def end_stream(self) -> None:
        """The reply is written: its last block becomes Markdown too."""
        if self._tail:
            await self.query_one(Markdown).append(self._tail)
            self._tail = ""
        await self.query_one(".tail", QuickStatic).remove()
        self.streaming = False

    def _thinking(self) -> Collapsible:
        text = Static(self.reasoning, classes="thinking-text", markup=False)
        return Collapsible(text, title=self._thinking_title(), collapsed=True, classes="thinking")

    def _thinking_title(self) -> str:
        m, parts = self.message, ["Thinking"]
        if m is not None and m.reasoning_ms:
            parts.append(f"{m.reasoning_ms / 1e3:.1f} s")
        if m is not None and m.reasoning_tokens:
            parts.append(f"{m.reasoning_tokens} tokens")
        return " · ".join(parts) if m is not None else "Thinking…"

    async def add_thinking(self, text: str) -> None:
        """More thinking of the reply being written: into its (collapsed) block."""
        self.reasoning += text
        blocks = self.query(Collapsible)
        if blocks:
            blocks.first().query_one(".thinking-text", Static).update(self.reasoning)
        else:
            await self.mount(self._thinking(), before=self.query_one(Markdown))

    def toggle_thinking(self) -> bool:
        """Expand or collapse the thinking; False if there is none."""
        blocks = self.query(Collapsible)
        if blocks:
            blocks.first().collapsed = not blocks.first().collapsed
        return bool(blocks)

    def _title(self) -> str:
        m = self.message
        parts = [ROLE_TITLES.get(self.role, self.role)]
        if m is not None and m.role == "assistant":
            parts += [x for x in (m.model,) if x]
            if m.finish_reason == "abort":
                parts.append("stopped")
            elif m.finish_reason in ("length", "error"):
                parts.append({"length": "cut at max tokens", "error": "failed"}[m.finish_reason])
        if self.note:
            parts.append(self.note)
        return " · ".join(parts)

    def set_note(self, note: str) -> None:
        self.note = note
        self._retitle()

    def set_message(self, message: ChatMessage) -> None:
        self.message = message
        self._retitle()

    def _retitle(self) -> None:
        if self.is_mounted:
            self.query_one(".title", Label).update(self._title())
            for block in self.query(Collapsible):
                block.title = self._thinking_title()


_PARSER = MarkdownIt("gfm-like")  # Textual's Markdown widget parses with the same


def warm_up() -> None:
    """Load what drawing a reply loads on first use, before a reply streams: Rich's table of
    character widths (~50 ms, at the first "…" or "│" cut into a frame) and Pygments' Python
    lexer (~30 ms, at the first Python code block). Paid while the model loads, not by the
    first reply's decode."""
    from rich.cells import cell_len
    from textual.highlight import highlight

    cell_len("…│")
    highlight("pass", language="python")
    whole_blocks("warm\n\nup")


def whole_blocks(text: str) -> int:
    """How many characters of `text` are whole Markdown blocks: all before the last block,
    which more text could still change (a paragraph grows, a code fence is not closed)."""
    starts = [token.map[0] for token in _PARSER.parse(text) if token.level == 0 and token.map]
    if not starts:
        return 0
    return sum(len(line) for line in text.splitlines(keepends=True)[: max(starts)])


class PromptInput(TextArea):
    """A multi-line prompt: Enter sends, Shift+Enter (or Ctrl+J, for terminals that cannot
    tell Shift+Enter apart) breaks the line."""

    class Submitted(Message):
        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    async def _on_key(self, event: events.Key) -> None:
        if event.key == "enter":
            event.prevent_default()
            event.stop()
            if self.text.strip():
                self.post_message(self.Submitted(self.text))
            return
        if event.key in ("shift+enter", "ctrl+j"):
            event.prevent_default()
            event.stop()
            self.insert("\n")
            return
        await super()._on_key(event)


def _size(n: int) -> str:
    return f"{n / 1e6:.1f} MB" if n >= 1e5 else f"{n / 1e3:.0f} kB"


def status_text(model: str, engine: str, figures: ReplyFigures | None, streaming: bool = False) -> str:
    """The status line: model and engine, the last reply's TTFT, tokens/s (live while it
    streams) and length, context used of context size, the KV cache's fill (all slots),
    type and bytes, and prompt lookup's acceptance rate and tokens per forward."""
    parts = [f"{model} · {engine}"]
    f = figures
    if f is None:
        return parts[0]
    parts.append(f"TTFT {f.ttft_ms:.0f} ms" if f.ttft_ms else "TTFT …")
    parts.append((f"{f.tokens_per_s:.1f} tok/s" if f.tokens_per_s else "– tok/s") + (" …" if streaming else ""))
    parts.append(f"{f.tokens} tokens")
    if f.prompt_tokens is not None:
        used = f.prompt_tokens + f.tokens
        parts.append(f"ctx {used}/{f.n_ctx}" if f.n_ctx else f"ctx {used}")
    if f.kv_cells is not None and f.kv_cells_total:
        kv = f"KV {f.kv_cells / f.kv_cells_total:.0%}"
        if f.cache_types:
            kv += " " + "/".join(f.cache_types)
        if f.kv_bytes is not None:
            kv += f" {_size(f.kv_bytes)}"
        parts.append(kv)
    if f.drafted:
        parts.append(f"draft {speculation_rates(f)} ({f.tokens_per_forward:.2f} tok/fwd)")
    return " │ ".join(parts)


def speculation_rates(f: ReplyFigures) -> str:
    """Acceptance per source that drafted: "model 91% lookup 40%"."""
    return " ".join(f"{name} {accepted / drafted:.0%}" for name, drafted, accepted in f.sources if drafted)


class StatusLine(QuickStatic):
    def show_figures(self, model: str, engine: str, figures: ReplyFigures | None, streaming: bool = False) -> None:
        self.show(status_text(model, engine, figures, streaming))


class ChatItem(ListItem):
    def __init__(self, chat: Chat, detail: str) -> None:
        super().__init__(Label(chat.title, classes="chat-title"), Label(detail, classes="chat-detail"))
        self.chat = chat
