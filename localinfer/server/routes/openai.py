"""OpenAI's dialect: chat and text completions (streamed as server-sent events), embeddings
and the model list. Translation only: a body becomes tokens and SamplingParams, events
become chunks; templates, tools, constraints and reasoning are the engine's."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from sse_starlette.sse import EventSourceResponse

from localinfer.engine.constraints import Constraint
from localinfer.engine.embedding import encode_base64, finish
from localinfer.engine.engine import Engine
from localinfer.engine.types import CompletionOutput, SamplingParams, TokenEvent
from localinfer.errors import ConstraintError
from localinfer.server import deps
from localinfer.server import protocol as p
from localinfer.server.bridge import Bridge, Job, Route
from localinfer.server.chat_prompt import ChatPrompt, chat_prompt
from localinfer.server.errors import SAMPLING_ERRORS, ApiError, errors
from localinfer.server.host import ModelHost
from localinfer.server.inputs import check_dimensions, input_tokens, request_images
from localinfer.server.openai_wire import chat_logprobs, completion_logprobs, model_card, usage, wire_call
from localinfer.store.inventory import local_names

router = APIRouter(dependencies=deps.AUTH)
BridgeDep = Annotated[Bridge, Depends(deps.bridge)]
STREAMED = {"text/event-stream": {"schema": {  # one server-sent event
    "type": "object", "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string", "description": "A JSON chunk (ChatCompletionChunk or Completion), or [DONE]"}},
}}}  # fmt: skip


@router.get("/v1/models", response_model=p.ModelList, responses=errors(401))
async def models(host: Annotated[ModelHost, Depends(deps.host)]) -> p.ModelList:
    names = list(dict.fromkeys([*host.models, *local_names()]))
    return p.ModelList(data=[model_card(name, host.models.get(name)) for name in names])


@router.post("/v1/chat/completions", response_model=p.ChatCompletion, responses={200: {"content": STREAMED}, **SAMPLING_ERRORS})
async def chat(body: p.ChatCompletionRequest, request: Request, bridge: BridgeDep, fetch: deps.Fetch):  # type: ignore[no-untyped-def]
    if body.top_logprobs is not None and not body.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
    images = await request_images(body.images, "messages", fetch)
    loaded = await bridge.model(body.model, body.n)
    engine = loaded.engine
    choice = body.tool_choice.function.name if isinstance(body.tool_choice, p.NamedToolChoice) else (body.tool_choice or "auto")
    prompt = chat_prompt(engine, [m.for_template() for m in body.messages], body.tool_list, choice, body.thinking(), images)
    plan, tokens = prompt.plan, prompt.tokens
    params, field = sampling(engine, body, plan.constraint if plan else None)
    jobs = await bridge.start(loaded, tokens, params, Route(request.url.path, "chatcmpl", field), prompt.media)
    if body.stream:
        return EventSourceResponse(chat_chunks(bridge, jobs, body, prompt), ping=15)
    results = await bridge.results(request, jobs)
    choices = []
    for i, (out, events) in enumerate(results):
        content, calls = prompt.answer(out.text)
        choices.append(p.ChatChoice(
            index=i, message=p.ResponseMessage(content=(content or None) if calls else content, tool_calls=[wire_call(c) for c in calls] or None,
                                               reasoning_content=out.reasoning or None),
            finish_reason="tool_calls" if calls and out.finish_reason == "stop" else out.finish_reason,
            logprobs=chat_logprobs(engine, events) if body.logprobs else None,
        ))  # fmt: skip
    return p.ChatCompletion(id=jobs[0].rid, model=engine.name, usage=usage(*(out for out, _ in results)), choices=choices)


@router.post("/v1/completions", response_model=p.Completion, responses={200: {"content": STREAMED}, **SAMPLING_ERRORS})
async def complete(body: p.CompletionRequest, request: Request, bridge: BridgeDep):  # type: ignore[no-untyped-def]
    prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
    if len(prompts) != 1:
        raise ApiError(400, "prompt must be one string (a list of several is not supported yet)", param="prompt")
    loaded = await bridge.model(body.model, body.n)
    params, field = sampling(loaded.engine, body)
    jobs = await bridge.start(loaded, loaded.engine.tokenize_prompt(prompts[0]), params, Route(request.url.path, "cmpl", field))
    if body.stream:
        return EventSourceResponse(text_chunks(bridge, jobs, body), ping=15)
    results = await bridge.results(request, jobs)
    choices = [
        p.TextChoice(index=i, text=out.text, finish_reason=out.finish_reason,
                     logprobs=completion_logprobs(loaded.engine, events) if body.logprobs is not None else None)
        for i, (out, events) in enumerate(results)
    ]  # fmt: skip
    return p.Completion(id=jobs[0].rid, model=loaded.engine.name, usage=usage(*(out for out, _ in results)), choices=choices)


@router.post("/v1/embeddings", response_model=p.EmbeddingList, responses=errors(400, 401, 403, 404))
async def embeddings(body: p.EmbeddingRequest, request: Request, bridge: BridgeDep) -> p.EmbeddingList:
    loaded = await bridge.model(body.model)
    engine = loaded.engine
    inputs: list = [body.input] if isinstance(body.input, str) or (body.input and isinstance(body.input[0], int)) else list(body.input)
    check_dimensions(engine, body.dimensions)
    tokens = input_tokens(engine, inputs)
    vectors = finish(await bridge.embed(loaded, tokens), body.dimensions)
    used = sum(len(t) for t in tokens)
    bridge.count_embedding(request.url.path, used)
    data = [p.Embedding(index=i, embedding=encode_base64(v) if body.encoding_format == "base64" else v.tolist()) for i, v in enumerate(vectors)]
    return p.EmbeddingList(data=data, model=engine.name, usage=p.EmbeddingUsage(prompt_tokens=used, total_tokens=used))




def sampling(engine: Engine, body: p.SamplingFields, tool_constraint: Constraint | None = None) -> tuple[list[SamplingParams], str | None]:
    """A SamplingParams per choice (n of them: the seed steps by one), and the field a
    constraint error names."""
    try:
        constraint, field = body.constraint()
    except ConstraintError as e:
        raise ApiError(400, str(e), param="response_format") from None
    if tool_constraint is not None:
        if constraint is not None:
            raise ApiError(400, f"{field} and a required tool call cannot both shape the answer", param=field)
        constraint, field = tool_constraint, "tools"
    params = engine.defaults.with_overrides(
        temperature=body.temperature, top_p=body.top_p, top_k=body.top_k, min_p=body.min_p,
        repeat_penalty=body.repeat_penalty, max_tokens=body.max_completion_tokens or body.max_tokens, stop=body.stops() or None,
        logprobs=body.logprob_count(),  # type: ignore[attr-defined]
        presence_penalty=body.presence_penalty or None, frequency_penalty=body.frequency_penalty or None,
        constraint=constraint, ignore_eos=body.ignore_eos, draft_max=body.draft_max, think_budget=getattr(body, "thinking_budget_tokens", None),
        reasoning=isinstance(body, p.ChatCompletionRequest),  # a text completion is the model's raw text
    )  # fmt: skip
    seeded = body.seed is not None and body.seed >= 0
    return [params.with_overrides(seed=body.seed + i if seeded else None) for i in range(body.n)], field


Make = Callable[[int, "str | None", "str | None", "p.Usage | None", "TokenEvent | None"], list]  # (index, text, finish, usage, event) -> chunks


async def sse(bridge: Bridge, jobs: list[Job], body: p.SamplingFields, make: Make, first: list[str] | None = None) -> AsyncIterator[str]:
    """SSE data for the choices of one request, interleaved as their tokens come: `make`
    builds each choice's chunks; then the usage chunk if asked for, and [DONE]."""
    outs: list[CompletionOutput] = []
    for data in first or []:
        yield data
    async with aclosing(bridge.merged(jobs)) as events:
        async for index, event in events:
            if isinstance(event, CompletionOutput):
                outs.append(event)
                if event.error is not None:  # the choice ends with finish_reason "error", then why
                    for chunk in make(index, None, "error", None, None):
                        yield chunk.model_dump_json()
                    yield json.dumps(p.error_body(f"the model failed on this request: {event.error}", "server_error"))
                    break
                for chunk in make(index, None, event.finish_reason, None, None):
                    yield chunk.model_dump_json()
            elif event.text or event.reasoning or event.logprob is not None:
                for chunk in make(index, event.text, None, None, event):
                    yield chunk.model_dump_json()
        else:
            if body.stream_options and body.stream_options.include_usage:
                for chunk in make(0, None, None, usage(*outs), None):
                    yield chunk.model_dump_json()
    yield "[DONE]"


def chat_chunks(bridge: Bridge, jobs: list[Job], body: p.SamplingFields, prompt: ChatPrompt) -> AsyncIterator[str]:
    engine, rid = jobs[0].engine, jobs[0].rid
    calls = [prompt.calls() for _ in jobs]  # per choice: text with its calls held back
    n_calls = [0] * len(jobs)

    def chunk(index: int, delta: p.Delta, finish: str | None = None, logprobs: p.ChoiceLogprobs | None = None) -> p.ChatCompletionChunk:
        return p.ChatCompletionChunk(id=rid, model=engine.name, choices=[p.ChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)])

    def make(index: int, text: str | None, finish: str | None, use: p.Usage | None, event: TokenEvent | None) -> list[p.ChatCompletionChunk]:
        if use is not None:
            return [p.ChatCompletionChunk(id=rid, model=engine.name, choices=[], usage=use)]
        logprobs = chat_logprobs(engine, [event]) if event is not None and event.logprob is not None else None
        thought = [chunk(index, p.Delta(reasoning_content=event.reasoning))] if event is not None and event.reasoning else []
        stream = calls[index]
        if stream is None:
            return thought + ([chunk(index, p.Delta(content=text), finish, logprobs)] if text or logprobs or finish else [])
        content, found = stream.finish() if finish is not None else stream.push(text or "")
        out = thought + ([chunk(index, p.Delta(content=content), logprobs=logprobs)] if content or logprobs else [])
        for call in found:
            out.append(chunk(index, p.Delta(tool_calls=[p.DeltaToolCall(index=n_calls[index], id=call.id, function=p.FunctionCall(name=call.name, arguments=call.arguments))])))
            n_calls[index] += 1
        if finish is not None:
            out.append(chunk(index, p.Delta(), "tool_calls" if n_calls[index] and finish == "stop" else finish))
        return out

    roles = [chunk(i, p.Delta(role="assistant", content="")).model_dump_json() for i in range(len(jobs))]
    return sse(bridge, jobs, body, make, roles)


def text_chunks(bridge: Bridge, jobs: list[Job], body: p.SamplingFields) -> AsyncIterator[str]:
    engine, rid = jobs[0].engine, jobs[0].rid

    def make(index: int, text: str | None, finish: str | None, use: p.Usage | None, event: TokenEvent | None) -> list[p.Completion]:
        logprobs = completion_logprobs(engine, [event]) if event is not None and event.logprob is not None else None
        choices = [] if use is not None else [p.TextChoice(index=index, text=text or "", finish_reason=finish, logprobs=logprobs)]
        return [p.Completion(id=rid, model=engine.name, choices=choices, usage=use)]

    return sse(bridge, jobs, body, make)
