"""Noticing that a loaded model file was truncated under us.

Both engines read weights through a memory map of the file. If the file shrinks while it
is mapped, touching a page past the new end kills the process with SIGBUS: no Python error,
no message. Deleting or replacing the file is harmless (the mapping keeps the old inode), so
only the size of the file we hold open is watched: one fstat per step, about a microsecond.
A truncation that lands during a forward can still crash it; between steps it is caught.
"""

from __future__ import annotations

import os
from pathlib import Path


class ModelFileWatch:
    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        try:
            self._fd: int | None = os.open(self.path, os.O_RDONLY)
            self._size = os.fstat(self._fd).st_size
        except OSError:  # not a plain file we can open (a test double): nothing to watch
            self._fd = None

    def problem(self) -> str | None:
        """Why the model can no longer be run, or None."""
        if self._fd is None:
            return None
        size = os.fstat(self._fd).st_size
        if size < self._size:
            return f"the model file {self.path} was truncated while loaded ({self._size:,} -> {size:,} bytes); restart to load it again"
        return None

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
