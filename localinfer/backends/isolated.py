"""A backend in a child process of its own, for a library that ends its process when it
fails: llama.cpp aborts the process when an RPC worker stops answering (ggml-rpc.cpp's
RPC_STATUS_ASSERT), which would take the server and every other request with it. In a child,
that abort ends only the child: each call after it raises BackendLost, which the Engine turns
into an error for the running requests and a 503 with the reason from /health.

Every Backend call is sent over a pipe and answered there; the vocabulary and the model's
facts come once, at load, and token bytes are remembered, so what crosses per step is the
batch and its logits.
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import numpy as np

from localinfer.backends import get_backend
from localinfer.backends.base import Backend, Batch, Capabilities, LoadParams, ModelFacts, VocabInfo
from localinfer.errors import BackendError, BackendLost


def _child(conn: Any, engine: str, path: Path, params: LoadParams, log: str) -> None:
    """The child: load, then answer calls until told to close or the parent goes."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole process group: the parent decides what it stops
    parent = multiprocessing.parent_process()
    if parent is not None:  # a parent killed outright: end at once, not after the forward under way
        threading.Thread(target=lambda: (parent.join(), os._exit(1)), daemon=True).start()
    os.environ["GGML_NO_BACKTRACE"] = "1"  # ggml's abort would otherwise attach a debugger first
    if not params.verbose:  # llama.cpp's messages, its abort's among them, to a file the parent reads
        fd = os.open(log, os.O_WRONLY | os.O_APPEND)
        os.dup2(fd, 2)
        os.close(fd)
    try:
        backend = get_backend(engine).load(path, params)
    except Exception as e:  # noqa: BLE001 - the parent raises it
        conn.send(("error", _portable(e)))
        return
    conn.send(("ok", (backend.vocab, backend.facts, backend.runtime_report())))
    while True:
        try:
            method, args = conn.recv()
        except (EOFError, OSError):
            break
        try:
            conn.send(("ok", getattr(backend, method)(*args)))
        except Exception as e:  # noqa: BLE001
            conn.send(("error", _portable(e)))
        if method == "close":
            break


def _portable(e: Exception) -> Exception:
    """The exception itself where it pickles (every UserError does), else a BackendError."""
    import pickle

    try:
        pickle.dumps(e)
        return e
    except Exception:  # noqa: BLE001
        return BackendError(f"{type(e).__name__}: {e}")


class IsolatedBackend(Backend):
    """`engine`'s backend, loaded and run in a child process."""

    name = "isolated"

    def __init__(self, engine: str, path: Path, params: LoadParams, explain: Callable[[], str] | None = None) -> None:
        self.name = engine  # type: ignore[misc]  # what `run --json`, /v1/models and the chat's status line name: the engine it runs
        self._explain = explain  # more to say when the child is gone (which worker stopped answering)
        self._lock = threading.Lock()
        self._lost: str | None = None
        self._pieces: dict[int, bytes] = {}
        self._log = tempfile.NamedTemporaryFile(prefix="localinfer-engine-", suffix=".log", delete=False)
        context = multiprocessing.get_context("spawn")  # never fork a process with threads
        self._conn, child_end = context.Pipe()
        self._process = context.Process(target=_child, args=(child_end, engine, path, params, self._log.name), daemon=True, name=f"localinfer {engine}")
        with _process_std_streams():
            self._process.start()
        child_end.close()
        try:
            self._vocab, self._facts, self._report = self._receive()
        except BaseException:
            self.close()
            raise

    @classmethod
    def capabilities(cls) -> Capabilities:
        raise NotImplementedError("ask the engine it runs: get_backend(engine).capabilities()")

    @classmethod
    def load(cls, path: Path, params: LoadParams) -> Backend:
        raise NotImplementedError("IsolatedBackend(engine, path, params)")

    @property
    def vocab(self) -> VocabInfo:
        return self._vocab

    @property
    def facts(self) -> ModelFacts:
        return self._facts

    def runtime_report(self) -> dict[str, object]:
        return self._report

    def _call(self, method: str, *args: object) -> Any:
        with self._lock:
            if self._lost:
                raise BackendLost(self._lost)
            try:
                self._conn.send((method, args))
            except (OSError, ValueError):
                pass  # the child is gone: _receive says why
            return self._receive()

    def _receive(self) -> Any:
        while not self._conn.poll(0.5):
            if not self._process.is_alive():
                raise self._lose()
        try:
            status, value = self._conn.recv()
        except (EOFError, OSError):
            raise self._lose() from None
        if status == "error":
            raise value
        return value

    def _lose(self) -> BackendLost:
        self._process.join(5)
        code = self._process.exitcode
        how = f"signal {-code}" if code is not None and code < 0 else f"code {code}"
        said = _last_message(Path(self._log.name))
        reason = f"the model's engine process ended ({how}){f': {said}' if said else ''}"
        if self._explain is not None:
            reason += f"; {self._explain()}"
        self._lost = reason
        return BackendLost(reason)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._call("tokenize", text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        piece = self._pieces.get(token)
        if piece is None:
            piece = self._pieces[token] = self._call("token_bytes", token)
        return piece

    def forward(self, batch: Batch) -> np.ndarray:
        return self._call("forward", batch)

    def embed(self, batch: Batch) -> np.ndarray:
        return self._call("embed", batch)

    def kv_clear(self, seq_id: int) -> None:
        self._call("kv_clear", seq_id)

    def kv_truncate(self, seq_id: int, n_keep: int) -> int:
        return self._call("kv_truncate", seq_id, n_keep)

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        return self._call("kv_copy", src_seq, dst_seq, n_tokens)

    def kv_read(self, seq_id: int, start: int, end: int) -> bytes:
        return self._call("kv_read", seq_id, start, end)

    def kv_write(self, seq_id: int, start: int, data: bytes) -> int:
        return self._call("kv_write", seq_id, start, data)

    def close(self) -> None:
        """Close the backend in the child, then end the child; safe to call twice."""
        if self._process.is_alive() and not self._lost:
            try:
                with self._lock:
                    self._conn.send(("close", ()))
                    self._conn.poll(10) and self._conn.recv()
            except (OSError, EOFError, ValueError):
                pass
        self._process.join(5)
        if self._process.is_alive():
            self._process.kill()
            self._process.join()
        self._conn.close()
        self._log.close()
        Path(self._log.name).unlink(missing_ok=True)

    def __del__(self) -> None:
        if hasattr(self, "_process"):
            self.close()


@contextmanager
def _process_std_streams() -> Iterator[None]:
    """The process's own stdout and stderr while a child starts: multiprocessing hands
    stderr's file descriptor to its helper process, and an app that replaced sys.stderr (the
    chat app's Textual does) gives -1, which fails the start ("bad value(s) in fds_to_keep")."""
    replaced = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = sys.__stdout__ or sys.stdout, sys.__stderr__ or sys.stderr
    try:
        yield
    finally:
        sys.stdout, sys.stderr = replaced


def _last_message(log: Path) -> str:
    """The last line of llama.cpp's log that says why it stopped (an abort's message)."""
    try:
        lines = [line.strip() for line in log.read_text(errors="replace").splitlines() if line.strip()]
    except OSError:
        return ""
    for line in reversed(lines):
        if "error" in line.lower() or "abort" in line.lower() or "assert" in line.lower() or "crashed" in line.lower():
            return line.split(": ", 1)[-1] if line.startswith("/") else line
    return ""
