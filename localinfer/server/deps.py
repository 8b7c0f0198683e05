"""What a route reaches through FastAPI's dependencies: the app's state, set once by
create_app, and the API-key check."""

from __future__ import annotations

import hmac
from typing import Annotated

from fastapi import Depends, Request

from localinfer.server.bridge import Bridge
from localinfer.server.errors import ApiError
from localinfer.server.fetch import FetchLimits
from localinfer.server.host import ModelHost
from localinfer.server.metrics import Metrics


def bridge(request: Request) -> Bridge:
    return request.app.state.bridge


def host(request: Request) -> ModelHost:
    return request.app.state.bridge.host


def metrics(request: Request) -> Metrics:
    return request.app.state.bridge.metrics


def fetch_limits(request: Request) -> FetchLimits | None:
    """How a request's image links are fetched: None unless `serve --allow-fetch`."""
    return request.app.state.fetch


Fetch = Annotated[FetchLimits | None, Depends(fetch_limits)]


async def authorized(request: Request) -> None:
    """With --api-key: `Authorization: Bearer KEY` (OpenAI's clients) or `x-api-key: KEY`
    (Anthropic's), compared in constant time."""
    key = request.app.state.api_key
    if not key:
        return
    bearer = hmac.compare_digest(request.headers.get("authorization", "").encode(), f"Bearer {key}".encode())
    header = hmac.compare_digest(request.headers.get("x-api-key", "").encode(), key.encode())
    if not (bearer or header):
        raise ApiError(401, "a valid API key is needed: Authorization: Bearer KEY (or x-api-key: KEY)", "authentication_error")


AUTH = [Depends(authorized)]
