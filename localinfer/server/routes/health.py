"""Liveness and Prometheus metrics, for load balancers and scrapers."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends
from fastapi.responses import JSONResponse, Response
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from localinfer.server import deps
from localinfer.server import protocol as p
from localinfer.server.errors import errors
from localinfer.server.host import ModelHost
from localinfer.server.metrics import Metrics

router = APIRouter()


@router.get("/health", response_model=p.Health, responses=errors())
async def health(host: Annotated[ModelHost, Depends(deps.host)]) -> JSONResponse:
    broken = [m.engine.broken for m in host.unique() if m.engine.broken]
    if broken:
        return JSONResponse({"status": "error", "error": broken[0]}, status_code=503)
    ok = host.default_name is not None
    return JSONResponse({"status": "ok" if ok else "loading"}, status_code=200 if ok else 503)


PLAIN = {200: {"content": {"text/plain": {"schema": {"type": "string"}}}, "description": "Prometheus metrics"}, **errors(401)}


@router.get("/metrics", dependencies=deps.AUTH, response_class=Response, responses=PLAIN)
async def prometheus(host: Annotated[ModelHost, Depends(deps.host)], metrics: Annotated[Metrics, Depends(deps.metrics)]) -> Response:
    metrics.kv_bytes.clear()
    for m in host.unique():
        used = m.engine.kv_bytes_used()
        if used is not None:
            metrics.kv_bytes.labels(m.engine.name, *m.engine.cache_types).set(used)
    return Response(generate_latest(metrics.registry), media_type=CONTENT_TYPE_LATEST)
