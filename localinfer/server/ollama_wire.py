"""Ollama's API schemas, by its field names: chat and generate with `options`, `format`,
`think`, `keep_alive` and `stream` (default true: newline-delimited JSON), embed, and the
model store's tags, show, ps, pull and delete. Its errors are `{"error": "..."}`."""

from __future__ import annotations

import json
from typing import Literal

from pydantic import Field

from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.constraints import Constraint
from localinfer.engine.types import MAX_COUNT, Think
from localinfer.engine.tools import Tool
from localinfer.errors import ConstraintError
from localinfer.images import image_from_base64
from localinfer.server.protocol import ChatMessage, Lenient, count, limited


class Options(Lenient):
    """The sampling options Ollama's Modelfile PARAMETERs name. num_ctx is taken but cannot
    resize a loaded model's context (serve --ctx sets it); the answer still fits it."""

    num_ctx: int | None = count(low=1)
    num_predict: int | None = Field(default=None, ge=-2, le=MAX_COUNT)  # -1: until the end; -2: until the context is full
    temperature: float | None = limited("temperature")
    top_k: int | None = limited("top_k")
    top_p: float | None = limited("top_p")
    min_p: float | None = limited("min_p")
    repeat_penalty: float | None = limited("repeat_penalty")
    repeat_last_n: int | None = limited("repeat_last_n")
    presence_penalty: float | None = limited("presence_penalty")
    frequency_penalty: float | None = limited("frequency_penalty")
    seed: int | None = limited("seed")
    stop: list[str] | str | None = None

    def sampling(self) -> dict[str, object]:
        """These options as SamplingParams overrides."""
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return {
            "temperature": self.temperature, "top_k": self.top_k, "top_p": self.top_p, "min_p": self.min_p,
            "repeat_penalty": self.repeat_penalty, "presence_penalty": self.presence_penalty or None,
            "frequency_penalty": self.frequency_penalty or None, "seed": self.seed if self.seed is not None and self.seed >= 0 else None,
            "max_tokens": self.num_predict if self.num_predict is not None and self.num_predict > 0 else None,
            "stop": tuple(s for s in stops if s) or None,
        }  # fmt: skip


class Generating(Lenient):
    model: str = Field(min_length=1)
    format: Literal["json"] | dict | None = None
    options: Options | None = None
    stream: bool = True
    think: bool | Literal["low", "medium", "high"] | None = None
    keep_alive: float | str | None = None  # how long the model stays loaded once idle; 0: unload it now

    def constraint(self) -> Constraint | None:
        if self.format == "json":
            return Constraint("json_object")
        return Constraint.json_schema(self.format) if isinstance(self.format, dict) else None

    def thinks(self) -> Think:
        """Ollama's think: false off, "low"/"medium"/"high" that hard (its levels for gpt-oss), else on."""
        return self.think if self.think is not None else True

    def sampling(self) -> dict[str, object]:
        return (self.options or Options()).sampling()


class FunctionCall(Lenient):
    name: str
    arguments: dict | str = Field(default_factory=dict)


class ToolCall(Lenient):
    function: FunctionCall


class Message(Lenient):
    role: Literal["system", "user", "assistant", "tool"]
    content: str = ""
    thinking: str | None = None
    images: list[str] | None = None
    tool_calls: list[ToolCall] | None = None
    tool_name: str | None = None


class FunctionSpec(Lenient):
    name: str
    description: str = ""
    parameters: dict | None = None


class ToolSpec(Lenient):
    type: Literal["function"] = "function"
    function: FunctionSpec


class ChatRequest(Generating):
    messages: list[Message] = Field(default_factory=list)
    tools: list[ToolSpec] | None = None

    def conversation(self) -> list[dict]:
        """The messages in OpenAI chat's shape: an assistant's calls get ids, and each tool
        message answers the oldest call not yet answered."""
        out, pending, n = [], [], 0
        for m in self.messages:
            calls = []
            for call in m.tool_calls or []:
                arguments = call.function.arguments if isinstance(call.function.arguments, str) else json.dumps(call.function.arguments, ensure_ascii=False)
                calls.append({"id": f"call_{n}", "type": "function", "function": {"name": call.function.name, "arguments": arguments}})
                pending.append(f"call_{n}")
                n += 1
            answers = pending.pop(0) if m.role == "tool" and pending else None
            content = MEDIA_MARKER * len(m.images or ()) + m.content  # a message's images stand before its text
            out.append(ChatMessage(role=m.role, content=content, tool_calls=calls or None, tool_call_id=answers, reasoning_content=m.thinking).for_template())
        return out

    def images(self) -> list[bytes]:
        """Every message's images, in order (UserError names a bad one)."""
        listed = [text for m in self.messages for text in m.images or ()]
        return [image_from_base64(text, f"image {i + 1}") for i, text in enumerate(listed)]

    def tool_list(self) -> list[Tool]:
        return [Tool(t.function.name, t.function.parameters or {"type": "object", "properties": {}}, t.function.description) for t in self.tools or []]


class GenerateRequest(Generating):
    prompt: str = ""
    system: str | None = None
    raw: bool = False
    images: list[str] | None = None

    def image_bytes(self) -> list[bytes]:
        """The images, in order (UserError names a bad one)."""
        return [image_from_base64(text, f"image {i + 1}") for i, text in enumerate(self.images or ())]


class EmbedRequest(Lenient):
    model: str = Field(min_length=1)
    input: str | list[str] = Field(min_length=1)
    truncate: bool = True  # cut an input longer than the model takes, instead of a 400
    dimensions: int | None = count(low=1)  # a Matryoshka model's vectors cut shorter
    keep_alive: float | str | None = None


class EmbeddingsRequest(Lenient):
    """The older /api/embeddings: one prompt."""

    model: str = Field(min_length=1)
    prompt: str = Field(min_length=1)


class ModelRequest(Lenient):
    model: str | None = None
    name: str | None = None  # older clients' field
    stream: bool = True

    def which(self) -> str:
        if not (self.model or self.name):
            raise ConstraintError("model is required")
        return self.model or self.name or ""
