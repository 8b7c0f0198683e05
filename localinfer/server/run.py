"""Running the app under uvicorn, so that Ctrl-C and SIGTERM drain and exit 0."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Iterator
from types import FrameType

import uvicorn
from fastapi import FastAPI

from localinfer.server.errors import error_body

DRAIN_SECONDS = 60.0  # the longest a shutdown waits for the requests in flight


class Drain:
    """ASGI middleware that counts the HTTP requests in flight and, once draining, answers
    every new one 503 with Retry-After (a load balancer or a client retry goes elsewhere or
    comes back) while the ones in flight finish."""

    MESSAGE = "the server is shutting down; retry shortly"

    def __init__(self, app: FastAPI) -> None:
        self.app = app
        self.active = 0
        self.draining = False

    async def __call__(self, scope, receive, send) -> None:  # type: ignore[no-untyped-def]
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.draining:
            headers = [(b"content-type", b"application/json"), (b"retry-after", b"1"), (b"connection", b"close")]
            await send({"type": "http.response.start", "status": 503, "headers": headers})
            body = json.dumps(error_body(scope["path"], self.MESSAGE, "server_busy")).encode()  # in the dialect's shape
            await send({"type": "http.response.body", "body": body})
            return
        self.active += 1
        try:
            await self.app(scope, receive, send)
        finally:
            self.active -= 1


class DrainingServer(uvicorn.Server):
    """On Ctrl-C or SIGTERM: new requests get 503 while those in flight finish (up to
    DRAIN_SECONDS), then uvicorn stops and runs the app's shutdown (which stops each
    engine). A second signal stops at once. A drained shutdown is a clean one: exit 0,
    not the signal's 130 or 143."""

    def __init__(self, config: uvicorn.Config, drain: Drain) -> None:
        super().__init__(config)
        self.drain = drain
        self.drain_until = 0.0

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.drain.draining or not self.drain.active:
            return super().handle_exit(sig, frame)
        self.drain.draining = True  # on_tick ends it when the last request is done
        self.drain_until = time.monotonic() + DRAIN_SECONDS

    async def on_tick(self, counter: int) -> bool:
        if self.drain.draining and (not self.drain.active or time.monotonic() > self.drain_until):
            self.should_exit = True
        return await super().on_tick(counter)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def serve_app(app: FastAPI, host: str, port: int) -> None:
    drain = Drain(app)
    config = uvicorn.Config(drain, host=host, port=port, log_level="warning", timeout_graceful_shutdown=60)
    DrainingServer(config, drain).run()
