"""Anthropic's Messages API: `POST /v1/messages` (streamed as Anthropic's event sequence)
and `POST /v1/messages/count_tokens`. Translation only, as every dialect here: the prompt
is chat_prompt's, the sampling the engine's; thinking, text and tool calls come back as
Anthropic's content blocks."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from sse_starlette import ServerSentEvent
from sse_starlette.sse import EventSourceResponse

from localinfer.engine.tools import ToolCall
from localinfer.engine.types import CompletionOutput
from localinfer.server import anthropic_wire as a
from localinfer.server import deps
from localinfer.server.bridge import Bridge, Job, Route
from localinfer.server.chat_prompt import ChatPrompt, chat_prompt
from localinfer.server.fetch import FetchLimits
from localinfer.server.inputs import request_images
from localinfer.server.host import Loaded

router = APIRouter(dependencies=deps.AUTH)
BridgeDep = Annotated[Bridge, Depends(deps.bridge)]
ERRORS = {status: {"model": a.ErrorResponse} for status in (400, 401, 403, 404, 413, 500, 503)}
STREAMED = {"text/event-stream": {"schema": {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}}


async def prompt_for(bridge: Bridge, body: a.CountTokensRequest, fetch: FetchLimits | None) -> tuple[Loaded, ChatPrompt]:
    images = await request_images(body.images, "messages", fetch)
    loaded = await bridge.model(body.model)
    choice = body.tool_choice.openai() if body.tool_choice else "auto"
    return loaded, chat_prompt(loaded.engine, body.conversation(), body.tool_list, choice, body.thinks(), images)


@router.post("/v1/messages/count_tokens", response_model=a.TokenCount, responses=ERRORS)
async def count_tokens(body: a.CountTokensRequest, bridge: BridgeDep, fetch: deps.Fetch) -> a.TokenCount:
    _, prompt = await prompt_for(bridge, body, fetch)
    return a.TokenCount(input_tokens=len(prompt.tokens))


@router.post("/v1/messages", response_model=a.MessageResponse, responses={200: {"content": STREAMED}, **ERRORS})
async def messages(body: a.MessagesRequest, request: Request, bridge: BridgeDep, fetch: deps.Fetch):  # type: ignore[no-untyped-def]
    loaded, prompt = await prompt_for(bridge, body, fetch)
    engine = loaded.engine
    budget = body.thinking.budget_tokens if body.thinking and body.thinking.type == "enabled" else None
    params = engine.defaults.with_overrides(
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, max_tokens=body.max_tokens,
        stop=tuple(s for s in body.stop_sequences or [] if s) or None, think_budget=budget, reasoning=True,
        constraint=prompt.plan.constraint if prompt.plan else None,
    )  # fmt: skip
    job = bridge.submit(loaded, prompt.tokens, params, Route(request.url.path, "msg", "tools"), prompt.media)
    if body.stream:
        return EventSourceResponse(events(bridge, job, prompt), ping=10, ping_message_factory=lambda: event("ping", {}))
    (out, _), = await bridge.results(request, [job])
    content, calls = prompt.answer(out.text)
    blocks: list = [a.ThinkingOut(thinking=out.reasoning)] if out.reasoning else []
    blocks += [a.TextOut(text=content)] if content or not calls else []
    blocks += [a.ToolUseOut(id=c.id, name=c.name, input=arguments(c)) for c in calls]
    return a.MessageResponse(id=job.rid, model=engine.name, content=blocks, stop_reason=stop_reason(out, bool(calls)), stop_sequence=out.stop_sequence, usage=usage(out))


def arguments(call: ToolCall) -> dict:
    value = json.loads(call.arguments or "{}")
    return value if isinstance(value, dict) else {"value": value}


def stop_reason(out: CompletionOutput, called: bool) -> str:
    if out.finish_reason == "length":
        return "max_tokens"
    if called:
        return "tool_use"
    return "stop_sequence" if out.stop_sequence is not None else "end_turn"


def usage(out: CompletionOutput) -> a.Usage:
    return a.Usage(input_tokens=out.prompt_tokens - out.cached_tokens, output_tokens=out.completion_tokens, cache_read_input_tokens=out.cached_tokens)


def event(kind: str, data: dict) -> ServerSentEvent:
    return ServerSentEvent(event=kind, data=json.dumps({"type": kind, **data}, ensure_ascii=False))


class Blocks:
    """The content blocks of a streamed message, opened and closed in order: thinking, then
    text and tool_use blocks as the answer brings them, each with a consecutive index."""

    def __init__(self) -> None:
        self.index, self.open = -1, None  # the open block's kind: "thinking", "text" or None

    def start(self, kind: str, block: dict) -> list[ServerSentEvent]:
        out = self.stop()
        self.index, self.open = self.index + 1, kind
        return [*out, event("content_block_start", {"index": self.index, "content_block": block})]

    def stop(self) -> list[ServerSentEvent]:
        if self.open is None:
            return []
        self.open = None
        return [event("content_block_stop", {"index": self.index})]

    def thinking(self, text: str) -> list[ServerSentEvent]:
        out = [] if self.open == "thinking" else self.start("thinking", {"type": "thinking", "thinking": "", "signature": ""})
        return [*out, event("content_block_delta", {"index": self.index, "delta": {"type": "thinking_delta", "thinking": text}})]

    def text(self, text: str) -> list[ServerSentEvent]:
        if not text:
            return []
        out = [] if self.open == "text" else self.start("text", {"type": "text", "text": ""})
        return [*out, event("content_block_delta", {"index": self.index, "delta": {"type": "text_delta", "text": text}})]

    def call(self, call: ToolCall) -> list[ServerSentEvent]:
        out = self.start("tool_use", {"type": "tool_use", "id": call.id, "name": call.name, "input": {}})
        delta = event("content_block_delta", {"index": self.index, "delta": {"type": "input_json_delta", "partial_json": json.dumps(arguments(call), ensure_ascii=False)}})
        return [*out, delta, *self.stop()]


async def events(bridge: Bridge, job: Job, prompt: ChatPrompt) -> AsyncIterator[ServerSentEvent]:
    """Anthropic's event sequence: message_start, a ping, the content blocks, message_delta
    (stop_reason and usage), message_stop; an error event if the model fails mid-way."""
    start = a.MessageResponse(id=job.rid, model=job.engine.name, content=[], usage=a.Usage(input_tokens=len(prompt.tokens), output_tokens=0))
    yield event("message_start", {"message": start.model_dump()})
    yield event("ping", {})
    blocks, calls = Blocks(), prompt.calls()
    called = False
    async with aclosing(bridge.events(job)) as stream:
        async for item in stream:
            if isinstance(item, CompletionOutput):
                if item.error is not None:
                    yield event("error", {"error": a.error_body(f"the model failed on this request: {item.error}", "server_error")["error"]})
                    return
                text, found = calls.finish() if calls else ("", [])
                for piece in (*blocks.text(text), *(e for c in found for e in blocks.call(c)), *blocks.stop()):
                    yield piece
                called = called or bool(found)
                delta = {"stop_reason": stop_reason(item, called), "stop_sequence": item.stop_sequence}
                yield event("message_delta", {"delta": delta, "usage": usage(item).model_dump()})
                yield event("message_stop", {})
                return
            for piece in blocks.thinking(item.reasoning) if item.reasoning else []:
                yield piece
            text, found = calls.push(item.text) if calls else (item.text, [])
            called = called or bool(found)
            for piece in (*blocks.text(text), *(e for c in found for e in blocks.call(c))):
                yield piece
