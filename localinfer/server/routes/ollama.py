"""Ollama's API under /api: chat and generate (newline-delimited JSON unless `stream:
false`, with Ollama's timings in nanoseconds), embed and version; its model-store routes
are in ollama_models.py. Translation only: prompts are chat_prompt's, sampling the engine's."""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import aclosing
from datetime import datetime, timezone
from typing import Annotated

from fastapi import APIRouter, Depends, Request
from fastapi.responses import StreamingResponse

from localinfer import __version__
from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.embedding import finish
from localinfer.engine.engine import Engine
from localinfer.engine.tools import ToolCall
from localinfer.engine.types import CompletionOutput, SamplingParams
from localinfer.errors import ConstraintError, UserError
from localinfer.server import deps
from localinfer.server import ollama_wire as o
from localinfer.server.bridge import Bridge, Job, Route
from localinfer.server.chat_prompt import ChatPrompt, chat_prompt
from localinfer.server.errors import ApiError
from localinfer.server.host import Loaded, seconds
from localinfer.server.inputs import check_dimensions, input_tokens, request_images

router = APIRouter(prefix="/api", dependencies=deps.AUTH)
BridgeDep = Annotated[Bridge, Depends(deps.bridge)]
NDJSON = "application/x-ndjson"
ERRORS = {status: {"content": {"application/json": {"schema": {"type": "object", "properties": {"error": {"type": "string"}}, "required": ["error"]}}}}
          for status in (400, 401, 403, 404, 413, 500, 503)}  # fmt: skip
STREAMED = {200: {"content": {NDJSON: {"schema": {"type": "string"}}, "application/json": {"schema": {"type": "object"}}}}, **ERRORS}


def now() -> str:
    return datetime.now(timezone.utc).isoformat().replace("+00:00", "Z")


def line(data: dict) -> str:
    return json.dumps(data, ensure_ascii=False) + "\n"


async def model_for(bridge: Bridge, name: str, keep_alive: str | float | None = None) -> tuple[Loaded, int]:
    """The model, and how long loading it took (ns) if this request loaded it. A request's
    keep_alive sets how long the model stays loaded once idle (0: unload it now)."""
    try:
        keep = seconds(keep_alive) if keep_alive is not None else None
    except ValueError as e:
        raise ApiError(400, str(e), param="keep_alive") from None
    loaded_before = name in bridge.host.models or (name == bridge.host.default_ref and bridge.host.default_name in bridge.host.models)
    loaded = await bridge.model(name)
    if keep is not None:
        loaded.keep_alive = keep
    return loaded, 0 if loaded_before else int(loaded.engine.load_ms * 1e6)


def timings(out: CompletionOutput, started: float, load_ns: int) -> dict[str, object]:
    """Ollama's counts and durations: eval_count / eval_duration is the decode rate."""
    t = out.timings
    return {
        "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": load_ns,
        "prompt_eval_count": out.prompt_tokens, "prompt_eval_duration": int(t.prompt_ms * 1e6),
        "eval_count": out.completion_tokens, "eval_duration": int(t.tpot_ms * out.completion_tokens * 1e6),
    }  # fmt: skip


def done_reason(out: CompletionOutput) -> str:
    return "length" if out.finish_reason == "length" else "stop"


def sampling(engine: Engine, body: o.Generating) -> SamplingParams:
    try:
        shape = body.constraint()
    except ConstraintError as e:
        raise ApiError(400, str(e), param="format") from None
    return engine.defaults.with_overrides(**body.sampling(), constraint=shape, reasoning=True)


def assistant(text: str, thinking: str = "", calls: list[ToolCall] | None = None) -> dict:
    """A reply message in Ollama's shape: its thinking apart, tool calls with object arguments."""
    m: dict = {"role": "assistant", "content": text}
    if thinking:
        m["thinking"] = thinking
    if calls:
        m["tool_calls"] = [{"function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")}} for c in calls]
    return m


@router.post("/chat", responses=STREAMED)
async def chat(body: o.ChatRequest, request: Request, bridge: BridgeDep):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    images = await request_images(body.images, "messages", None)  # Ollama sends base64, never links
    loaded, load_ns = await model_for(bridge, body.model, body.keep_alive)
    prompt = chat_prompt(loaded.engine, body.conversation(), body.tool_list, "auto", body.thinks(), images)
    job = bridge.submit(loaded, prompt.tokens, sampling(loaded.engine, body), Route(request.url.path, "chat", "format", "num_predict"), prompt.media)
    lines = ChatLines(body.model, prompt, started, load_ns)
    if body.stream:
        return StreamingResponse(lines.stream(bridge, job), media_type=NDJSON)
    (out, _), = await bridge.results(request, [job])
    content, calls = prompt.answer(out.text)
    return {**lines.head(), "message": assistant(content, out.reasoning, calls), **lines.done(out)}


class ChatLines:
    """A streamed chat's lines: a message per piece of text or thinking (tool calls once
    whole), then a last one with done_reason and the timings."""

    def __init__(self, model: str, prompt: ChatPrompt, started: float, load_ns: int) -> None:
        self.model, self.started, self.load_ns = model, started, load_ns
        self.calls = prompt.calls()

    def head(self) -> dict:
        return {"model": self.model, "created_at": now()}

    def done(self, out: CompletionOutput) -> dict:
        return {"done": True, "done_reason": done_reason(out), **timings(out, self.started, self.load_ns)}

    async def stream(self, bridge: Bridge, job: Job) -> AsyncIterator[str]:
        async with aclosing(_pieces(bridge, job)) as pieces:
            async for out, thinking, text in pieces:
                for data in self.lines(out, thinking, text):
                    yield data

    def lines(self, out: CompletionOutput | None, thinking: str, text: str) -> list[str]:
        if out is not None and out.error is not None:
            return [line({"error": f"the model failed on this request: {out.error}"})]
        if out is None:
            content, found = self.calls.push(text) if self.calls else (text, [])
        else:
            content, found = self.calls.finish() if self.calls else ("", [])
        lines = [line({**self.head(), "message": assistant(content, thinking, found), "done": False})] if content or thinking or found else []
        if out is not None:
            lines.append(line({**self.head(), "message": assistant(""), **self.done(out)}))
        return lines


async def _pieces(bridge: Bridge, job: Job) -> AsyncIterator[tuple[CompletionOutput | None, str, str]]:
    """(None, thinking, text) for each token's event, then (the outcome, "", "")."""
    async with aclosing(bridge.events(job)) as events:
        async for event in events:
            if isinstance(event, CompletionOutput):
                yield event, "", ""
                return
            yield None, event.reasoning, event.text


@router.post("/generate", responses=STREAMED)
async def generate(body: o.GenerateRequest, request: Request, bridge: BridgeDep):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    images = await request_images(body.image_bytes, "images", None)
    loaded, load_ns = await model_for(bridge, body.model, body.keep_alive)
    engine = loaded.engine
    head = {"model": body.model, "created_at": now()}
    if not body.prompt:  # Ollama's way to load a model without answering
        return {**head, "response": "", "done": True, "done_reason": "load"}
    text = MEDIA_MARKER * len(images) + body.prompt  # the images stand before the prompt
    if body.raw:
        try:
            tokens, media = engine.tokenize_media(text, images)
        except UserError as e:
            raise ApiError(400, str(e), param="images") from None
        prompt = ChatPrompt(tokens, None, media=media)
    else:
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [{"role": "user", "content": text}]
        prompt = chat_prompt(engine, messages, lambda: [], "auto", body.thinks(), images)
    job = bridge.submit(loaded, prompt.tokens, sampling(engine, body), Route(request.url.path, "gen", "format", "num_predict"), prompt.media)
    if body.stream:
        return StreamingResponse(generate_lines(bridge, job, head, started, load_ns, prompt), media_type=NDJSON)
    (out, _), = await bridge.results(request, [job])
    thinking = {"thinking": out.reasoning} if out.reasoning else {}
    return {**head, "response": prompt.answer(out.text)[0], **thinking, "done": True, "done_reason": done_reason(out), **timings(out, started, load_ns)}


async def generate_lines(bridge: Bridge, job: Job, head: dict, started: float, load_ns: int, prompt: ChatPrompt) -> AsyncIterator[str]:
    calls = prompt.calls()  # no tools here: a call (harmony's, in the text) is taken out of the response
    async with aclosing(_pieces(bridge, job)) as pieces:
        async for out, thinking, text in pieces:
            if out is not None and out.error is not None:
                yield line({"error": f"the model failed on this request: {out.error}"})
                continue
            if calls is not None:
                text = (calls.finish() if out is not None else calls.push(text))[0]
            if text or thinking:
                yield line({**head, "created_at": now(), "response": text, **({"thinking": thinking} if thinking else {}), "done": False})
            if out is not None:
                yield line({**head, "created_at": now(), "response": "", "done": True, "done_reason": done_reason(out), **timings(out, started, load_ns)})


@router.post("/embed", responses=ERRORS)
async def embed(body: o.EmbedRequest, request: Request, bridge: BridgeDep) -> dict:
    started = time.perf_counter()
    loaded, load_ns = await model_for(bridge, body.model, body.keep_alive)
    check_dimensions(loaded.engine, body.dimensions)
    tokens = input_tokens(loaded.engine, [body.input] if isinstance(body.input, str) else list(body.input))
    limit = loaded.engine.embed_limit
    used = sum(min(len(t), limit) if body.truncate else len(t) for t in tokens)
    vectors = finish(await bridge.embed(loaded, tokens, body.truncate), body.dimensions)
    bridge.count_embedding(request.url.path, used)
    return {"model": body.model, "embeddings": vectors.tolist(), "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": load_ns, "prompt_eval_count": used}


@router.post("/embeddings", responses=ERRORS)
async def embeddings(body: o.EmbeddingsRequest, request: Request, bridge: BridgeDep) -> dict:
    loaded, _ = await model_for(bridge, body.model)
    tokens = input_tokens(loaded.engine, [body.prompt], "prompt")
    vectors = await bridge.embed(loaded, tokens, field="prompt")  # not normalised: Ollama's older route never was
    bridge.count_embedding(request.url.path, len(tokens[0]))
    return {"embedding": vectors[0].tolist()}


@router.get("/version", responses=ERRORS)
async def version() -> dict:
    return {"version": __version__}
