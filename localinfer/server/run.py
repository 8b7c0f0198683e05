"""Running the app under uvicorn, so that Ctrl-C and SIGTERM drain and exit 0."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import uvicorn
from fastapi import FastAPI


class DrainingServer(uvicorn.Server):
    """uvicorn stops accepting on Ctrl-C or SIGTERM, lets the requests in flight finish and
    runs the app's shutdown (which stops each engine), then re-raises the signal so that
    the process dies of it (exit 130 or 143). A drained shutdown is a clean one: exit 0."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        with super().capture_signals():
            yield
            self._captured_signals.clear()


def serve_app(app: FastAPI, host: str, port: int) -> None:
    DrainingServer(uvicorn.Config(app, host=host, port=port, log_level="warning", timeout_graceful_shutdown=60)).run()
