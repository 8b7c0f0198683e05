"""The prompt cache's disk tier: one file per KV block, in a folder per cache identity
(model file, engine layout, KV types, block size), kept under a byte budget.

A block file is a magic line, a JSON header (the identity, the block's chained hash, its
token count and the SHA-256 of its bytes) and the bytes. Files are written whole under a
temporary name and renamed, so a reader, in this process or another one sharing the folder,
never sees half a file. A file whose header, identity, hash, length or checksum does not
match is never loaded: it is deleted, with one warning line. Writes happen on a thread of
their own and never stall the engine; a full or read-only disk stops disk caching with one
line, and the engine goes on without it. Least recently used files (by modification time,
which a read refreshes) go first when the folder is over its budget.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from localinfer.paths import write_atomic

MAGIC = b"LOCALINFER-KV-BLOCK 1\n"
SUFFIX = ".kvb"
IDENTITY_FILE = "identity.json"
QUEUE_BLOCKS = 64  # blocks waiting to be written; past that a new one is not written (never a stall)


@dataclass
class DiskStats:
    files: int = 0
    bytes: int = 0
    evictions: int = 0
    corrupt: int = 0


def encode(identity: str, block_hash: str, n_tokens: int, data: bytes) -> bytes:
    header = json.dumps({"identity": identity, "block": block_hash, "tokens": n_tokens, "sha256": hashlib.sha256(data).hexdigest()}).encode()
    return MAGIC + len(header).to_bytes(4, "little") + header + data


def decode(raw: bytes, identity: str, block_hash: str) -> bytes | None:
    """The block's bytes, or None if the file is not that block of that identity, whole."""
    if not raw.startswith(MAGIC) or len(raw) < len(MAGIC) + 4:
        return None
    at = len(MAGIC) + 4
    n = int.from_bytes(raw[len(MAGIC) : at], "little")
    try:
        header = json.loads(raw[at : at + n])
    except ValueError:
        return None
    data = raw[at + n :]
    ok = isinstance(header, dict) and header.get("identity") == identity and header.get("block") == block_hash
    return data if ok and header.get("sha256") == hashlib.sha256(data).hexdigest() else None


class BlockFiles:
    """One identity's folder of block files, under `budget` bytes for the whole cache folder."""

    def __init__(self, root: Path, identity: str, describe: dict[str, object], budget: int, warn: Callable[[str], None]) -> None:
        self.root, self.identity, self.budget, self._warn = root, identity, budget, warn
        self.folder = root / identity[:32]
        self.stats = DiskStats()
        self._queue: queue.Queue[tuple[str, int, bytes] | None] = queue.Queue(QUEUE_BLOCKS)
        self._writable = True
        self._lock = threading.Lock()
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
            if not (self.folder / IDENTITY_FILE).exists():
                write_atomic(self.folder / IDENTITY_FILE, json.dumps({"identity": identity, **describe}, indent=1).encode())
        except OSError as e:
            self._stop_writing(e)
        self._rescan()
        self._thread = threading.Thread(target=self._writer, name="localinfer-prompt-cache", daemon=True)
        self._thread.start()

    def path(self, block_hash: str) -> Path:
        return self.folder / f"{block_hash}{SUFFIX}"

    def has(self, block_hash: str) -> bool:
        return self.path(block_hash).exists()

    def read(self, block_hash: str) -> bytes | None:
        """The block's bytes if its file is there and whole; a bad file is deleted, with one line."""
        path = self.path(block_hash)
        try:
            raw = path.read_bytes()
        except OSError:  # not there, or another process evicted it just now
            return None
        data = decode(raw, self.identity, block_hash)
        if data is None:
            self.stats.corrupt += 1
            self._warn(f"prompt cache: {path.name} is damaged or not this model's; deleted it, and the prompt is computed again")
            path.unlink(missing_ok=True)
            return None
        try:
            os.utime(path)  # recently used: evicted last
        except OSError:
            pass
        return data

    def write(self, block_hash: str, n_tokens: int, data: bytes) -> None:
        """Queue a block for the writer thread; dropped if the queue is full or writing stopped."""
        if self._writable and not self.has(block_hash):
            try:
                self._queue.put_nowait((block_hash, n_tokens, data))
            except queue.Full:
                pass

    def flush(self, timeout: float = 30.0) -> None:
        """Wait until every queued block is written (tests, and a clean exit)."""
        if self._thread.is_alive():
            done = threading.Event()
            self._queue.put((None, 0, done))  # type: ignore[arg-type]
            done.wait(timeout)

    def close(self) -> None:
        """Write what is queued, then end the writer; safe to call twice."""
        self.flush()
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(5)

    def _writer(self) -> None:
        while (item := self._queue.get()) is not None:
            block_hash, n_tokens, data = item
            if block_hash is None:
                data.set()  # type: ignore[attr-defined]  # flush's marker
                continue
            if not self._writable:
                continue
            raw = encode(self.identity, block_hash, n_tokens, data)
            try:
                write_atomic(self.path(block_hash), raw, durable=False)  # a torn file fails its checksum: no fsync per block
            except OSError as e:
                self._stop_writing(e)
                continue
            with self._lock:
                self.stats.files += 1
                self.stats.bytes += len(raw)
            if self.stats.bytes > self.budget:
                self._evict()

    def _stop_writing(self, e: OSError) -> None:
        if self._writable:
            self._writable = False
            self._warn(f"prompt cache: cannot write to {self.root} ({e.strerror or e}); blocks stay in RAM only from now on")

    def _files(self) -> list[tuple[float, int, Path]]:
        """(mtime, size, path) of every block file of every identity under the root."""
        found = []
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            found.append((st.st_mtime, st.st_size, path))
        return found

    def _rescan(self) -> None:
        files = self._files()
        with self._lock:
            self.stats.files, self.stats.bytes = len(files), sum(size for _, size, _ in files)

    def _evict(self) -> None:
        """Delete the least recently used files until the folder is at 90 % of its budget."""
        files = sorted(self._files())
        total = sum(size for _, size, _ in files)
        for _, size, path in files:
            if total <= self.budget * 0.9:
                break
            path.unlink(missing_ok=True)
            total -= size
            self.stats.evictions += 1
        with self._lock:
            self.stats.files, self.stats.bytes = len([f for f in files if f[2].exists()]), total


@dataclass
class CacheFolder:
    """One identity's folder, as `localinfer cache` lists it."""

    folder: Path
    identity: dict[str, object]
    blocks: int
    bytes: int
    last_used: float  # the newest block's modification time (0: none)


def folders(root: Path) -> list[CacheFolder]:
    """Every identity's folder under the cache root, most recently used first."""
    found = []
    for folder in sorted(p for p in root.glob("*") if p.is_dir()) if root.is_dir() else []:
        try:
            identity = json.loads((folder / IDENTITY_FILE).read_text())
        except (OSError, ValueError):
            identity = {}
        stats = [p.stat() for p in folder.glob(f"*{SUFFIX}")]
        found.append(CacheFolder(folder, identity if isinstance(identity, dict) else {}, len(stats), sum(s.st_size for s in stats), max((s.st_mtime for s in stats), default=0.0)))
    return sorted(found, key=lambda f: -f.last_used)


def clear(root: Path) -> tuple[int, int]:
    """Delete every block file and identity folder under the root: (files, bytes) freed."""
    files = size = 0
    for entry in folders(root):
        for path in entry.folder.glob("*"):
            try:
                size += path.stat().st_size if path.suffix == SUFFIX else 0
                files += path.suffix == SUFFIX
                path.unlink()
            except OSError:
                pass
        try:
            entry.folder.rmdir()
        except OSError:
            pass
    return files, size
