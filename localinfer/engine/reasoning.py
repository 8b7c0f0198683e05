"""Reasoning models: the thinking a model writes between `<think>` and `</think>`, split
from its answer as the tokens stream, above every backend (gpt-oss's channels are
harmony.py's; `syntax_of` finds which a model uses), and what clients ask of it.

A model thinks in this syntax when its chat template mentions the closing tag (Qwen3,
SmolLM3, the DeepSeek-R1 distills, which cut earlier turns at it) or its vocabulary holds
both tags as single tokens. A request starts inside the block when its prompt already
ends with the opening tag (templates that open it in the generation prompt, as the R1
distills do); otherwise the answer may open one as its first text. Thinking and answer go
out as separate event fields; stop strings and structured output apply to the answer.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Union

from localinfer.engine.harmony import HarmonySplitter, HarmonySyntax
from localinfer.engine.stops import partial_suffix
from localinfer.engine.types import EFFORTS, Effort, Think

OPEN, CLOSE = "<think>", "</think>"
# What the engine writes itself when a thinking budget runs out: the block's close and the
# blank line models put before their answer.
BUDGET_CLOSE = "\n" + CLOSE + "\n\n"
# Anthropic's thinking budget as an effort: below 4,096 tokens low, below 16,384 medium, else
# high. Round powers of two that put the budgets clients send for each level (1,024; 8,000 to
# 10,000; 20,000 to 24,576) in that level; Anthropic's least budget is 1,024.
BUDGET_EFFORTS: tuple[tuple[int, Effort], ...] = ((4096, "low"), (16384, "medium"))


def effort_of(value: str | None) -> Think:
    """An OpenAI reasoning effort as a Think: "none" is off, "minimal" the least ("low"),
    none given the model's own default (on)."""
    if value == "none":
        return False
    if value == "minimal":
        return "low"
    return value if value in EFFORTS else True  # type: ignore[return-value]


def think_of(flag: str, budget: int | None = None) -> Think:
    """The CLI's --think (on, off, low, medium, high) with --think-budget (0: off) as a Think."""
    if flag == "off" or budget == 0:
        return False
    return flag if flag in EFFORTS else True  # type: ignore[return-value]


def budget_effort(budget_tokens: int) -> Effort:
    """Anthropic's `thinking.budget_tokens` as an effort (BUDGET_EFFORTS)."""
    return next((effort for below, effort in BUDGET_EFFORTS if budget_tokens < below), "high")


def syntax_of(template: str | None, tokenize: Callable[[str], list[int]]) -> ThinkSyntax | HarmonySyntax | None:
    """How a model reasons, read from its template and vocabulary; None if it does not."""
    return HarmonySyntax.detect(template) or ThinkSyntax.detect(template, tokenize)


@dataclass(frozen=True)
class ThinkSyntax:
    """How one model marks its thinking, and whether its template can turn it off."""

    open: str = OPEN
    close: str = CLOSE
    switchable: bool = False  # the template reads `enable_thinking`
    efforts: bool = False  # the template reads `reasoning_effort`
    budget_close: str = BUDGET_CLOSE

    @classmethod
    def detect(cls, template: str | None, tokenize: Callable[[str], list[int]]) -> ThinkSyntax | None:
        """The model's syntax from its template and vocabulary, or None if it does not think."""
        single = all(len(tokenize(tag)) == 1 for tag in (OPEN, CLOSE))
        if not (template and CLOSE in template) and not single:
            return None
        return cls(switchable=bool(template) and "enable_thinking" in template, efforts=bool(template) and "reasoning_effort" in template)

    def starts_open(self, prompt_text: str) -> bool:
        """Whether a prompt ending like this leaves the model inside a think block."""
        tail = prompt_text.rstrip()
        return tail.endswith(self.open)

    def variables(self, think: bool, effort: Effort | None) -> dict[str, object]:
        """The template's variables: `enable_thinking`, and `reasoning_effort` where it reads one."""
        return {"enable_thinking": think, **({"reasoning_effort": effort} if effort and self.efforts else {})}

    def history(self, messages: list[dict]) -> list[dict]:
        return messages

    def prompt_suffix(self, prompt: str, think: bool) -> str:
        """What the engine adds to a prompt: with thinking off, the close of a block that the
        template opened and cannot keep shut."""
        return self.close + "\n\n" if not think and self.starts_open(prompt) else ""

    def end_tokens(self, eog: frozenset[int], single: Callable[[str], int | None]) -> frozenset[int]:
        return eog

    def splitter(self, prompt_tail: str) -> ReasoningSplitter:
        return ReasoningSplitter(self, inside=self.starts_open(prompt_tail))


class ReasoningSplitter:
    """One request's text, split into (reasoning, answer) as it streams. A tag may arrive
    in pieces; text that could still become one is held until it is clear."""

    def __init__(self, syntax: ThinkSyntax, inside: bool) -> None:
        self.syntax = syntax
        self.thinking = inside  # inside a think block now
        self.undecided = not inside  # at the answer's start, where a block may still open
        self.closed = False  # a block has ended: the answer has begun
        self._trim = inside  # drop the whitespace that opens the thinking, and the answer after it
        self._held = ""
        self.ended = False  # harmony's splitter may end a reply from its text; a think block never does

    @property
    def can_close(self) -> bool:
        """Inside the block, where a thinking budget may close it."""
        return self.thinking

    def push(self, text: str) -> tuple[str, str]:
        """New text in; (reasoning, answer) that is safe to emit out."""
        buf, reasoning, answer = self._held + text, "", ""
        self._held = ""
        while buf:
            if self._trim:  # the whitespace that opens the thinking, or the answer after it
                buf = buf.lstrip()
                if not buf:
                    return reasoning, answer
                self._trim = False
            if self.undecided:
                stripped = buf.lstrip()
                if stripped.startswith(self.syntax.open):
                    self.undecided, self.thinking, self._trim = False, True, True
                    buf = stripped[len(self.syntax.open) :]
                elif self.syntax.open.startswith(stripped):  # whitespace, or the tag's start: wait
                    self._held = buf
                    return reasoning, answer
                else:
                    self.undecided = False
            elif self.thinking:
                at = buf.find(self.syntax.close)
                if at < 0:
                    keep = partial_suffix(buf, self.syntax.close)
                    reasoning += buf[: len(buf) - keep]
                    self._held = buf[len(buf) - keep :]
                    return reasoning, answer
                reasoning += buf[:at]
                self.thinking, self.closed, self._trim = False, True, True
                buf = buf[at + len(self.syntax.close) :]
            else:
                answer += buf
                buf = ""
        return reasoning, answer

    def flush(self) -> tuple[str, str]:
        """What is held at the end: unfinished thinking stays thinking, the rest is answer."""
        held, self._held = self._held, ""
        return (held, "") if self.thinking else ("", held)


Splitter = Union[ReasoningSplitter, HarmonySplitter]  # what a request's text goes through: reasoning and answer apart
