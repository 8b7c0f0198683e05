"""Anthropic's Messages API schemas (the subset a local model can honour), and the
translation of its conversation into OpenAI's shape, which the templates and tools read.

Requests ignore fields we do not know (`metadata`, `service_tier`, cache_control on a
block) and refuse, with a 400 naming them, blocks we cannot honour (images, documents)."""

from __future__ import annotations

import json
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.reasoning import budget_effort
from localinfer.engine.tools import Tool
from localinfer.engine.types import Think
from localinfer.images import ImageInput, image_from_base64, image_from_url
from localinfer.server.protocol import ChatMessage, Lenient, count, limited


class TextBlock(Lenient):
    type: Literal["text"]
    text: str


class ToolUseBlock(Lenient):
    type: Literal["tool_use"]
    id: str
    name: str
    input: dict = Field(default_factory=dict)


class ToolResultBlock(Lenient):
    type: Literal["tool_result"]
    tool_use_id: str
    content: str | list[TextBlock] | None = None
    is_error: bool = False

    def text(self) -> str:
        body = self.content if isinstance(self.content, str) else "".join(b.text for b in self.content or [])
        return f"Error: {body}" if self.is_error else body


class ThinkingBlock(Lenient):
    type: Literal["thinking"]
    thinking: str
    signature: str | None = None


class RedactedThinkingBlock(Lenient):
    type: Literal["redacted_thinking"]
    data: str = ""


class ImageSource(Lenient):
    type: Literal["base64", "url"]
    media_type: str | None = None
    data: str | None = None
    url: str | None = None

    def image(self, name: str) -> ImageInput:
        """The image's bytes, checked, or a url source's link (fetched under --allow-fetch)."""
        return image_from_base64(self.data or "", name) if self.type == "base64" else image_from_url(self.url or "", name)


class ImageBlock(Lenient):
    type: Literal["image"]
    source: ImageSource


Block = Annotated[TextBlock | ImageBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock, Field(discriminator="type")]


class Message(Lenient):
    role: Literal["user", "assistant"]
    content: str | list[Block]


class ToolSpec(Lenient):
    name: str
    description: str = ""
    input_schema: dict = Field(default_factory=lambda: {"type": "object", "properties": {}})


class ToolChoice(Lenient):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None

    def openai(self) -> str:
        """OpenAI's tool_choice: auto, required, a tool's name, or none."""
        if self.type == "tool":
            return self.name or ""
        return {"auto": "auto", "any": "required", "none": "none"}[self.type]


class Thinking(Lenient):
    type: Literal["enabled", "disabled", "adaptive"]
    budget_tokens: int | None = count()


class CountTokensRequest(Lenient):
    model: str | None = None
    messages: list[Message] = Field(min_length=1)
    system: str | list[TextBlock] | None = None
    tools: list[ToolSpec] | None = None
    tool_choice: ToolChoice | None = None
    thinking: Thinking | None = None

    def conversation(self) -> list[dict]:
        """The messages in OpenAI's shape: the system prompt first; a user turn's tool
        results become "tool" messages before its text; an assistant's tool_use blocks its
        tool_calls and its thinking its reasoning_content."""
        system = self.system if isinstance(self.system, str) else "".join(b.text for b in self.system or [])
        out = [{"role": "system", "content": system}] if system else []
        for m in self.messages:
            blocks = [TextBlock(type="text", text=m.content)] if isinstance(m.content, str) else m.content
            text = "".join(b.text if isinstance(b, TextBlock) else MEDIA_MARKER for b in blocks if isinstance(b, (TextBlock, ImageBlock)))
            if m.role == "user":
                out += [{"role": "tool", "tool_call_id": b.tool_use_id, "content": b.text()} for b in blocks if isinstance(b, ToolResultBlock)]
                if text or not any(isinstance(b, ToolResultBlock) for b in blocks):
                    out.append({"role": "user", "content": text})
                continue
            calls = [{"id": b.id, "type": "function", "function": {"name": b.name, "arguments": json.dumps(b.input, ensure_ascii=False)}} for b in blocks if isinstance(b, ToolUseBlock)]
            thought = "".join(b.thinking for b in blocks if isinstance(b, ThinkingBlock))
            out.append(ChatMessage(role="assistant", content=text, tool_calls=calls or None, reasoning_content=thought or None).for_template())
        return out

    def tool_list(self) -> list[Tool]:
        return [Tool(t.name, t.input_schema, t.description) for t in self.tools or []]

    def images(self) -> list[ImageInput]:
        """Every image block's bytes (or link), in message order (UserError names a bad one)."""
        blocks = [b for m in self.messages if not isinstance(m.content, str) for b in m.content if isinstance(b, ImageBlock)]
        return [b.source.image(f"image {i + 1}") for i, b in enumerate(blocks)]

    def thinks(self) -> Think:
        """Thinking is the model's default (as in every dialect here) unless disabled; an
        enabled budget asks for an effort (reasoning.budget_effort's thresholds), which
        templates that read `reasoning_effort` (gpt-oss's) take."""
        if self.thinking is None or self.thinking.type == "adaptive":
            return True
        if self.thinking.type == "disabled":
            return False
        return budget_effort(self.thinking.budget_tokens) if self.thinking.budget_tokens is not None else True


class MessagesRequest(CountTokensRequest):
    max_tokens: int = limited("max_tokens", ...)
    stop_sequences: list[str] | None = None
    temperature: float | None = limited("temperature", most=1)
    top_p: float | None = limited("top_p")
    top_k: int | None = limited("top_k")
    stream: bool = False


class Usage(BaseModel):
    input_tokens: int
    output_tokens: int
    cache_read_input_tokens: int = 0  # prompt tokens found in the KV cache
    cache_creation_input_tokens: int = 0


class TextOut(BaseModel):
    type: Literal["text"] = "text"
    text: str


class ThinkingOut(BaseModel):
    type: Literal["thinking"] = "thinking"
    thinking: str
    signature: str = ""  # a local model's thinking is not signed


class ToolUseOut(BaseModel):
    type: Literal["tool_use"] = "tool_use"
    id: str
    name: str
    input: dict


class MessageResponse(BaseModel):
    id: str = Field(default_factory=lambda: f"msg_{uuid.uuid4().hex[:24]}")
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"
    model: str
    content: list[ThinkingOut | TextOut | ToolUseOut]
    stop_reason: Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"] | None = None
    stop_sequence: str | None = None
    usage: Usage


class TokenCount(BaseModel):
    input_tokens: int


class ErrorDetail(BaseModel):
    type: str
    message: str


class ErrorResponse(BaseModel):
    type: Literal["error"] = "error"
    error: ErrorDetail


# Our error kinds (OpenAI's names) as Anthropic names them.
ERROR_TYPES = {"server_busy": "overloaded_error", "server_error": "api_error", "request_too_large": "request_too_large"}


def error_body(message: str, kind: str = "invalid_request_error") -> dict[str, object]:
    return {"type": "error", "error": {"type": ERROR_TYPES.get(kind, kind), "message": message}}
