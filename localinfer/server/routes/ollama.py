"""Ollama's API under /api: chat and generate (newline-delimited JSON unless `stream:
false`, with Ollama's timings in nanoseconds), embed, and the model store (tags, show, ps,
version; pull and delete only under `serve --allow-pull`). Translation only: prompts are
chat_prompt's, sampling the engine's, and the store is `localinfer pull/rm`'s."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from datetime import datetime, timezone
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Request, Response
from fastapi.responses import StreamingResponse

from localinfer import __version__
from localinfer.engine.engine import Engine
from localinfer.engine.tools import CallStream
from localinfer.engine.types import CompletionOutput
from localinfer.errors import ConstraintError, ModelNotFound, UserError
from localinfer.modelfile import GGUFInfo, inspect
from localinfer.server import deps
from localinfer.server import ollama_wire as o
from localinfer.server.bridge import Bridge, Job, Route
from localinfer.server.chat_prompt import ChatPrompt, chat_prompt
from localinfer.server.errors import ApiError
from localinfer.server.host import Loaded, ModelHost, seconds
from localinfer.store import manifests
from localinfer.store.inventory import local_names
from localinfer.store.pull import local_path
from localinfer.store.pull import pull as pull_model
from localinfer.store.refs import resolve
from localinfer.store.remove import remove_model

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


def sampling(engine: Engine, body: o.Generating, constraint: object | None) -> object:
    try:
        shape = body.constraint()
    except ConstraintError as e:
        raise ApiError(400, str(e), param="format") from None
    if shape is not None and constraint is not None:
        raise ApiError(400, "format and a required tool call cannot both shape the answer", param="format")
    return engine.defaults.with_overrides(**body.sampling(), constraint=constraint or shape, reasoning=True)


@router.post("/chat", responses=STREAMED)
async def chat(body: o.ChatRequest, request: Request, bridge: BridgeDep):  # type: ignore[no-untyped-def]
    started = time.perf_counter()
    loaded, load_ns = await model_for(bridge, body.model, body.keep_alive)
    try:
        conversation, tools = body.conversation(), body.tool_list()
    except ConstraintError as e:
        raise ApiError(400, str(e), param="messages") from None
    prompt = chat_prompt(loaded.engine, conversation, tools, "auto", body.thinks())
    job = bridge.submit(loaded, prompt.tokens, sampling(loaded.engine, body, None), Route(request.url.path, "chat", "format", "num_predict"))

    def message(text: str, thinking: str = "", calls: list | None = None) -> dict:
        m: dict = {"role": "assistant", "content": text}
        if thinking:
            m["thinking"] = thinking
        if calls:
            m["tool_calls"] = [{"function": {"name": c.name, "arguments": json.loads(c.arguments or "{}")}} for c in calls]
        return m

    head = lambda: {"model": body.model, "created_at": now()}  # noqa: E731
    if body.stream:
        return StreamingResponse(chat_lines(bridge, job, prompt, head, message, started, load_ns), media_type=NDJSON)
    (out, _), = await bridge.results(request, [job])
    content, calls = prompt.answer(out.text)
    return {**head(), "message": message(content, out.reasoning, calls), "done": True, "done_reason": done_reason(out), **timings(out, started, load_ns)}


async def chat_lines(bridge: Bridge, job: Job, prompt: ChatPrompt, head: Callable[[], dict], message, started: float, load_ns: int) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    calls = CallStream(prompt.plan.fmt, prompt.plan.required) if prompt.plan else None
    async with aclosing(_pieces(bridge, job)) as pieces:
        async for out, thinking, text in pieces:
            for data in _chat_line(out, thinking, text, calls, head, message, started, load_ns):
                yield data


def _chat_line(out, thinking, text, calls, head, message, started, load_ns) -> list[str]:  # type: ignore[no-untyped-def]
    """The lines one piece of a streamed chat makes: a message, or the last line with the timings."""
    if out is None:
        content, found = calls.push(text) if calls else (text, [])
    elif out.error is None:
        content, found = calls.finish() if calls else ("", [])
    else:
        return [line({"error": f"the model failed on this request: {out.error}"})]
    lines = [line({**head(), "message": message(content, thinking, found), "done": False})] if content or thinking or found else []
    if out is not None:
        lines.append(line({**head(), "message": message(""), "done": True, "done_reason": done_reason(out), **timings(out, started, load_ns)}))
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
    if body.images:
        raise ApiError(400, "images are not supported: this server runs text models", param="images")
    loaded, load_ns = await model_for(bridge, body.model, body.keep_alive)
    engine = loaded.engine
    head = {"model": body.model, "created_at": now()}
    if not body.prompt:  # Ollama's way to load a model without answering
        return {**head, "response": "", "done": True, "done_reason": "load"}
    if body.raw:
        tokens = engine.tokenize_prompt(body.prompt)
    else:
        messages = ([{"role": "system", "content": body.system}] if body.system else []) + [{"role": "user", "content": body.prompt}]
        tokens = chat_prompt(engine, messages, [], "auto", body.thinks()).tokens
    job = bridge.submit(loaded, tokens, sampling(engine, body, None), Route(request.url.path, "gen", "format", "num_predict"))
    if body.stream:
        return StreamingResponse(generate_lines(bridge, job, head, started, load_ns), media_type=NDJSON)
    (out, _), = await bridge.results(request, [job])
    thinking = {"thinking": out.reasoning} if out.reasoning else {}
    return {**head, "response": out.text, **thinking, "done": True, "done_reason": done_reason(out), **timings(out, started, load_ns)}


async def generate_lines(bridge: Bridge, job: Job, head: dict, started: float, load_ns: int) -> AsyncIterator[str]:
    async with aclosing(_pieces(bridge, job)) as pieces:
        async for out, thinking, text in pieces:
            if out is not None and out.error is not None:
                yield line({"error": f"the model failed on this request: {out.error}"})
            elif out is not None:
                yield line({**head, "created_at": now(), "response": "", "done": True, "done_reason": done_reason(out), **timings(out, started, load_ns)})
            elif text or thinking:
                yield line({**head, "created_at": now(), "response": text, **({"thinking": thinking} if thinking else {}), "done": False})


@router.post("/embed", responses=ERRORS)
async def embed(body: o.EmbedRequest, request: Request, bridge: BridgeDep) -> dict:
    started = time.perf_counter()
    loaded, load_ns = await model_for(bridge, body.model, body.keep_alive)
    inputs = [body.input] if isinstance(body.input, str) else body.input
    vectors, used = [], 0
    for text in inputs:
        tokens = loaded.engine.tokenize_prompt(text)
        vectors.append((await bridge.embed(loaded, tokens)).tolist())
        used += len(tokens)
    bridge.count_embedding(request.url.path, used)
    return {"model": body.model, "embeddings": vectors, "total_duration": int((time.perf_counter() - started) * 1e9), "load_duration": load_ns, "prompt_eval_count": used}


@router.post("/embeddings", responses=ERRORS)
async def embeddings(body: o.EmbeddingsRequest, request: Request, bridge: BridgeDep) -> dict:
    loaded, _ = await model_for(bridge, body.model)
    tokens = loaded.engine.tokenize_prompt(body.prompt)
    vector = await bridge.embed(loaded, tokens, "prompt")
    bridge.count_embedding(request.url.path, len(tokens))
    return {"embedding": vector.tolist()}


@router.get("/version", responses=ERRORS)
async def version() -> dict:
    return {"version": __version__}


def details(info: GGUFInfo) -> dict[str, object]:
    quant = next(iter(info.tensor_types), "")
    size = info.n_params
    return {
        "parent_model": "", "format": "gguf", "family": info.architecture, "families": [info.architecture],
        "parameter_size": f"{size / 1e9:.1f}B" if size >= 1e9 else f"{size / 1e6:.0f}M", "quantization_level": quant,
    }  # fmt: skip


def described(name: str, path: Path) -> dict[str, object]:
    """A model as /api/tags and /api/ps list it."""
    pulled = manifests.find(name)
    stat = path.stat()
    return {
        "name": name, "model": name, "size": stat.st_size, "digest": pulled.sha256 if pulled else "",
        "modified_at": datetime.fromtimestamp(stat.st_mtime, timezone.utc).isoformat().replace("+00:00", "Z"), "details": details(inspect(path)),
    }  # fmt: skip


def path_of(name: str) -> Path:
    try:
        path = local_path(resolve(name))
    except UserError as e:
        raise ApiError(404, str(e), "not_found_error", "model") from None
    if path is None:
        raise ApiError(404, f"model '{name}' not found; pull it first", "not_found_error", "model")
    return path


@router.get("/tags", responses=ERRORS)
async def tags() -> dict:
    names = local_names()
    return {"models": await asyncio.to_thread(lambda: [described(n, path_of(n)) for n in names])}


@router.post("/show", responses=ERRORS)
async def show(body: o.ModelRequest) -> dict:
    try:
        name = body.which()
    except ConstraintError as e:
        raise ApiError(400, str(e), param="model") from None
    path = path_of(name)
    info = await asyncio.to_thread(inspect, path)
    template = info.chat_template or ""
    capabilities = ["completion", *(["tools"] if "tools" in template else []), *(["thinking"] if "</think>" in template else [])]
    model_info = {"general.architecture": info.architecture, "general.parameter_count": info.n_params, f"{info.architecture}.context_length": info.context_length,
                  f"{info.architecture}.embedding_length": info.n_embd, f"{info.architecture}.block_count": info.n_layer}  # fmt: skip
    modified = datetime.fromtimestamp(path.stat().st_mtime, timezone.utc).isoformat().replace("+00:00", "Z")
    return {"modelfile": f"FROM {path}\n", "parameters": "", "template": template, "license": info.license or "", "details": details(info),
            "model_info": model_info, "capabilities": capabilities, "modified_at": modified}  # fmt: skip


@router.get("/ps", responses=ERRORS)
async def ps(host: Annotated[ModelHost, Depends(deps.host)]) -> dict:
    models = []
    for name, loaded in list(host.models.items()):
        if name != loaded.engine.name:
            continue  # an alias of a model listed under its own name
        entry = described(name, Path(loaded.engine.backend.facts.path))
        expires = loaded.last_used - time.monotonic() + time.time() + max(host.keep_alive_of(loaded), 0)
        models.append({**entry, "expires_at": datetime.fromtimestamp(expires, timezone.utc).isoformat().replace("+00:00", "Z"), "size_vram": 0, "context_length": loaded.engine.n_ctx})
    return {"models": models}


def allowed_to_change_store(request: Request) -> None:
    if not request.app.state.allow_pull:
        raise ApiError(403, "this server does not change its model store; start it with --allow-pull", "permission_error")


@router.post("/pull", responses=STREAMED, dependencies=[Depends(allowed_to_change_store)])
async def pull(body: o.ModelRequest):  # type: ignore[no-untyped-def]
    try:
        name = body.which()
        source = resolve(name)
    except UserError as e:
        raise ApiError(400, str(e), param="model") from None
    if body.stream:
        return StreamingResponse(pull_lines(name, source), media_type=NDJSON)
    try:
        await asyncio.to_thread(pull_model, source)
    except UserError as e:
        raise ApiError(400, str(e), param="model") from None
    return {"status": "success"}


async def pull_lines(name: str, source) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
    """Ollama's progress lines: pulling, its bytes done of total as they move, success."""
    loop, queue = asyncio.get_running_loop(), asyncio.Queue()
    last = [0.0]

    def progress(done: int, total: int) -> None:
        if time.monotonic() - last[0] > 0.1 or done == total:
            last[0] = time.monotonic()
            loop.call_soon_threadsafe(queue.put_nowait, {"status": f"pulling {name}", "digest": "", "total": total, "completed": done})

    yield line({"status": "pulling manifest"})
    task = asyncio.ensure_future(asyncio.to_thread(pull_model, source, progress))
    while not task.done() or not queue.empty():
        getter = asyncio.ensure_future(queue.get())
        await asyncio.wait({task, getter}, return_when=asyncio.FIRST_COMPLETED)
        if getter.done():
            yield line(getter.result())
        else:
            getter.cancel()
    try:
        task.result()
    except UserError as e:
        yield line({"error": str(e)})
        return
    yield line({"status": "verifying sha256 digest"})
    yield line({"status": "success"})


@router.delete("/delete", response_class=Response, responses={200: {"description": "Deleted (an empty body, as Ollama answers)"}, **ERRORS}, dependencies=[Depends(allowed_to_change_store)])
async def delete(body: o.ModelRequest) -> Response:
    try:
        await asyncio.to_thread(remove_model, body.which(), lambda message: None)
    except ModelNotFound as e:
        raise ApiError(404, str(e), "not_found_error", "model") from None
    except UserError as e:
        raise ApiError(400, str(e), param="model") from None
    return Response(status_code=200)
