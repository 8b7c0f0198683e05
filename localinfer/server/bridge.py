"""Between the engines' threads and asyncio: one request's life, written once for every
dialect. A route translates its wire format into tokens and SamplingParams; the bridge
admits the request (or answers busy), submits it, hands its events to asyncio as they come
(woken with `call_soon_threadsafe`), aborts it the moment its client goes away, and ends
it exactly once, with its metrics and log line."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass

import numpy as np
from fastapi import Request

from localinfer.engine.engine import Engine
from localinfer.engine.stream import RequestStream
from localinfer.engine.types import CompletionOutput, SamplingParams, TokenEvent
from localinfer.errors import BackendError, BackendLost, ConstraintError, ModelNotFound, PathNotAllowed, UserError
from localinfer.server import protocol as p
from localinfer.server.errors import ApiError, ClientGone
from localinfer.server.host import Loaded, ModelHost
from localinfer.server.metrics import Metrics

log = logging.getLogger("localinfer.server")


async def disconnected(request: Request) -> None:
    """Returns when the client disconnects. The body has been read, so the next ASGI
    message can only be the disconnect."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


@dataclass(frozen=True)
class Route:
    """Where a request came in: its metrics label, its id's prefix, and the names its
    dialect gives the fields an error may point at."""

    path: str
    id_prefix: str
    constraint_field: str | None = None  # what shaped the answer (response_format, tools, format...)
    max_field: str = "max_tokens"


class Job:
    """One request in flight. `done()` ends it exactly once, whichever layer gets there
    first: it frees the queue place, aborts the request if it has not finished (the client
    went away), and records the metrics and the log line."""

    def __init__(self, loaded: Loaded, stream: RequestStream, route: Route, on_done) -> None:  # type: ignore[no-untyped-def]
        self.loaded, self.stream, self.route, self.rid = loaded, stream, route, p.new_id(route.id_prefix)
        self.started = time.perf_counter()
        self.out: CompletionOutput | None = None
        self._on_done = on_done
        self._closed = False

    @property
    def engine(self) -> Engine:
        return self.loaded.engine

    def done(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.loaded.in_flight -= 1
        self.loaded.last_used = time.monotonic()
        if self.out is None:
            self.loaded.engine.abort(self.stream.request_id)
        self._on_done(self)


Result = tuple[CompletionOutput, list[TokenEvent]]  # a finished request: its outcome and its token events


class Bridge:
    def __init__(self, host: ModelHost, metrics: Metrics, parallel: int, max_queue: int) -> None:
        self.host, self.metrics, self.parallel, self.max_queue = host, metrics, parallel, max_queue

    async def model(self, name: str | None, n: int = 1) -> Loaded:
        """The model a request names (loaded on demand), if it may take n more requests."""
        try:
            loaded = await self.host.get(name)
        except ModelNotFound as e:
            raise ApiError(404, str(e), "not_found_error", "model") from None
        except PathNotAllowed as e:
            raise ApiError(403, str(e), "permission_error", "model") from None
        except BackendLost as e:  # a model that broke, and cannot be loaded again yet
            raise ApiError(503, str(e), "server_error", headers={"Retry-After": "5"}) from None
        except UserError as e:
            raise ApiError(400, str(e), param="model") from None
        if loaded.in_flight + n > self.parallel + self.max_queue:
            raise ApiError(503, f"the server is busy ({self.parallel} running, {self.max_queue} waiting); retry shortly", "server_busy", headers={"Retry-After": "1"})
        return loaded

    async def start(self, loaded: Loaded, tokens: list[int], params: list[SamplingParams], route: Route, media: dict | None = None) -> list[Job]:
        """One request's choices, a SamplingParams each. The first goes alone; once its
        prompt is in the cache (its first event has come), the others are submitted, and the
        scheduler copies the prompt's cache to their slots with kv_copy instead of prefilling
        it n times. `media`: the prompt's images (Engine.tokenize_media)."""
        jobs = [self.submit(loaded, tokens, params[0], route, media)]
        if len(params) > 1:
            try:
                await self.first_event(jobs[0])
                jobs += [self.submit(loaded, tokens, more, route, media) for more in params[1:]]
            except BaseException:
                for job in jobs:
                    job.done()
                raise
        return jobs

    @staticmethod
    async def first_event(job: Job) -> None:
        loop = asyncio.get_running_loop()
        ready = asyncio.Event()
        job.stream.on_event = lambda: loop.call_soon_threadsafe(ready.set)
        while not job.stream.backlog:
            await ready.wait()
            ready.clear()

    def submit(self, loaded: Loaded, tokens: list[int], params: SamplingParams, route: Route, media: dict | None = None) -> Job:
        engine, most = loaded.engine, route.max_field
        if len(tokens) + (params.max_tokens or 1) > engine.n_ctx:
            raise ApiError(400, f"the prompt is {len(tokens)} tokens and {most} {params.max_tokens or 1}, but a request's context holds {engine.n_ctx}", param=most)
        try:
            stream = engine.submit(tokens, params, media)
        except ConstraintError as e:
            raise ApiError(400, str(e), param=route.constraint_field) from None
        except BackendError as e:  # the engine cannot run at all now (closed, or its file truncated)
            raise ApiError(503, str(e), "server_error") from None
        except UserError as e:
            raise ApiError(400, str(e)) from None
        loaded.in_flight += 1
        return Job(loaded, stream, route, self.record)

    async def events(self, job: Job) -> AsyncIterator[TokenEvent | CompletionOutput]:
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
                    self.metrics.itl.observe(now - last)
                last = now
                yield event
        finally:
            job.done()

    def count_embedding(self, route: str, tokens: int) -> None:
        self.metrics.prompt_tokens.inc(tokens)
        self.metrics.requests.labels(route=route, status="embedding").inc()

    async def embed(self, loaded: Loaded, inputs: list[list[int]], truncate: bool = False, field: str = "input") -> np.ndarray:
        """The inputs' pooled vectors (Engine.embed), computed on a worker thread while they count as in flight."""
        return await self._on_engine(loaded, field, lambda: loaded.engine.embed(inputs, truncate))

    async def rank(self, loaded: Loaded, inputs: list[list[int]], truncate: bool = False) -> np.ndarray:
        """A reranker's scores of query-document inputs (Engine.rank), as embed()."""
        return await self._on_engine(loaded, "documents", lambda: loaded.engine.rank(inputs, truncate))

    async def _on_engine(self, loaded: Loaded, field: str, work: Callable[[], np.ndarray]) -> np.ndarray:
        loaded.in_flight += 1
        try:
            return await asyncio.to_thread(work)
        except UserError as e:
            raise ApiError(400, str(e), param=field) from None
        finally:
            loaded.in_flight -= 1
            loaded.last_used = time.monotonic()

    async def results(self, request: Request, jobs: list[Job]) -> list[Result]:
        """Every job's result; if the client disconnects first (a timeout, Ctrl-C), the jobs
        are aborted and their slots freed at once, instead of decoding for nobody."""
        results = asyncio.ensure_future(asyncio.gather(*(self.finish(job) for job in jobs)))
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

    async def finish(self, job: Job) -> Result:
        tokens: list[TokenEvent] = []
        try:
            async with aclosing(self.events(job)) as stream_events:
                async for event in stream_events:
                    if isinstance(event, CompletionOutput):
                        if isinstance(event.error, BackendError) and job.engine.broken:
                            raise ApiError(503, str(event.error), "server_error")
                        if event.error is not None:
                            raise ApiError(500, f"the model failed on this request: {event.error}", "server_error")
                        return event, tokens
                    tokens.append(event)
        finally:
            job.done()
        raise ApiError(500, "the request ended without a result", "server_error")

    async def merged(self, jobs: list[Job]) -> AsyncIterator[tuple[int, TokenEvent | CompletionOutput]]:
        """The events of several jobs (a request's n choices) as (choice index, event), in the
        order they come, until every job has finished. A client that goes away closes this
        generator; the finally ends every choice's request."""
        queue: asyncio.Queue[tuple[int, TokenEvent | CompletionOutput]] = asyncio.Queue()

        async def pump(index: int, job: Job) -> None:
            async with aclosing(self.events(job)) as stream_events:
                async for event in stream_events:
                    await queue.put((index, event))

        tasks = [asyncio.create_task(pump(i, job)) for i, job in enumerate(jobs)]
        finished = 0
        try:
            while finished < len(jobs):
                index, event = await queue.get()
                finished += isinstance(event, CompletionOutput)
                yield index, event
        finally:
            for task in tasks:
                task.cancel()
            for job in jobs:
                job.done()

    def record(self, job: Job) -> None:
        engine, out, metrics = job.engine, job.out, self.metrics
        status = "disconnected" if out is None else ("error" if out.error is not None else out.finish_reason)
        metrics.requests.labels(route=job.route.path, status=status).inc()
        if out is None:
            log.info("request %s model=%s status=disconnected", job.rid, engine.name)
            return
        metrics.e2e.observe(time.perf_counter() - job.started)
        metrics.prompt_tokens.inc(out.prompt_tokens)
        metrics.generation_tokens.inc(out.completion_tokens)
        metrics.prefix_hit_tokens.inc(out.cached_tokens)
        t = out.timings
        for source, drafted, accepted in t.by_source():
            metrics.drafted.labels(source=source).inc(drafted)
            metrics.accepted.labels(source=source).inc(accepted)
        if out.timings.tokens_per_forward:
            metrics.tokens_per_forward.observe(out.timings.tokens_per_forward)
        if out.timings.ttft_ms:
            metrics.ttft.observe(out.timings.ttft_ms / 1e3)
        if out.timings.tpot_ms:
            metrics.tpot.observe(out.timings.tpot_ms / 1e3)
        log.info(
            "request %s model=%s in=%d (cached %d) out=%d ttft=%.0fms drafted model %d/%d lookup %d/%d status=%s",
            job.rid, engine.name, out.prompt_tokens, out.cached_tokens, out.completion_tokens, t.ttft_ms, t.model_accepted, t.model_drafted, t.lookup_accepted, t.lookup_drafted, status,
        )  # fmt: skip
