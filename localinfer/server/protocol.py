"""OpenAI's request and response schemas, as pydantic models (the subset we serve).

Requests accept fields we do not know (clients send `user`, `metadata`, ...) and ignore
them; fields we know are checked for type and range, and a bad one is a 400 that names it.
Every float must be finite (JSON's 1e999 reads as infinity), and every sampling field of
every dialect takes its range from the engine's one table (`limited`).
Requests with fields we cannot honour get a 400 that says so, rather than silently
ignoring them.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import AliasChoices, BaseModel, ConfigDict, Field, SerializerFunctionWrapHandler, model_serializer

from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.constraints import Constraint
from localinfer.engine.reasoning import CLOSE, effort_of
from localinfer.engine.tools import Tool
from localinfer.engine.types import MAX_COUNT, SAMPLING, Think
from localinfer.errors import ConstraintError
from localinfer.images import ImageInput, image_from_url


class Lenient(BaseModel):
    """A request's part: unknown fields ignored, no float infinite or NaN."""

    model_config = ConfigDict(extra="ignore", allow_inf_nan=False)


def limited(name: str, default: Any = None, *, most: float | None = None, **more: Any) -> Any:
    """A field that takes what the engine's table (engine/types.py SAMPLING) allows for the
    sampling value `name`; `most` narrows its top where a dialect does (OpenAI's temperature: 2)."""
    bounds = SAMPLING[name]
    high = most if bounds.high is None else bounds.high if most is None else min(bounds.high, most)
    return Field(default=default, ge=bounds.low, le=high, **more)


def count(default: Any = None, low: int = 0) -> Any:
    """A field that counts tokens (or chunks, or dimensions): from `low` to MAX_COUNT."""
    return Field(default=default, ge=low, le=MAX_COUNT)


class TextPart(Lenient):
    type: Literal["text"]
    text: str


class ImageUrl(Lenient):
    url: str  # a data: URL (data:image/png;base64,...); http(s) ones are refused (not fetched)
    detail: str | None = None  # OpenAI's low/high/auto: the projector decides the resolution here


class ImagePart(Lenient):
    type: Literal["image_url"]
    image_url: ImageUrl


class FunctionCall(Lenient):
    name: str
    arguments: str  # JSON text


class MessageToolCall(Lenient):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(Lenient):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart | ImagePart] | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: str | None = None  # a tool's result: the call it answers
    reasoning_content: str | None = None  # an assistant's earlier thinking: the template decides whether it is shown

    def text(self) -> str:
        """The content's text, MEDIA_MARKER where each image stands."""
        if isinstance(self.content, list):
            return "".join(part.text if isinstance(part, TextPart) else MEDIA_MARKER for part in self.content)
        return self.content or ""

    def image_urls(self) -> list[str]:
        return [part.image_url.url for part in self.content if isinstance(part, ImagePart)] if isinstance(self.content, list) else []

    def for_template(self) -> dict[str, object]:
        content = self.text()
        if self.role == "assistant" and CLOSE in content:  # thinking sent back inside the answer: not the model's to read again
            content = content.split(CLOSE)[-1].lstrip()
        message: dict[str, object] = {"role": "system" if self.role == "developer" else self.role, "content": content}
        if self.reasoning_content is not None:
            message["reasoning_content"] = self.reasoning_content
        if self.tool_calls:
            message["tool_calls"] = [c.model_dump() for c in self.tool_calls]
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        return message


class FunctionSpec(Lenient):
    name: str
    description: str = ""
    parameters: dict | None = None


class ToolSpec(Lenient):
    type: Literal["function"]
    function: FunctionSpec


class NamedFunction(Lenient):
    name: str


class NamedToolChoice(Lenient):
    type: Literal["function"]
    function: NamedFunction


class StreamOptions(Lenient):
    include_usage: bool = False


class JsonSchemaFormat(Lenient):
    name: str = "response"
    description: str | None = None
    schema_: dict | None = Field(default=None, alias="schema")
    strict: bool | None = None  # the schema is always enforced, strict or not


class ResponseFormat(Lenient):
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class SamplingFields(Lenient):
    """What both completion endpoints take, with OpenAI's ranges, plus our extensions."""

    model: str | None = None
    max_tokens: int | None = limited("max_tokens")
    max_completion_tokens: int | None = limited("max_tokens")
    temperature: float | None = limited("temperature", most=2)
    top_p: float | None = limited("top_p")
    seed: int | None = limited("seed")
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None
    n: int = Field(default=1, ge=1, le=16)
    presence_penalty: float = limited("presence_penalty", 0.0)
    frequency_penalty: float = limited("frequency_penalty", 0.0)
    top_k: int | None = limited("top_k")  # extensions, as llama-server takes them
    min_p: float | None = limited("min_p")
    repeat_penalty: float | None = limited("repeat_penalty")
    ignore_eos: bool | None = None  # as llama-server and vLLM take it: for load generators
    response_format: ResponseFormat | None = None
    grammar: str | None = None  # extensions: a GBNF (or Lark) grammar, as llama-server takes it, or a regex
    regex: str | None = None
    # extension: most tokens drafted a step for this request, 0 for none (llama-server's speculative.n_max)
    draft_max: int | None = Field(default=None, ge=0, le=32, validation_alias=AliasChoices("draft_max", "speculative.n_max"))

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        return tuple(s for s in stops if s)

    def constraint(self) -> tuple[Constraint | None, str | None]:
        """The structured output asked for, and the field that asked (for a 400's `param`)."""
        fmt = self.response_format if self.response_format is not None and self.response_format.type != "text" else None
        given = [name for name, value in (("response_format", fmt), ("grammar", self.grammar), ("regex", self.regex)) if value is not None]
        if len(given) > 1:
            raise ConstraintError(f"give one of {', '.join(given)}, not several")
        if fmt is not None and fmt.type == "json_object":
            return Constraint("json_object"), "response_format"
        if fmt is not None:
            if fmt.json_schema is None or fmt.json_schema.schema_ is None:
                raise ConstraintError("response_format json_schema needs json_schema.schema")
            return Constraint.json_schema(fmt.json_schema.schema_), "response_format"
        if self.grammar is not None:
            return Constraint("grammar", self.grammar), "grammar"
        if self.regex is not None:
            return Constraint("regex", self.regex), "regex"
        return None, None


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage] = Field(min_length=1)
    logprobs: bool = False
    top_logprobs: int | None = Field(default=None, ge=0, le=20)
    tools: list[ToolSpec] | None = None
    tool_choice: Literal["auto", "none", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None  # taken, not honoured: a model writes as many calls as it writes
    # Reasoning models: think first (default) or not, as OpenAI's reasoning_effort ("none": not;
    # low, medium or high: that hard, for templates that read reasoning_effort, as gpt-oss's),
    # llama-server's and vLLM's chat_template_kwargs (enable_thinking, reasoning_effort), or
    # Ollama's think say it; and a budget of thinking tokens, after which the engine closes the block itself.
    reasoning_effort: Literal["none", "minimal", "low", "medium", "high"] | None = None
    chat_template_kwargs: dict[str, object] | None = None
    think: bool | None = None
    thinking_budget_tokens: int | None = count()

    def thinking(self) -> Think:
        """Whether, or how hard, a reasoning model should think before it answers (the first
        of the fields given)."""
        if self.think is not None:
            return self.think
        kwargs = self.chat_template_kwargs or {}
        if isinstance(kwargs.get("enable_thinking"), bool):
            return bool(kwargs["enable_thinking"])
        if self.thinking_budget_tokens == 0:
            return False
        asked = self.reasoning_effort if self.reasoning_effort is not None else kwargs.get("reasoning_effort")
        return effort_of(asked if isinstance(asked, str) else None)

    def tool_list(self) -> list[Tool]:
        """The tools, checked (ConstraintError names the bad one)."""
        return [Tool(t.function.name, t.function.parameters or {"type": "object", "properties": {}}, t.function.description) for t in self.tools or []]

    def logprob_count(self) -> int | None:
        return (self.top_logprobs or 0) if self.logprobs else None

    def images(self) -> list[ImageInput]:
        """Every image_url part's bytes (or link), in message order (UserError names a bad one)."""
        urls = [url for m in self.messages for url in m.image_urls()]
        return [image_from_url(url, f"image {i + 1}") for i, url in enumerate(urls)]


class CompletionRequest(SamplingFields):
    prompt: str | list[str]
    logprobs: int | None = Field(default=None, ge=0, le=5)

    def logprob_count(self) -> int | None:
        return self.logprobs


class TopLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int]


class TokenLogprob(TopLogprob):
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob]


class CompletionLogprobs(BaseModel):
    """The legacy completions endpoint's shape."""

    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]]
    text_offset: list[int]


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: dict[str, int] | None = None
    completion_tokens_details: dict[str, int] | None = None  # reasoning_tokens, as OpenAI reports them


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[MessageToolCall] | None = None
    reasoning_content: str | None = None  # a reasoning model's thinking, as llama-server and DeepSeek name it


class ChatChoice(BaseModel):
    index: int = 0
    message: ResponseMessage
    finish_reason: str | None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletion(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChatChoice]
    usage: Usage


class DeltaToolCall(BaseModel):
    """A whole call in one chunk: its id, name and all its arguments (OpenAI may split the
    arguments over chunks; clients join them by index either way)."""

    index: int
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class Delta(BaseModel):
    """As OpenAI sends it: a field a chunk does not carry is left out, not null (the role
    comes once, the last chunk's delta is {}), which stricter clients than the SDK expect."""

    role: Literal["assistant"] | None = None
    content: str | None = None
    reasoning_content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None

    @model_serializer(mode="wrap")
    def _leave_out_none(self, handler: SerializerFunctionWrapHandler) -> dict:
        return {k: v for k, v in handler(self).items() if v is not None}


class ChunkChoice(BaseModel):
    index: int = 0
    delta: Delta
    finish_reason: str | None = None
    logprobs: ChoiceLogprobs | None = None


class ChatCompletionChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None


class TextChoice(BaseModel):
    index: int = 0
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None


class Completion(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[TextChoice]
    usage: Usage | None = None


class EmbeddingRequest(Lenient):
    model: str | None = None
    input: str | list[str] | list[int] | list[list[int]]
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: int | None = count(low=1)


class Embedding(BaseModel):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32


class EmbeddingUsage(BaseModel):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(BaseModel):
    object: Literal["list"] = "list"
    data: list[Embedding]
    model: str
    usage: EmbeddingUsage


class RerankDocument(Lenient):
    text: str


class RerankRequest(Lenient):
    """llama-server's, Jina's and Cohere's rerank request."""

    model: str | None = None
    query: str
    documents: list[str | RerankDocument]
    top_n: int | None = count()  # the best n results only; None: all (0 or past the documents: a 400 that says so)
    return_documents: bool = False


class RerankResult(BaseModel):
    index: int  # the document's place in the request
    relevance_score: float  # the reranker's score: higher is more relevant (its raw logit, as llama-server gives it)
    document: RerankDocument | None = None


class RerankList(BaseModel):
    id: str
    object: Literal["list"] = "list"
    model: str
    results: list[RerankResult]  # best first
    usage: EmbeddingUsage


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int = 0
    owned_by: str = "localinfer"
    engine: str | None = None  # a loaded model's engine (llama.cpp or native); None: not loaded
    engine_reason: str | None = None  # why --engine chose it
    kind: Literal["chat", "embedding", "rerank"] | None = None  # what a loaded model answers; None: not loaded


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:24]}"


class ErrorDetail(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorResponse(BaseModel):
    """OpenAI's error body, the only one this server sends."""

    error: ErrorDetail


class Health(BaseModel):
    status: Literal["ok", "loading", "error"]
    error: str | None = None


def error_body(message: str, kind: str = "invalid_request_error", param: str | None = None, code: str | None = None) -> dict[str, object]:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}
