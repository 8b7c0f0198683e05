"""OpenAI's Responses API schemas (the subset a local model can honour), and the
translation of its input items into the chat messages the templates and tools read."""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Literal

from pydantic import BaseModel, Field

from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.constraints import Constraint
from localinfer.engine.reasoning import effort_of
from localinfer.engine.tools import Tool
from localinfer.engine.types import Think
from localinfer.images import ImageInput, image_from_url
from localinfer.server.protocol import ChatMessage, Lenient, limited


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


class ContentPart(Lenient):
    type: Literal["input_text", "output_text", "text", "refusal", "input_image"]
    text: str = ""
    image_url: str | None = None  # an input_image's: a data: URL, or a link (fetched under --allow-fetch)


class MessageItem(Lenient):
    type: Literal["message"] = "message"
    role: Literal["user", "system", "developer", "assistant"]
    content: str | list[ContentPart]

    def text(self) -> str:
        """The content's text, MEDIA_MARKER where each input_image stands."""
        if isinstance(self.content, str):
            return self.content
        return "".join(MEDIA_MARKER if part.type == "input_image" else part.text for part in self.content)

    def image_urls(self) -> list[str]:
        return [part.image_url or "" for part in self.content if part.type == "input_image"] if isinstance(self.content, list) else []


class FunctionCallItem(Lenient):
    type: Literal["function_call"]
    call_id: str
    name: str
    arguments: str = "{}"


class FunctionCallOutputItem(Lenient):
    type: Literal["function_call_output"]
    call_id: str
    output: str


class ReasoningPart(Lenient):
    type: str = "reasoning_text"
    text: str = ""


class ReasoningItem(Lenient):
    type: Literal["reasoning"]  # earlier thinking sent back: the next assistant turn's, where its template shows it (gpt-oss before a call)
    content: list[ReasoningPart] | None = None

    def text(self) -> str:
        return "".join(part.text for part in self.content or [])


InputItem = Annotated[FunctionCallItem | FunctionCallOutputItem | ReasoningItem, Field(discriminator="type")] | MessageItem


class FunctionTool(Lenient):
    type: Literal["function"]
    name: str
    description: str | None = None
    parameters: dict | None = None
    strict: bool | None = None


class NamedTool(Lenient):
    type: Literal["function"]
    name: str


class TextFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"] = "text"
    name: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None


class TextConfig(Lenient):
    format: TextFormat | None = None


class Reasoning(Lenient):
    effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    summary: str | None = None


class ResponseRequest(Lenient):
    model: str | None = None
    input: str | list[InputItem]
    instructions: str | None = None
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedTool | None = None
    text: TextConfig | None = None
    max_output_tokens: int | None = limited("max_tokens")
    temperature: float | None = limited("temperature", most=2)
    top_p: float | None = limited("top_p")
    reasoning: Reasoning | None = None
    stream: bool = False
    store: bool = False  # stateless unless asked: kept (in memory, bounded) for previous_response_id
    previous_response_id: str | None = None
    parallel_tool_calls: bool | None = None  # taken, not honoured: a model writes as many calls as it writes

    def conversation(self, history: list[dict]) -> list[dict]:
        """The input in OpenAI chat's shape after `history` (a stored response's turns):
        instructions as the system prompt (never carried over from an earlier response); a
        run of function calls becomes one assistant turn's tool_calls, an output a "tool" message."""
        out: list[dict] = [{"role": "system", "content": self.instructions}] if self.instructions else []
        out += history
        items = [MessageItem(role="user", content=self.input)] if isinstance(self.input, str) else self.input
        thought = None  # a reasoning item's text, for the assistant turn that follows it
        for item in items:
            if isinstance(item, ReasoningItem):
                thought = (thought or "") + item.text() or None
            elif isinstance(item, MessageItem):
                out.append(ChatMessage(role=item.role, content=item.text(), reasoning_content=thought if item.role == "assistant" else None).for_template())
                thought = None
            elif isinstance(item, FunctionCallItem):
                call = {"id": item.call_id, "type": "function", "function": {"name": item.name, "arguments": item.arguments}}
                if out and out[-1]["role"] == "assistant" and not out[-1]["content"]:
                    out[-1].setdefault("tool_calls", []).append(call)
                else:
                    out.append({"role": "assistant", "content": "", "tool_calls": [call], **({"reasoning_content": thought} if thought else {})})
                thought = None
            elif isinstance(item, FunctionCallOutputItem):
                out.append({"role": "tool", "tool_call_id": item.call_id, "content": item.output})
        return out

    def tool_list(self) -> list[Tool]:
        return [Tool(t.name, t.parameters or {"type": "object", "properties": {}}, t.description or "") for t in self.tools or []]

    def images(self) -> list[ImageInput]:
        """The input's images (bytes or links), in order (UserError names a bad one). An earlier response's
        turns carry none: their images are not kept."""
        urls = [url for item in self.input if isinstance(item, MessageItem) for url in item.image_urls()] if isinstance(self.input, list) else []
        return [image_from_url(url, f"image {i + 1}") for i, url in enumerate(urls)]

    def choice(self) -> str:
        return self.tool_choice.name if isinstance(self.tool_choice, NamedTool) else (self.tool_choice or "auto")

    def constraint(self) -> Constraint | None:
        fmt = self.text.format if self.text and self.text.format else None
        if fmt is None or fmt.type == "text":
            return None
        if fmt.type == "json_object":
            return Constraint("json_object")
        return Constraint.json_schema(fmt.schema_ or {})

    def thinks(self) -> Think:
        """reasoning.effort: "none" off, an effort that hard (templates that read one), else on."""
        return effort_of(self.reasoning.effort if self.reasoning else None)


class OutputText(BaseModel):
    type: Literal["output_text"] = "output_text"
    text: str
    annotations: list = Field(default_factory=list)
    logprobs: list = Field(default_factory=list)


class ReasoningText(BaseModel):
    type: Literal["reasoning_text"] = "reasoning_text"
    text: str


class MessageOut(BaseModel):
    type: Literal["message"] = "message"
    id: str = Field(default_factory=lambda: new_id("msg"))
    status: Literal["in_progress", "completed", "incomplete"] = "completed"
    role: Literal["assistant"] = "assistant"
    content: list[OutputText] = Field(default_factory=list)


class ReasoningOut(BaseModel):
    type: Literal["reasoning"] = "reasoning"
    id: str = Field(default_factory=lambda: new_id("rs"))
    summary: list = Field(default_factory=list)
    content: list[ReasoningText] = Field(default_factory=list)


class FunctionCallOut(BaseModel):
    type: Literal["function_call"] = "function_call"
    id: str = Field(default_factory=lambda: new_id("fc"))
    call_id: str
    name: str
    arguments: str
    status: Literal["in_progress", "completed"] = "completed"


class InputDetails(BaseModel):
    cached_tokens: int = 0


class OutputDetails(BaseModel):
    reasoning_tokens: int = 0


class Usage(BaseModel):
    input_tokens: int
    input_tokens_details: InputDetails
    output_tokens: int
    output_tokens_details: OutputDetails
    total_tokens: int


class Incomplete(BaseModel):
    reason: Literal["max_output_tokens", "content_filter"]


class Response(BaseModel):
    id: str = Field(default_factory=lambda: new_id("resp"))
    object: Literal["response"] = "response"
    created_at: int = Field(default_factory=lambda: int(time.time()))
    status: Literal["in_progress", "completed", "incomplete", "failed"] = "completed"
    model: str
    output: list[ReasoningOut | MessageOut | FunctionCallOut] = Field(default_factory=list)
    incomplete_details: Incomplete | None = None
    error: dict | None = None
    instructions: str | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    tools: list[dict] = Field(default_factory=list)
    tool_choice: str | dict = "auto"
    parallel_tool_calls: bool = True
    previous_response_id: str | None = None
    store: bool = False
    text: dict = Field(default_factory=lambda: {"format": {"type": "text"}})
    metadata: dict = Field(default_factory=dict)
    usage: Usage | None = None
