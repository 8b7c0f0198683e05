"""One writer at a time per model folder, across processes.

Two `localinfer pull`s of the same model would append to the same `.partial` file, and an
`rm` during a pull could leave a manifest that points at nothing. Both take an exclusive
advisory lock (flock) on a file in the model's folder first; the second waits, and says so.
The lock goes with the process, so a killed pull never leaves the store locked.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_NAME = ".localinfer.lock"


@contextlib.contextmanager
def model_lock(folder: Path, waiting: Callable[[str], None] | None = None) -> Iterator[None]:
    try:
        import fcntl
    except ImportError:  # Windows: no flock; one writer at a time is then up to the user
        yield
        return
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if waiting:
                waiting(f"another localinfer is writing {folder.name}; waiting for it to finish")
            fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing releases the lock
