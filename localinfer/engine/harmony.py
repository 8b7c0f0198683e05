"""gpt-oss's "harmony" format: a reply is a run of messages, each a header and a body, and
the header's channel says what the body is.

    <|channel|>analysis<|message|>The user asks...<|end|><|start|>assistant<|channel|>final<|message|>Paris.<|return|>
    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{"location":"SF"}<|call|>

The generation prompt ends in `<|start|>assistant`, so a reply opens with a header. `analysis`
is the model's reasoning; `final` its answer; `commentary` a preamble for the user (answer
too) or, addressed `to=functions.NAME` (in the channel, or in the role as the template writes
earlier calls: `<|start|>assistant to=functions.NAME<|channel|>commentary json<|message|>`), a
tool call whose body is its arguments. A body ends at `<|end|>` (a control token that
llama.cpp does not render as text, so also at the next `<|start|>`), the reply at
`<|return|>` or `<|call|>`, end-of-generation tokens (llama.cpp's `common_chat_parse_gpt_oss`
reads the same headers). The splitter turns this into (reasoning, answer) as it streams; a
call goes into the answer in the template's own form for it (`call_text`), which tools.py
reads back into a ToolCall, so every dialect gets it the way it gets the other formats' calls.

A model speaks harmony when its template writes these headers (`<|channel|>analysis`).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from localinfer.engine.stops import partial_suffix
from localinfer.engine.types import Effort

START, CHANNEL, MESSAGE, CONSTRAIN = "<|start|>", "<|channel|>", "<|message|>", "<|constrain|>"
END, RETURN, CALL = "<|end|>", "<|return|>", "<|call|>"
BODY_ENDS = (END, START, RETURN, CALL)  # what ends a body: a message's end, the next message, the reply's end
CALL_OPEN = START + "assistant to=functions."  # a call as the template renders it: its name, then
CALL_HEAD = CHANNEL + "commentary json" + MESSAGE  # this, its arguments, then CALL
# What the engine writes itself when a thinking budget runs out: the analysis ends, the answer begins.
BUDGET_CLOSE = END + START + "assistant" + CHANNEL + "final" + MESSAGE
HEADER_MOST = 256  # characters a header may take; past that (or at a newline) the model is not writing one
_OPENERS = (CHANNEL, " to=", "to=", CONSTRAIN, MESSAGE)  # what may follow a header's role
_CHANNEL = re.compile(re.escape(CHANNEL) + r"\s*([A-Za-z_]+)")
_RECIPIENT = re.compile(r"to=([^\s<]+)")


def call_text(name: str, arguments: str) -> str:
    """A call as the answer carries it to tools.py: the template's own rendering of a call."""
    return f"{CALL_OPEN}{name}{CALL_HEAD}{arguments}{CALL}"


def header_kind(header: str) -> tuple[str, str]:
    """(the body's kind: "reasoning", "answer" or "call", the called function's name) for a
    header's text. Calls to the built-in tools (browser, python) are the model's own working."""
    recipient = _RECIPIENT.search(header)
    if recipient:
        name = recipient.group(1)
        return ("call", name.removeprefix("functions.")) if name.startswith("functions.") else ("reasoning", "")
    channel = _CHANNEL.search(header)
    return ("reasoning" if channel and channel.group(1) == "analysis" else "answer"), ""


def plausible_header(text: str) -> bool:
    """Whether text could still be (the start of) a header, not a model writing plain text:
    `<|start|>`, the role, then a channel, a recipient, a content type or `<|message|>`."""
    if len(text) > HEADER_MOST or "\n" in text:
        return False
    for head in (START, "assistant"):
        if head.startswith(text):
            return True
        text = text.removeprefix(head)
    return any(text.startswith(o) or o.startswith(text) for o in _OPENERS)


@dataclass(frozen=True)
class HarmonySyntax:
    """The harmony format as data: what the engine writes, reads and stops at."""

    switchable: bool = False  # gpt-oss always reasons: off asks for the least it does ("low")
    budget_close: str = BUDGET_CLOSE

    @classmethod
    def detect(cls, template: str | None) -> HarmonySyntax | None:
        return cls() if template and CHANNEL + "analysis" in template else None

    def variables(self, think: bool, effort: Effort | None) -> dict[str, object]:
        """The template's variables: its `reasoning_effort`, unless it keeps its own default."""
        effort = effort or (None if think else "low")
        return {"reasoning_effort": effort} if effort else {}

    def history(self, messages: list[dict]) -> list[dict]:
        """Earlier turns as the template reads them: the reasoning before a call goes back as
        `thinking` (the template drops it once a later answer followed, and every other
        turn's reasoning), as llama.cpp's gpt-oss handler passes it. The template takes a
        call's analysis from its content or its thinking and refuses both, so a call that
        has both (a preamble beside it, as Anthropic clients send text blocks) keeps its reasoning."""
        return [
            {**m, "thinking": m["reasoning_content"], "content": ""} if m.get("role") == "assistant" and m.get("tool_calls") and isinstance(m.get("reasoning_content"), str) else m
            for m in messages
        ]

    def prompt_suffix(self, prompt: str, think: bool) -> str:
        return ""

    def end_tokens(self, eog: frozenset[int], single: Callable[[str], int | None]) -> frozenset[int]:
        """The reply ends at <|return|> and <|call|>, never at <|end|> (which only ends a
        message), whatever the vocabulary's own list says (llama.cpp fixes its list so)."""
        ends = {t for t in (single(RETURN), single(CALL)) if t is not None}
        end = single(END)
        return frozenset((eog | ends) - ({end} if end is not None and ends else set()))

    def splitter(self, prompt_tail: str) -> HarmonySplitter:
        """A request's splitter, in the state the prompt's last message left it: a header the
        generation prompt opened (or began: a required call's), or a body it already opened."""
        at = prompt_tail.rfind(START)
        if at < 0:
            return HarmonySplitter(state="answer")  # not a harmony prompt: all of it is answer
        head = prompt_tail[at + len(START) :]
        if MESSAGE not in head:
            return HarmonySplitter(head, shaped=CHANNEL in head and header_kind(head)[0] != "reasoning")
        header, body = head.split(MESSAGE, 1)
        kind, name = header_kind(header)
        return HarmonySplitter(state=kind, call=name, arguments=body if kind == "call" else "")


class HarmonySplitter:
    """One request's text, split into (reasoning, answer) as it streams. A marker may arrive
    in pieces (or, with a vocabulary that lacks it, as plain text): text that could still
    become one is held until it is clear."""

    def __init__(self, header: str = "", *, state: str = "header", shaped: bool = False, call: str = "", arguments: str = "") -> None:
        self.state = state  # "header", "reasoning", "answer", "call" or "done"
        self.closed = False  # an analysis message has ended (the reasoning's tokens are counted to here)
        self.ended = False  # the text itself ended the reply (<|return|> or <|call|> as plain text)
        self._shaped = shaped  # this header was begun by the prompt: a constraint shapes it
        self._prefix = header  # the header's start, written by the prompt
        self._held = ""
        self._call, self._arguments = call, [arguments]

    @property
    def thinking(self) -> bool:
        """Not in the answer yet: a constraint waits (in a header the model chooses its channel)."""
        return self.state == "reasoning" or (self.state == "header" and not self._shaped)

    @property
    def can_close(self) -> bool:
        """Inside the analysis, where a thinking budget may end it."""
        return self.state == "reasoning"

    def push(self, text: str) -> tuple[str, str]:
        """New text in; (reasoning, answer) that is safe to emit out."""
        buf, out = self._held + text, {"reasoning": [], "answer": []}
        self._held = ""
        while buf and self.state != "done":
            if self.state == "header":
                at = buf.find(MESSAGE)
                if at < 0 and plausible_header(self._prefix + buf):
                    self._held = buf
                    break
                if at < 0:  # plain text where a header should be: the model does not speak harmony here
                    self.state, self._prefix = "answer", ""
                    continue
                self._open(self._prefix + buf[:at])
                buf = buf[at + len(MESSAGE) :]
                continue
            found = [(buf.find(m), m) for m in BODY_ENDS if m in buf]
            if not found:
                keep = max(partial_suffix(buf, m) for m in BODY_ENDS)
                self._body(buf[: len(buf) - keep], out)
                self._held = buf[len(buf) - keep :]
                break
            at, marker = min(found)
            self._body(buf[:at], out)
            self._close(marker, out)
            buf = buf[at + len(marker) :]
        return "".join(out["reasoning"]), "".join(out["answer"])

    def flush(self) -> tuple[str, str]:
        """At the reply's end: a call whose <|call|> ended the generation goes out, held text
        that was no marker goes where its body goes, an unfinished header nowhere."""
        held, self._held = self._held, ""
        out: dict[str, list[str]] = {"reasoning": [], "answer": []}
        if self.state in ("reasoning", "answer", "call"):
            self._body(held, out)
            self._close(CALL if self.state == "call" else END, out)
        self.state = "done"
        return "".join(out["reasoning"]), "".join(out["answer"])

    def _open(self, header: str) -> None:
        kind, name = header_kind(header.rsplit(START, 1)[-1])
        self.state, self._shaped, self._prefix = kind, False, ""
        self._call, self._arguments = name, []

    def _body(self, text: str, out: dict[str, list[str]]) -> None:
        if not text:
            return
        if self.state == "call":
            self._arguments.append(text)
        elif self.state in out:
            out[self.state].append(text)

    def _close(self, marker: str, out: dict[str, list[str]]) -> None:
        if self.state == "call":
            out["answer"].append(call_text(self._call, "".join(self._arguments).strip()))
        elif self.state == "reasoning":
            self.closed = True
        if marker in (RETURN, CALL):
            self.state, self.ended = "done", True
        else:
            self.state = "header"
