"""Errors the server answers, and how each reaches the client: always a JSON body in the
dialect's shape with a 4xx/5xx status, never a traceback or a 500 for a bad request."""

from __future__ import annotations

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException

from localinfer.server import anthropic_wire
from localinfer.server import protocol as p


class ApiError(Exception):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", param: str | None = None, headers: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.status, self.message, self.kind, self.param, self.headers = status, message, kind, param, headers


class ClientGone(Exception):
    """The client disconnected before its (non-streamed) answer was ready."""


def errors(*statuses: int) -> dict[int | str, dict[str, object]]:
    """The error statuses a route can answer, for the OpenAPI document (schemathesis checks
    every response against it). Every route may meet a full body (413) and a draining server (503)."""
    why = {400: "A bad request: the message names the field", 401: "A missing or wrong API key", 403: "A model path without --allow-paths",
           404: "No such model", 413: "A body over 8 MiB", 500: "The model failed on this request", 503: "Busy, shutting down, or the model cannot run; see Retry-After"}  # fmt: skip
    return {status: {"model": p.ErrorResponse, "description": why[status]} for status in sorted({*statuses, 413, 503})}


SAMPLING_ERRORS = errors(400, 401, 403, 404, 500)


def error_body(path: str, message: str, kind: str = "invalid_request_error", param: str | None = None) -> dict[str, object]:
    """An error in the shape of the dialect whose route `path` is: Anthropic's under
    /v1/messages, Ollama's under /api/, OpenAI's elsewhere."""
    if path.startswith("/v1/messages"):
        return anthropic_wire.error_body(message, kind)
    if path.startswith("/api/"):
        return {"error": message}
    return p.error_body(message, kind, param)


async def api_error(request: Request, e: ApiError) -> JSONResponse:
    return JSONResponse(error_body(request.url.path, e.message, e.kind, e.param), status_code=e.status, headers=e.headers)


async def invalid(request: Request, e: RequestValidationError) -> JSONResponse:
    first = e.errors()[0] if e.errors() else {"loc": (), "msg": "invalid request"}
    if first.get("type") == "json_invalid":
        return JSONResponse(error_body(request.url.path, f"the body is not valid JSON ({first.get('ctx', {}).get('error', 'decode error')})"), status_code=400)
    where = ".".join(str(x) for x in first.get("loc", ()) if x != "body")
    return JSONResponse(error_body(request.url.path, f"{where}: {first['msg']}" if where else first["msg"], param=where or None), status_code=400)


async def client_gone(request: Request, e: ClientGone) -> Response:
    return Response(status_code=499)  # nginx's "client closed request": nobody reads it


async def http_error(request: Request, e: HTTPException) -> JSONResponse:
    kind = {404: "not_found_error", 413: "request_too_large"}.get(e.status_code, "invalid_request_error")
    return JSONResponse(error_body(request.url.path, str(e.detail), kind), status_code=e.status_code, headers=getattr(e, "headers", None))


def install(app: FastAPI) -> None:
    """Answer every error in the API's own shape."""
    app.add_exception_handler(ApiError, api_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, invalid)  # type: ignore[arg-type]
    app.add_exception_handler(ClientGone, client_gone)  # type: ignore[arg-type]
    app.add_exception_handler(HTTPException, http_error)  # type: ignore[arg-type]
