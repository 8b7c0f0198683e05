"""The FastAPI app: routers per dialect (routes/) over the ModelHost's engines, reached
through the bridge (bridge.py), which carries each request between the engines' threads
and asyncio."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import FastAPI

from localinfer.server import errors
from localinfer.server.bridge import Bridge
from localinfer.server.fetch import FetchLimits
from localinfer.server.host import ModelHost
from localinfer.server.metrics import Metrics
from localinfer.server.middleware import BodyLimit
from localinfer.server.routes import anthropic, health, ollama, ollama_models, openai, rerank, responses


def create_app(host: ModelHost, api_key: str | None = None, parallel: int = 4, max_queue: int = 32, reap_every: float = 5.0, allow_pull: bool = False,
               fetch: FetchLimits | None = None) -> FastAPI:
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

    app = FastAPI(title="localinfer", summary="OpenAI (chat, completions, responses), Anthropic (messages) and Ollama (/api) endpoints for local GGUF models", lifespan=lifespan)
    app.state.bridge = Bridge(host, engine_metrics(host), parallel, max_queue)
    app.state.api_key = api_key
    app.state.allow_pull = allow_pull  # may Ollama's /api/pull and /api/delete change the model store?
    app.state.fetch = fetch  # how requests' image links are fetched (None: they are refused)
    app.state.responses = responses.ResponseLog()  # for previous_response_id
    errors.install(app)
    app.add_middleware(BodyLimit)
    for router in (health.router, openai.router, anthropic.router, responses.router, ollama.router, ollama_models.router, rerank.router):
        app.include_router(router)
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]
    return app


def engine_metrics(host: ModelHost) -> Metrics:
    """The metrics, with gauges that read the scheduler's state of every loaded model."""
    return Metrics(
        running=lambda: sum(m.engine.n_running for m in host.unique()),
        waiting=lambda: sum(m.engine.n_waiting for m in host.unique()),
        slots_free=lambda: sum(m.engine.free_slots for m in host.unique()),
        cells_used=lambda: sum(m.engine.kv_cells_used for m in host.unique()),
        cells_free=lambda: sum(m.engine.kv_cells_total - m.engine.kv_cells_used for m in host.unique()),
        cells_cached=lambda: sum(m.engine.kv_cells_cached for m in host.unique()),
        prompt_caches=lambda: [m.engine.prompt_cache for m in host.unique() if m.engine.prompt_cache is not None],
    )


def openapi(app: FastAPI) -> dict[str, object]:
    """FastAPI documents a 422 for every body; this server answers those as a 400."""
    if app.openapi_schema is None:
        schema = FastAPI.openapi(app)
        for ops in schema["paths"].values():
            for op in ops.values():
                op["responses"].pop("422", None)
        for name in ("HTTPValidationError", "ValidationError"):
            schema.get("components", {}).get("schemas", {}).pop(name, None)
        app.openapi_schema = schema
    return app.openapi_schema
