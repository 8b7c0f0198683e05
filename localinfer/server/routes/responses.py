"""OpenAI's Responses API: `POST /v1/responses`, whole or streamed as its event sequence
(every event with its sequence_number). Stateless unless a request asks `store: true`;
then `previous_response_id` continues it, from a bounded memory of this run's responses."""

from __future__ import annotations

import json
from collections import OrderedDict
from collections.abc import AsyncIterator
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from sse_starlette import ServerSentEvent
from sse_starlette.sse import EventSourceResponse

from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.tools import ToolCall
from localinfer.engine.types import CompletionOutput
from localinfer.errors import ConstraintError
from localinfer.server import deps
from localinfer.server import responses_wire as r
from localinfer.server.bridge import Bridge, Job, Route
from localinfer.server.chat_prompt import ChatPrompt, chat_prompt
from localinfer.server.errors import SAMPLING_ERRORS, ApiError
from localinfer.server.inputs import request_images

router = APIRouter(dependencies=deps.AUTH)
BridgeDep = Annotated[Bridge, Depends(deps.bridge)]
STREAMED = {"text/event-stream": {"schema": {"type": "object", "properties": {"event": {"type": "string"}, "data": {"type": "string"}}}}}


class ResponseLog:
    """The conversations of stored responses, the oldest forgotten past `size`."""

    def __init__(self, size: int = 256) -> None:
        self.size = size
        self._items: OrderedDict[str, list[dict]] = OrderedDict()

    def get(self, rid: str) -> list[dict]:
        if rid not in self._items:
            raise ApiError(404, f"no response '{rid}' is stored here (responses are kept while the server runs, and only with store: true)", "not_found_error", "previous_response_id")
        self._items.move_to_end(rid)
        return self._items[rid]

    def put(self, rid: str, conversation: list[dict]) -> None:
        self._items[rid] = conversation
        while len(self._items) > self.size:
            self._items.popitem(last=False)


def without_images(message: dict) -> dict:
    """A turn as a stored response keeps it: its images' markers gone with the images (a
    follow-up by previous_response_id sends its own)."""
    content = message.get("content")
    return {**message, "content": content.replace(MEDIA_MARKER, "")} if isinstance(content, str) else message


def log_of(request: Request) -> ResponseLog:
    return request.app.state.responses


@router.post("/v1/responses", response_model=r.Response, responses={200: {"content": STREAMED}, **SAMPLING_ERRORS})
async def respond(body: r.ResponseRequest, request: Request, bridge: BridgeDep, log: Annotated[ResponseLog, Depends(log_of)], fetch: deps.Fetch):  # type: ignore[no-untyped-def]
    history = log.get(body.previous_response_id) if body.previous_response_id else []
    images = await request_images(body.images, "input", fetch)
    loaded = await bridge.model(body.model)
    try:
        constraint = body.constraint()
    except ConstraintError as e:
        raise ApiError(400, str(e), param="text.format") from None
    conversation = body.conversation(history)
    prompt = chat_prompt(loaded.engine, conversation, body.tool_list, body.choice(), body.thinks(), images)
    if prompt.plan and prompt.plan.constraint and constraint:
        raise ApiError(400, "text.format and a required tool call cannot both shape the answer", param="text.format")
    params = loaded.engine.defaults.with_overrides(
        temperature=body.temperature, top_p=body.top_p, max_tokens=body.max_output_tokens, reasoning=True,
        constraint=(prompt.plan.constraint if prompt.plan else None) or constraint,
    )  # fmt: skip
    job = bridge.submit(loaded, prompt.tokens, params, Route(request.url.path, "resp", "text.format", "max_output_tokens"), prompt.media)
    shell = r.Response(id=job.rid, model=loaded.engine.name, status="in_progress", **echo(body))
    remember = (lambda out: log.put(job.rid, [without_images(m) for m in conversation if m["role"] != "system"] + [turn(out)])) if body.store else (lambda out: None)
    if body.stream:
        return EventSourceResponse(events(bridge, job, prompt, shell, remember), ping=15)
    (out, _), = await bridge.results(request, [job])
    content, calls = prompt.answer(out.text)
    items: list = [reasoning_item(out.reasoning)] if out.reasoning else []
    items += [message_item(content)] if content or not calls else []
    items += [r.FunctionCallOut(call_id=c.id, name=c.name, arguments=c.arguments) for c in calls]
    remember((content, calls, out.reasoning))
    return finished(shell, out, items)


def echo(body: r.ResponseRequest) -> dict[str, object]:
    """The request's settings a Response repeats back."""
    return {
        "instructions": body.instructions, "max_output_tokens": body.max_output_tokens, "temperature": body.temperature, "top_p": body.top_p,
        "tools": [t.model_dump() for t in body.tools or []], "tool_choice": body.tool_choice.model_dump() if isinstance(body.tool_choice, r.NamedTool) else (body.tool_choice or "auto"),
        "previous_response_id": body.previous_response_id, "store": body.store,
        "text": {"format": body.text.format.model_dump(by_alias=True, exclude_none=True)} if body.text and body.text.format else {"format": {"type": "text"}},
    }  # fmt: skip


def turn(answer: tuple[str, list[ToolCall], str]) -> dict:
    """The answer as the next request's history holds it: an assistant turn (its reasoning
    kept for templates that show it again: gpt-oss's before a call)."""
    content, calls, reasoning = answer
    message: dict = {"role": "assistant", "content": content}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls:
        message["tool_calls"] = [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
    return message


def reasoning_item(text: str) -> r.ReasoningOut:
    return r.ReasoningOut(content=[r.ReasoningText(text=text)])


def message_item(text: str) -> r.MessageOut:
    return r.MessageOut(content=[r.OutputText(text=text)])


def finished(shell: r.Response, out: CompletionOutput, items: list) -> r.Response:
    incomplete = out.finish_reason == "length"
    usage = r.Usage(
        input_tokens=out.prompt_tokens, input_tokens_details=r.InputDetails(cached_tokens=out.cached_tokens),
        output_tokens=out.completion_tokens, output_tokens_details=r.OutputDetails(reasoning_tokens=out.reasoning_tokens),
        total_tokens=out.prompt_tokens + out.completion_tokens,
    )  # fmt: skip
    return shell.model_copy(update={
        "status": "incomplete" if incomplete else "completed", "output": items, "usage": usage,
        "incomplete_details": r.Incomplete(reason="max_output_tokens") if incomplete else None,
    })  # fmt: skip


class Items:
    """The output items of a streamed response and their events, each numbered: a reasoning
    item, then a message, then function calls, each added, given deltas and done in turn."""

    def __init__(self) -> None:
        self.sequence, self.items, self.open = 0, [], None  # open: the item still growing
        self.text = ""

    def event(self, kind: str, **data: object) -> ServerSentEvent:
        data = {"type": kind, "sequence_number": self.sequence, **data}
        self.sequence += 1
        return ServerSentEvent(event=kind, data=json.dumps(data, ensure_ascii=False))

    def _add(self, item) -> list[ServerSentEvent]:  # type: ignore[no-untyped-def]
        out = self.close()
        self.items.append(item)
        self.open, self.text = item, ""
        return [*out, self.event("response.output_item.added", output_index=len(self.items) - 1, item=item.model_dump())]

    def _where(self) -> dict[str, object]:
        return {"item_id": self.open.id, "output_index": len(self.items) - 1}

    def reasoning(self, text: str) -> list[ServerSentEvent]:
        out = [] if isinstance(self.open, r.ReasoningOut) else self._add(r.ReasoningOut())
        self.text += text
        return [*out, self.event("response.reasoning_text.delta", **self._where(), content_index=0, delta=text)]

    def message(self, text: str) -> list[ServerSentEvent]:
        if not text:
            return []
        out = []
        if not isinstance(self.open, r.MessageOut):
            out = [*self._add(r.MessageOut(status="in_progress")), self.event("response.content_part.added", **self._where(), content_index=0, part=r.OutputText(text="").model_dump())]
        self.text += text
        return [*out, self.event("response.output_text.delta", **self._where(), content_index=0, delta=text, logprobs=[])]

    def call(self, call: ToolCall) -> list[ServerSentEvent]:
        out = self._add(r.FunctionCallOut(call_id=call.id, name=call.name, arguments="", status="in_progress"))
        self.text = call.arguments
        return [*out, self.event("response.function_call_arguments.delta", **self._where(), delta=call.arguments), *self.close()]

    def close(self) -> list[ServerSentEvent]:
        item, where = self.open, self._where() if self.open is not None else {}
        if item is None:
            return []
        out = []
        if isinstance(item, r.ReasoningOut):
            item.content = [r.ReasoningText(text=self.text)]
            out.append(self.event("response.reasoning_text.done", **where, content_index=0, text=self.text))
        elif isinstance(item, r.MessageOut):
            item.content, item.status = [r.OutputText(text=self.text)], "completed"
            out += [self.event("response.output_text.done", **where, content_index=0, text=self.text, logprobs=[]),
                    self.event("response.content_part.done", **where, content_index=0, part=item.content[0].model_dump())]  # fmt: skip
        else:
            item.arguments, item.status = self.text, "completed"
            out.append(self.event("response.function_call_arguments.done", **where, name=item.name, arguments=self.text))
        self.open = None
        return [*out, self.event("response.output_item.done", output_index=where["output_index"], item=item.model_dump())]


async def events(bridge: Bridge, job: Job, prompt: ChatPrompt, shell: r.Response, remember) -> AsyncIterator[ServerSentEvent]:  # type: ignore[no-untyped-def]
    """response.created and .in_progress, the items' events, then response.completed (or
    .incomplete at max_output_tokens, .failed if the model fails)."""
    items, calls = Items(), prompt.calls()
    yield items.event("response.created", response=shell.model_dump())
    yield items.event("response.in_progress", response=shell.model_dump())
    answer, found_all = "", []
    async with aclosing(bridge.events(job)) as stream:
        async for item in stream:
            if isinstance(item, CompletionOutput):
                if item.error is not None:
                    failed = shell.model_copy(update={"status": "failed", "error": {"code": "server_error", "message": f"the model failed on this request: {item.error}"}})
                    yield items.event("response.failed", response=failed.model_dump())
                    return
                text, found = calls.finish() if calls else ("", [])
                for piece in (*items.message(text), *(e for c in found for e in items.call(c)), *items.close()):
                    yield piece
                answer, found_all = answer + text, found_all + found
                remember((answer, found_all, item.reasoning))
                done = finished(shell, item, items.items)
                yield items.event("response.incomplete" if done.status == "incomplete" else "response.completed", response=done.model_dump())
                return
            for piece in items.reasoning(item.reasoning) if item.reasoning else []:
                yield piece
            text, found = calls.push(item.text) if calls else (item.text, [])
            answer, found_all = answer + text, found_all + found
            for piece in (*items.message(text), *(e for c in found for e in items.call(c))):
                yield piece
