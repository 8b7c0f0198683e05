"""One request's events, handed from the thread that runs the engine to whoever reads
them (the CLI's own thread, a chat app's worker, the server's event loop).

The engine only appends; a reader takes. `backlog` lets the scheduler hold back a
request whose reader has fallen behind, so unread events cannot grow without bound.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable

from localinfer.engine.types import CompletionOutput, TokenEvent

Event = TokenEvent | CompletionOutput


class RequestStream:
    def __init__(self, request_id: int) -> None:
        self.request_id = request_id
        self._events: deque[Event] = deque()
        self._ready = threading.Condition()
        self.on_event: Callable[[], None] | None = None  # e.g. an asyncio loop's call_soon_threadsafe wake-up

    def put(self, event: Event) -> None:
        with self._ready:
            self._events.append(event)
            self._ready.notify_all()
        if self.on_event is not None:
            self.on_event()

    def get(self, timeout: float | None = None) -> Event | None:
        """The next event, waiting up to `timeout` seconds (None: forever); None if none came."""
        with self._ready:
            if not self._events and not self._ready.wait_for(lambda: bool(self._events), timeout):
                return None
            return self._events.popleft()

    def get_nowait(self) -> Event | None:
        with self._ready:
            return self._events.popleft() if self._events else None

    @property
    def backlog(self) -> int:
        """Events put but not yet taken."""
        return len(self._events)
