"""The chat app's threads: the model's run at ordinary priority, the UI's give way to them.

On a small machine the decode's threads want every core, and an OpenMP team waits at each
barrier for its slowest thread: every millisecond the UI draws on one of those cores stalls
the whole token. At equal priority the app decoded at 0.84× of `run` on 2 cores; with the
UI's threads niced (UI_NICE) the kernel runs the decode first and the UI in what is left
(docs/benchmarks.md, "The chat app in a real terminal").

Linux gives a new thread the nice value of the thread that starts it, and an unprivileged
thread cannot lower its nice value again. So the model's threads (the load, the Engine's
owner thread, their OpenMP or ggml teams) are started from a thread that is never niced:
ModelThreads.run.
"""

from __future__ import annotations

import os
import queue
import sys
import threading
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

UI_NICE = 15  # 10 left the app at 0.90× of `run`, 19 drew in bursts up to half a second apart (docs/benchmarks.md)


class ModelThreads:
    """Runs loads on threads started by a thread of its own, which keeps the priority of the
    thread that built it, whatever later becomes of that thread's."""

    def __init__(self) -> None:
        self._orders: queue.SimpleQueue[threading.Thread | None] = queue.SimpleQueue()
        self._starter = threading.Thread(target=self._start_each, name="localinfer-starter", daemon=True)
        self._starter.start()

    @property
    def starter_id(self) -> int | None:
        return self._starter.native_id

    def _start_each(self) -> None:
        while (thread := self._orders.get()) is not None:
            thread.start()

    def run(self, load: Callable[..., T], *args: object) -> T:
        """`load(*args)` on a new thread that ends when it returns; its exception raised here.

        A thread that ends, because libgomp keeps a pool of threads for every thread that
        ever ran a parallel loop (loading does: the native engine packs its weights, llama.cpp
        warms up) for as long as that thread lives. On a pooled worker thread that pool
        outlived the load, libgomp then counted more of its threads than cores and cut its
        spin-waits to almost nothing in the engine's own parallel loops: the decode ran at
        half speed (0.45-0.55× of `run`)."""
        result: list[T] = []
        failed: list[BaseException] = []
        done = threading.Event()

        def target() -> None:
            try:
                result.append(load(*args))
            except BaseException as e:  # noqa: BLE001 - raised again on the caller's thread
                failed.append(e)
            finally:
                done.set()

        thread = threading.Thread(target=target, name="localinfer-load")
        self._orders.put(thread)
        done.wait()
        thread.join()
        if failed:
            raise failed[0]
        return result[0]

    def close(self) -> None:
        self._orders.put(None)


def give_way(nice: int, keep: set[int | None]) -> None:
    """Raise the nice value of every thread of this process but those in `keep` (native ids)
    to `nice`; threads they start later inherit it. Linux only: elsewhere a thread's nice
    value is not its own, and this does nothing."""
    if not nice or sys.platform != "linux":
        return
    for thread in threading.enumerate():
        if thread.native_id not in keep:
            try:
                os.setpriority(os.PRIO_PROCESS, thread.native_id, nice)
            except OSError:  # the thread ended meanwhile
                pass
