"""The FastAPI app: OpenAI's routes over the ModelHost's engines.

Requests cross into each engine's thread through `Engine.submit`; their events come back
through the request's stream, woken into asyncio with `call_soon_threadsafe`. A client
that goes away mid-stream cancels its generator, which aborts the request at once.
"""

from __future__ import annotations

import asyncio
import base64
import hmac
import json
import logging
import time
from collections.abc import AsyncIterator
from contextlib import aclosing, asynccontextmanager

from fastapi import Depends, FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from sse_starlette.sse import EventSourceResponse
from starlette.exceptions import HTTPException

from localinfer.engine.constraints import Constraint
from localinfer.engine.engine import Engine
from localinfer.engine.tools import CallStream, ToolCall, ToolPlan, call_prefix, parse_calls, plan_tools, prompt_messages, tool_format
from localinfer.engine.stream import RequestStream
from localinfer.engine.types import CompletionOutput, TokenEvent
from localinfer.errors import BackendError, ConstraintError, ModelNotFound, PathNotAllowed, UserError
from localinfer.server import protocol as p
from localinfer.server.host import Loaded, ModelHost
from localinfer.server.metrics import Metrics
from localinfer.store.inventory import local_names

log = logging.getLogger("localinfer.server")
MAX_BODY_BYTES = 8 * 1024 * 1024


def errors(*statuses: int) -> dict[int | str, dict[str, object]]:
    """The error statuses a route can answer, for the OpenAPI document (schemathesis checks
    every response against it). Every route may meet a full body (413) and a draining server (503)."""
    why = {400: "A bad request: the message names the field", 401: "A missing or wrong API key", 403: "A model path without --allow-paths",
           404: "No such model", 413: "A body over 8 MiB", 500: "The model failed on this request", 503: "Busy, shutting down, or the model cannot run; see Retry-After"}  # fmt: skip
    return {status: {"model": p.ErrorResponse, "description": why[status]} for status in sorted({*statuses, 413, 503})}


SAMPLING_ERRORS = errors(400, 401, 403, 404, 500)
STREAMED = {"text/event-stream": {"schema": {  # one server-sent event
    "type": "object", "required": ["data"],
    "properties": {"event": {"type": "string"}, "data": {"type": "string", "description": "A JSON chunk (ChatCompletionChunk or Completion), or [DONE]"}},
}}}  # fmt: skip


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.headers = status, message, kind, param, headers


class BodyLimit:
    """ASGI middleware: a body over `limit` bytes is a 413, whether its Content-Length says
    so up front or a chunked upload runs past it (it is cut off there, never read whole)."""

    def __init__(self, app, limit: int) -> None:  # type: ignore[no-untyped-def]
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = HTTPException(413, f"the request body is over {self.limit // 2**20} MiB")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            response = JSONResponse(p.error_body(str(too_big.detail)), status_code=413)
            return await response(scope, receive, send)
        received = 0

        async def counted() -> dict:  # type: ignore[type-arg]
            nonlocal received
            message = await receive()
            received += len(message.get("body", b""))
            if received > self.limit:
                raise too_big  # FastAPI passes an HTTPException from the body read on to our handler
            return message

        await self.app(scope, counted, send)


class ClientGone(Exception):
    """The client disconnected before its (non-streamed) answer was ready."""


async def disconnected(request: Request) -> None:
    """Returns when the client disconnects. The body has been read, so the next ASGI
    message can only be the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Job:
    """One request in flight. `done()` ends it exactly once, whichever layer gets there
    first: it frees the queue place, aborts the request if it has not finished (the client
    went away), and records the metrics and the log line."""

    def __init__(self, loaded: Loaded, stream: RequestStream, rid: str, on_done) -> None:  # type: ignore[no-untyped-def]
        self.loaded, self.stream, self.rid = loaded, stream, rid
        self.started = time.perf_counter()
        self.out: CompletionOutput | None = None
        self._on_done = on_done
        self._closed = False

    def done(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.loaded.in_flight -= 1
        self.loaded.last_used = time.monotonic()
        if self.out is None:
            self.loaded.engine.abort(self.stream.request_id)
        self._on_done(self)


def create_app(host: ModelHost, api_key: str | None = None, parallel: int = 4, max_queue: int = 32, reap_every: float = 5.0) -> FastAPI:
    metrics = Metrics(
        running=lambda: sum(m.engine.n_running for m in host.unique()),
        waiting=lambda: sum(m.engine.n_waiting for m in host.unique()),
        slots_free=lambda: sum(m.engine.free_slots for m in host.unique()),
        cells_used=lambda: sum(m.engine.kv_cells_used for m in host.unique()),
        cells_free=lambda: sum(m.engine.kv_cells_total - m.engine.kv_cells_used for m in host.unique()),
        cells_cached=lambda: sum(m.engine.kv_cells_cached for m in host.unique()),
    )

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        await host.start()

        async def reaper() -> None:
            while True:
                await asyncio.sleep(reap_every)
                await host.reap()

        task = asyncio.create_task(reaper())
        yield
        task.cancel()
        await asyncio.to_thread(host.close)  # each engine finishes what is in flight, then stops

    app = FastAPI(title="localinfer", summary="An OpenAI-compatible endpoint for local GGUF models", lifespan=lifespan)

    # --- errors: always OpenAI's body, never a 500 for a bad request --------------------------
    @app.exception_handler(ApiError)
    async def api_error(request: Request, e: ApiError) -> JSONResponse:
        return JSONResponse(p.error_body(e.message, e.kind, e.param), status_code=e.status, headers=e.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
        first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
        if first.get("type") == "json_invalid":
            return JSONResponse(p.error_body(f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})"), status_code=400)
        where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
        return JSONResponse(p.error_body(f"{where}: {first['msg']}" if where else first["msg"], param=where or None), status_code=400)

    @app.exception_handler(ClientGone)
    async def client_gone(request: Request, e: ClientGone) -> Response:
        return Response(status_code=499)  # nginx's "client closed request": nobody reads it

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, e: HTTPException) -> JSONResponse:
        kind = "not_found_error" if e.status_code == 404 else "invalid_request_error"
        return JSONResponse(p.error_body(str(e.detail), kind), status_code=e.status_code, headers=getattr(e, "headers", None))

    app.add_middleware(BodyLimit, limit=MAX_BODY_BYTES)

    async def authorized(request: Request) -> None:
        if api_key and not hmac.compare_digest(request.headers.get("authorization", "").encode(), f"Bearer {api_key}".encode()):  # constant time
            raise ApiError(401, "a valid API key is needed: Authorization: Bearer KEY", "authentication_error")

    auth = [Depends(authorized)]

    # --- routes -----------------------------------------------------------------------------
    @app.get("/health", response_model=p.Health, responses=errors())
    async def health() -> JSONResponse:
        broken = [m.engine.broken for m in host.unique() if m.engine.broken]
        if broken:
            return JSONResponse({"status": "error", "error": broken[0]}, status_code=503)
        ok = host.default_name is not None
        return JSONResponse({"status": "ok" if ok else "loading"}, status_code=200 if ok else 503)

    @app.get("/metrics", dependencies=auth, response_class=Response, responses={200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus metrics"}, **errors(401)})
    async def prometheus() -> Response:
        metrics.kv_bytes.clear()
        for m in host.unique():
            used = m.engine.kv_bytes_used()
            if used is not None:
                metrics.kv_bytes.labels(m.engine.name, *m.engine.cache_types).set(used)
        return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models", dependencies=auth, response_model=p.ModelList, responses=errors(401))
    async def models() -> p.ModelList:
        names = list(dict.fromkeys([*host.models, *local_names()]))
        return p.ModelList(data=[model_card(name, host.models.get(name)) for name in names])

    @app.post("/v1/chat/completions", dependencies=auth, response_model=p.ChatCompletion, responses={200: {"content": STREAMED}, **SAMPLING_ERRORS})
    async def chat(body: p.ChatCompletionRequest, request: Request):  # type: ignore[no-untyped-def]
        if body.top_logprobs is not None and not body.logprobs:
            raise ApiError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
        loaded = await model_for(body)
        engine = loaded.engine
        template = engine.backend.facts.chat_template
        choice = body.tool_choice.function.name if isinstance(body.tool_choice, p.NamedToolChoice) else (body.tool_choice or "auto")
        try:
            plan = plan_tools(template, body.tool_list(), choice)
        except ConstraintError as e:
            raise ApiError(400, str(e), param="tools") from None
        fmt = plan.fmt if plan else tool_format(template)
        messages = prompt_messages([m.for_template() for m in body.messages], plan.tools if plan else [], fmt)
        try:
            text = engine.render_chat(messages, tools=plan.template_tools() if plan else None, think=body.thinking())
            tokens = engine.tokenize_prompt(text + (call_prefix(fmt) if plan and plan.required else ""))
        except UserError as e:
            raise ApiError(400, str(e), param="messages") from None
        jobs = await start(loaded, tokens, body, plan.constraint if plan else None)
        if body.stream:
            return EventSourceResponse(chat_chunks(jobs, body, plan), ping=15)
        results = await unless_gone(request, jobs)
        choices = []
        for i, (out, tokens) in enumerate(results):
            content, calls = parse_calls(out.text, plan.fmt, plan.required) if plan else (out.text, [])
            choices.append(p.ChatChoice(
                index=i, message=p.ResponseMessage(content=(content or None) if calls else content, tool_calls=[wire_call(c) for c in calls] or None,
                                                   reasoning_content=out.reasoning or None),
                finish_reason="tool_calls" if calls and out.finish_reason == "stop" else out.finish_reason,
                logprobs=chat_logprobs(engine, tokens) if body.logprobs else None,
            ))  # fmt: skip
        return p.ChatCompletion(id=jobs[0].rid, model=engine.name, usage=usage(*(out for out, _ in results)), choices=choices)

    @app.post("/v1/completions", dependencies=auth, response_model=p.Completion, responses={200: {"content": STREAMED}, **SAMPLING_ERRORS})
    async def complete(body: p.CompletionRequest, request: Request):  # type: ignore[no-untyped-def]
        prompts = [body.prompt] if isinstance(body.prompt, str) else body.prompt
        if len(prompts) != 1:
            raise ApiError(400, "prompt must be one string (a list of several is not supported yet)", param="prompt")
        loaded = await model_for(body)
        jobs = await start(loaded, loaded.engine.tokenize_prompt(prompts[0]), body)
        if body.stream:
            return EventSourceResponse(text_chunks(jobs, body), ping=15)
        results = await unless_gone(request, jobs)
        choices = [
            p.TextChoice(index=i, text=out.text, finish_reason=out.finish_reason,
                         logprobs=completion_logprobs(loaded.engine, tokens) if body.logprobs is not None else None)
            for i, (out, tokens) in enumerate(results)
        ]  # fmt: skip
        return p.Completion(id=jobs[0].rid, model=loaded.engine.name, usage=usage(*(out for out, _ in results)), choices=choices)

    @app.post("/v1/embeddings", dependencies=auth, response_model=p.EmbeddingList, responses=errors(400, 401, 403, 404))
    async def embeddings(body: p.EmbeddingRequest) -> p.EmbeddingList:
        loaded = await model_for(body)
        engine = loaded.engine
        inputs: list = [body.input] if isinstance(body.input, str) or (body.input and isinstance(body.input[0], int)) else list(body.input)
        if not inputs:
            raise ApiError(400, "input is empty", param="input")
        if body.dimensions is not None and body.dimensions != engine.backend.facts.n_embd:
            raise ApiError(400, f"this model's embeddings have {engine.backend.facts.n_embd} dimensions; dimensions cannot change that", param="dimensions")
        data, used = [], 0
        for index, item in enumerate(inputs):
            tokens = engine.tokenize_prompt(item) if isinstance(item, str) else list(item)
            if any(not 0 <= t < engine.backend.vocab.n_vocab for t in tokens):
                raise ApiError(400, f"input {index} has a token id outside this model's vocabulary", param="input")
            loaded.in_flight += 1
            try:
                vector = await asyncio.to_thread(engine.embed, tokens)
            except UserError as e:
                raise ApiError(400, str(e), param="input") from None
            finally:
                loaded.in_flight -= 1
                loaded.last_used = time.monotonic()
            used += len(tokens)
            encoded = base64.b64encode(vector.astype("<f4").tobytes()).decode() if body.encoding_format == "base64" else vector.tolist()
            data.append(p.Embedding(index=index, embedding=encoded))
        metrics.prompt_tokens.inc(used)
        metrics.requests.labels(status="embedding").inc()
        return p.EmbeddingList(data=data, model=engine.name, usage=p.EmbeddingUsage(prompt_tokens=used, total_tokens=used))

    # --- one request ------------------------------------------------------------------------
    async def model_for(body: p.SamplingFields | p.EmbeddingRequest) -> Loaded:
        try:
            loaded = await host.get(body.model)
        except ModelNotFound as e:
            raise ApiError(404, str(e), "not_found_error", "model", ) from None
        except PathNotAllowed as e:
            raise ApiError(403, str(e), "permission_error", "model") from None
        except UserError as e:
            raise ApiError(400, str(e), param="model") from None
        if loaded.in_flight + getattr(body, "n", 1) > parallel + max_queue:
            raise ApiError(503, f"the server is busy ({parallel} running, {max_queue} waiting); retry shortly", "server_busy", headers={"Retry-After": "1"})
        return loaded

    async def start(loaded: Loaded, tokens: list[int], body: p.SamplingFields, tool_constraint: Constraint | None = None) -> list[Job]:
        """The request's n choices. The first goes alone; once its prompt is in the cache
        (its first event has come), the others are submitted, and the scheduler copies the
        prompt's cache to their slots with kv_copy instead of prefilling it n times."""
        jobs = [submit(loaded, tokens, body, 0, tool_constraint)]
        if body.n > 1:
            try:
                await first_event(jobs[0])
                jobs += [submit(loaded, tokens, body, i, tool_constraint) for i in range(1, body.n)]
            except BaseException:
                for job in jobs:
                    job.done()
                raise
        return jobs

    async def first_event(job: Job) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        job.stream.on_event = lambda: loop.call_soon_threadsafe(ready.set)
        while not job.stream.backlog:
            await ready.wait()
            ready.clear()

    def submit(loaded: Loaded, tokens: list[int], body: p.SamplingFields, index: int = 0, tool_constraint: Constraint | None = None) -> Job:
        engine = loaded.engine
        max_tokens = body.max_completion_tokens or body.max_tokens
        if len(tokens) + (max_tokens or 1) > engine.n_ctx:
            raise ApiError(400, f"the prompt is {len(tokens)} tokens and max_tokens {max_tokens or 1}, but a request's context holds {engine.n_ctx}", param="max_tokens")
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
            repeat_penalty=body.repeat_penalty, max_tokens=max_tokens, stop=body.stops() or None,
            seed=body.seed + index if body.seed is not None and body.seed >= 0 else None,  # n choices, n samples
            logprobs=body.logprob_count(),  # type: ignore[attr-defined]
            presence_penalty=body.presence_penalty or None, frequency_penalty=body.frequency_penalty or None,
            constraint=constraint, ignore_eos=body.ignore_eos, think_budget=getattr(body, "thinking_budget_tokens", None),
            reasoning=isinstance(body, p.ChatCompletionRequest),  # a text completion is the model's raw text
        )  # fmt: skip
        try:
            stream = engine.submit(tokens, params)
        except ConstraintError as e:
            raise ApiError(400, str(e), param=field) from None
        except BackendError as e:  # the engine cannot run at all now (closed, or its file truncated)
            raise ApiError(503, str(e), "server_error") from None
        except UserError as e:
            raise ApiError(400, str(e)) from None
        loaded.in_flight += 1
        return Job(loaded, stream, p.new_id("chatcmpl" if isinstance(body, p.ChatCompletionRequest) else "cmpl"), record)

    async def events(job: Job) -> AsyncIterator[object]:
        """The request's events in asyncio, woken by the engine's thread."""
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        job.stream.on_event = lambda: loop.call_soon_threadsafe(ready.set)
        last = None
        try:
            while True:
                ready.clear()
                event = job.stream.get_nowait()
                if event is None:
                    await ready.wait()
                    continue
                if isinstance(event, CompletionOutput):
                    job.out = event
                    yield event
                    return
                now = time.perf_counter()
                if last is not None:
                    metrics.itl.observe(now - last)
                last = now
                yield event
        finally:
            job.done()

    async def unless_gone(request: Request, jobs: list[Job]) -> list[tuple[CompletionOutput, list[TokenEvent]]]:
        """Every job's result; if the client disconnects first (a timeout, Ctrl-C), the jobs
        are aborted and their slots freed at once, instead of decoding for nobody."""
        results = asyncio.ensure_future(asyncio.gather(*(finish(job) for job in jobs)))
        gone = asyncio.ensure_future(disconnected(request))
        await asyncio.wait({results, gone}, return_when=asyncio.FIRST_COMPLETED)
        gone.cancel()
        if not results.done():
            results.cancel()
            results.add_done_callback(lambda f: f.cancelled() or f.exception())  # retrieved: no "never retrieved" traceback in the log
            for job in jobs:
                job.done()
            raise ClientGone
        return results.result()

    async def finish(job: Job) -> tuple[CompletionOutput, list[TokenEvent]]:
        tokens: list[TokenEvent] = []
        try:
            async with aclosing(events(job)) as stream_events:
                async for event in stream_events:
                    if isinstance(event, CompletionOutput):
                        if isinstance(event.error, BackendError) and job.loaded.engine.broken:
                            raise ApiError(503, str(event.error), "server_error")
                        if event.error is not None:
                            raise ApiError(500, f"the model failed on this request: {event.error}", "server_error")
                        return event, tokens
                    tokens.append(event)  # type: ignore[arg-type]
        finally:
            job.done()
        raise ApiError(500, "the request ended without a result", "server_error")

    async def chunks(jobs: list[Job], body: p.SamplingFields, make, first: list[str] | None = None) -> AsyncIterator[str]:  # type: ignore[no-untyped-def]
        """SSE data for the choices of one request, interleaved as their tokens come:
        `make(index, text, finish_reason, usage, event)` builds the chunks of each. A client that goes
        away cancels this generator; the finally ends every choice's request."""
        queue: asyncio.Queue[tuple[int, object]] = asyncio.Queue()

        async def pump(index: int, job: Job) -> None:
            async with aclosing(events(job)) as stream_events:
                async for event in stream_events:
                    await queue.put((index, event))

        tasks = [asyncio.create_task(pump(i, job)) for i, job in enumerate(jobs)]
        outs: list[CompletionOutput] = []
        try:
            for data in first or []:
                yield data
            while len(outs) < len(jobs):
                index, event = await queue.get()
                if isinstance(event, CompletionOutput):
                    outs.append(event)
                    if event.error is not None:
                        yield json.dumps(p.error_body(f"the model failed on this request: {event.error}", "server_error"))
                        break
                    for chunk in make(index, None, event.finish_reason, None, None):
                        yield chunk.model_dump_json()
                elif event.text or event.reasoning or event.logprob is not None:  # type: ignore[attr-defined]
                    for chunk in make(index, event.text, None, None, event):  # type: ignore[attr-defined]
                        yield chunk.model_dump_json()
            else:
                if body.stream_options and body.stream_options.include_usage:
                    for chunk in make(0, None, None, usage(*outs), None):
                        yield chunk.model_dump_json()
            yield "[DONE]"
        finally:
            for task in tasks:
                task.cancel()
            for job in jobs:
                job.done()

    def chat_chunks(jobs: list[Job], body: p.SamplingFields, plan: ToolPlan | None) -> AsyncIterator[str]:
        name, engine = jobs[0].loaded.engine.name, jobs[0].loaded.engine
        calls = [CallStream(plan.fmt, plan.required) if plan else None for _ in jobs]  # per choice: text with its calls held back
        n_calls = [0] * len(jobs)

        def chunk(index: int, delta: p.Delta, finish: str | None = None, logprobs: p.ChoiceLogprobs | None = None) -> p.ChatCompletionChunk:
            return p.ChatCompletionChunk(id=jobs[0].rid, model=name, choices=[p.ChunkChoice(index=index, delta=delta, finish_reason=finish, logprobs=logprobs)])

        def make(index: int, text: str | None, finish: str | None, use: p.Usage | None, event: TokenEvent | None) -> list[p.ChatCompletionChunk]:
            if use is not None:
                return [p.ChatCompletionChunk(id=jobs[0].rid, model=name, choices=[], usage=use)]
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

        roles = [p.ChatCompletionChunk(id=jobs[0].rid, model=name, choices=[p.ChunkChoice(index=i, delta=p.Delta(role="assistant", content=""))]).model_dump_json() for i in range(len(jobs))]
        return chunks(jobs, body, make, roles)

    def text_chunks(jobs: list[Job], body: p.SamplingFields) -> AsyncIterator[str]:
        name, engine = jobs[0].loaded.engine.name, jobs[0].loaded.engine

        def make(index: int, text: str | None, finish: str | None, use: p.Usage | None, event: TokenEvent | None) -> list[p.Completion]:
            logprobs = completion_logprobs(engine, [event]) if event is not None and event.logprob is not None else None
            choices = [] if use is not None else [p.TextChoice(index=index, text=text or "", finish_reason=finish, logprobs=logprobs)]
            return [p.Completion(id=jobs[0].rid, model=name, choices=choices, usage=use)]

        return chunks(jobs, body, make)

    def record(job: Job) -> None:
        engine, out = job.loaded.engine, job.out
        status = "disconnected" if out is None else ("error" if out.error is not None else out.finish_reason)
        metrics.requests.labels(status=status).inc()
        if out is None:
            log.info("request %s model=%s status=disconnected", job.rid, engine.name)
            return
        metrics.e2e.observe(time.perf_counter() - job.started)
        metrics.prompt_tokens.inc(out.prompt_tokens)
        metrics.generation_tokens.inc(out.completion_tokens)
        metrics.prefix_hit_tokens.inc(out.cached_tokens)
        metrics.drafted.inc(out.timings.drafted)
        metrics.accepted.inc(out.timings.accepted)
        if out.timings.tokens_per_forward:
            metrics.tokens_per_forward.observe(out.timings.tokens_per_forward)
        if out.timings.ttft_ms:
            metrics.ttft.observe(out.timings.ttft_ms / 1e3)
        if out.timings.tpot_ms:
            metrics.tpot.observe(out.timings.tpot_ms / 1e3)
        log.info(
            "request %s model=%s in=%d (cached %d) out=%d ttft=%.0fms status=%s",
            job.rid, engine.name, out.prompt_tokens, out.cached_tokens, out.completion_tokens, out.timings.ttft_ms, status,
        )  # fmt: skip

    def openapi() -> dict[str, object]:
        """FastAPI documents a 422 for every body; this server answers those as OpenAI's 400."""
        if app.openapi_schema is None:
            schema = FastAPI.openapi(app)
            for ops in schema["paths"].values():
                for op in ops.values():
                    op["responses"].pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi  # type: ignore[method-assign]
    return app


def model_card(name: str, loaded: Loaded | None) -> p.ModelCard:
    """A model as /v1/models lists it: with its engine, and why, once it is loaded."""
    if loaded is None:
        return p.ModelCard(id=name)
    choice = loaded.engine.choice
    return p.ModelCard(id=name, engine=loaded.engine.backend.name, engine_reason=choice.reason if choice else None)


def wire_call(call: ToolCall) -> p.MessageToolCall:
    return p.MessageToolCall(id=call.id, function=p.FunctionCall(name=call.name, arguments=call.arguments))


def token_text(engine: Engine, token: int) -> tuple[str, list[int]]:
    raw = engine.backend.token_bytes(token)
    return raw.decode("utf-8", "replace"), list(raw)


def chat_logprobs(engine: Engine, events: list[TokenEvent]) -> p.ChoiceLogprobs:
    content = []
    for e in events:
        if e.logprob is None:
            continue  # a stop string's held-back tail: text, not a token
        text, raw = token_text(engine, e.token)
        tops = []
        for alternative, lp in e.top_logprobs or []:
            alt_text, alt_bytes = token_text(engine, alternative)
            tops.append(p.TopLogprob(token=alt_text, logprob=lp, bytes=alt_bytes))
        content.append(p.TokenLogprob(token=text, logprob=e.logprob, bytes=raw, top_logprobs=tops))
    return p.ChoiceLogprobs(content=content)


def completion_logprobs(engine: Engine, events: list[TokenEvent]) -> p.CompletionLogprobs:
    out = p.CompletionLogprobs(tokens=[], token_logprobs=[], top_logprobs=[], text_offset=[])
    offset = 0
    for e in events:
        if e.logprob is None:
            continue
        text = token_text(engine, e.token)[0]
        out.tokens.append(text)
        out.token_logprobs.append(e.logprob)
        out.top_logprobs.append({token_text(engine, t)[0]: lp for t, lp in e.top_logprobs or []})
        out.text_offset.append(offset)
        offset += len(text)
    return out


def usage(*outs: CompletionOutput) -> p.Usage:
    """One request's usage over its choices: the prompt once, every choice's answer."""
    completion = sum(o.completion_tokens for o in outs)
    return p.Usage(
        prompt_tokens=outs[0].prompt_tokens, completion_tokens=completion, total_tokens=outs[0].prompt_tokens + completion,
        prompt_tokens_details={"cached_tokens": outs[0].cached_tokens},
        completion_tokens_details={"reasoning_tokens": sum(o.reasoning_tokens for o in outs)},
    )  # fmt: skip

