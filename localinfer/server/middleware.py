"""ASGI middleware around every route."""

from __future__ import annotations

from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException

from localinfer.server.errors import error_body

MAX_BODY_BYTES = 8 * 1024 * 1024


class BodyLimit:
    """A body over `limit` bytes is a 413, whether its Content-Length says so up front or a
    chunked upload runs past it (it is cut off there, never read whole)."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES) -> None:  # type: ignore[no-untyped-def]
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        too_big = HTTPException(413, f"the request body is over {self.limit // 2**20} MiB")
        length = dict(scope["headers"]).get(b"content-length")
        if length is not None and (not length.isdigit() or int(length) > self.limit):
            response = JSONResponse(error_body(scope["path"], str(too_big.detail), "request_too_large"), status_code=413)
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
