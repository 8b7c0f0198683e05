"""A chat request's prompt, whichever dialect it came in: every dialect turns its messages
into OpenAI's shape (what chat templates and tools.py read) and its tool choice into
OpenAI's, and this renders them once with the model's template, tools and thinking."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from localinfer.backends.base import MediaChunk
from localinfer.engine.engine import Engine
from localinfer.engine.tools import CallStream, Tool, ToolCall, ToolFormat, ToolPlan, parse_calls, plan_tools, prompt_messages, tool_format
from localinfer.engine.types import Think
from localinfer.errors import ConstraintError, UserError
from localinfer.server.errors import ApiError

CALLS_IN_TEXT: tuple[ToolFormat, ...] = ("harmony",)  # formats whose calls are taken out of the answer even when no tools were offered


@dataclass
class ChatPrompt:
    tokens: list[int]
    plan: ToolPlan | None  # how the answer uses the tools; None: plain text
    fmt: ToolFormat = "generic"  # the model's tool-call syntax
    media: dict[int, MediaChunk] = field(default_factory=dict)  # its images (Engine.tokenize_media)

    def answer(self, text: str) -> tuple[str, list[ToolCall]]:
        """A finished answer's text and tool calls."""
        if self.plan:
            return parse_calls(text, self.plan.fmt, self.plan.required)
        return parse_calls(text, self.fmt, keep=False) if self.fmt in CALLS_IN_TEXT else (text, [])

    def calls(self) -> CallStream | None:
        """A streamed answer's text with its calls held back until whole (and dropped where
        no tools were offered, as llama.cpp drops them); None: the text is all answer."""
        if self.plan:
            return CallStream(self.plan.fmt, self.plan.required)
        return CallStream(self.fmt, keep=False) if self.fmt in CALLS_IN_TEXT else None


def chat_prompt(engine: Engine, messages: list[dict], tools: Callable[[], list[Tool]], choice: str, think: Think, images: Sequence[bytes] = ()) -> ChatPrompt:
    """`tools`: the request's tools, checked as they are built (a wire schema's tool_list);
    `choice`: "auto", "none", "required" or a tool's name; `think`: whether, or how hard, a
    reasoning model thinks first; `images`: the image files' bytes, in the order their
    MEDIA_MARKERs stand in the messages. A bad tool, an image the model cannot read or a
    template that fails on these messages is a 400 naming the field."""
    template = engine.backend.facts.chat_template
    try:
        plan = plan_tools(template, tools(), choice)
    except ConstraintError as e:
        raise ApiError(400, str(e), param="tools") from None
    fmt = plan.fmt if plan else tool_format(template)
    shown = prompt_messages(messages, plan.tools if plan else [], fmt)
    try:
        text = engine.render_chat(shown, tools=plan.template_tools() if plan else None, think=think)
        tokens, media = engine.tokenize_media(text + (plan.prefix if plan else ""), list(images))
    except UserError as e:
        raise ApiError(400, str(e), param="messages") from None
    return ChatPrompt(tokens, plan, fmt, media)
