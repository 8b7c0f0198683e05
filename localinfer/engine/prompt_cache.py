"""The prompt cache: KV blocks shared across requests, kept in RAM and on disk, across restarts.

A sequence's tokens are cut into blocks of BLOCK_TOKENS; each block is keyed by a hash
chained over everything before it (the cache's identity: model file, engine layout, KV
types, block size; then every token so far), as vLLM's automatic prefix caching keys its
blocks. So one key names one prefix exactly, and a new prompt's longest run of cached keys
is the longest prefix whose KV can be put back instead of computed (engine.py does that,
through the backend's kv_read / kv_write; only the backend knows what the bytes hold). A
prompt's last, partial block is kept too, under a key of its own (`tail_key`), so that the
same prompt asked again is put back but for its last token.

Two tiers: RAM, a byte budget with least-recently-used eviction; and disk
(store/block_files.py), where every new block is also written, off the engine's thread, so
that it outlives the process. A block read from disk comes back into RAM.
"""

from __future__ import annotations

import hashlib
import json
import os
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from localinfer.store.block_files import BlockFiles

BLOCK_TOKENS = 256
FORMAT = 1  # of the identity and block files: a change makes old caches another identity
GiB = 1024**3
DEFAULT_DISK = 4 * GiB
INLINE_HASH_BYTES = 256 << 20  # model files hashed at load; larger ones on a thread (until then nothing is cached)


def default_ram() -> int:
    """A modest share of free RAM: 5 %, at most 2 GiB."""
    import psutil

    return min(2 * GiB, psutil.virtual_memory().available // 20)


@dataclass(frozen=True)
class CacheOptions:
    """What the command line asked for (`--cache-ram`, `--cache-disk`, `--cache-dir`,
    `--no-prompt-cache`); None: the default."""

    enabled: bool = True
    ram_bytes: int | None = None
    disk_bytes: int | None = None
    folder: Path | None = None  # default: paths.prompt_cache_dir()


@dataclass
class CacheStats:
    """For /metrics and tests: blocks found per tier, not found, stored, evicted from RAM."""

    hits: dict[str, int] = field(default_factory=lambda: {"ram": 0, "disk": 0})
    misses: int = 0
    stored: int = 0
    ram_evictions: int = 0


def file_sha256(path: Path, remembered: Path) -> str:
    """The model file's SHA-256, computed once and remembered (in `remembered`, a JSON file
    beside the cache) with the file's size and modification time, which must still match."""
    st = path.stat()
    key, stamp = str(path.resolve()), [st.st_size, st.st_mtime_ns]
    try:
        known = json.loads(remembered.read_text())
    except (OSError, ValueError):
        known = {}
    entry = known.get(key) if isinstance(known, dict) else None
    if isinstance(entry, dict) and entry.get("stamp") == stamp and isinstance(entry.get("sha256"), str):
        return entry["sha256"]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    known = known if isinstance(known, dict) else {}
    known[key] = {"stamp": stamp, "sha256": digest.hexdigest()}
    try:
        from localinfer.paths import write_atomic

        write_atomic(remembered, json.dumps(known, indent=1).encode())
    except OSError:
        pass  # computed again next time
    return known[key]["sha256"]


def block_hashes(identity: str, tokens: list[int], block: int = BLOCK_TOKENS, known: list[str] | None = None) -> list[str]:
    """The chained key of every whole block of `tokens`; `known` (keys of a prefix of them)
    is extended rather than computed again."""
    keys = list(known or [])[: len(tokens) // block]
    previous = keys[-1] if keys else identity
    for start in range(len(keys) * block, len(tokens) // block * block, block):
        h = hashlib.blake2b(previous.encode(), digest_size=16)
        h.update(np.asarray(tokens[start : start + block], dtype=np.int32).tobytes())
        previous = h.hexdigest()
        keys.append(previous)
    return keys


def tail_key(previous: str, tokens: list[int]) -> str:
    """The key of a prompt's last, partial block: a prompt asked again is then put back whole
    but for its last token, not only to its last whole block (up to 255 tokens short)."""
    h = hashlib.blake2b(b"tail:" + previous.encode(), digest_size=16)
    h.update(np.asarray(tokens, dtype=np.int32).tobytes())
    return h.hexdigest()


class PromptCache:
    """The two tiers behind one get/put, for one model loaded one way (`identity`)."""

    def __init__(self, describe: dict[str, object], model: Path, ram_bytes: int, disk_bytes: int, folder: Path | None,
                 warn: Callable[[str], None], block: int = BLOCK_TOKENS) -> None:  # fmt: skip
        """`describe`: what else makes a block's bytes mean what they mean (the engine's
        layout, its KV types); the model file's hash joins it once computed (then remembered
        by size and modification time), for a large file on a thread of its own, so that
        loading it is not held up: until then nothing is cached."""
        self.block, self.ram_budget, self.folder = block, ram_bytes, folder
        self.stats = CacheStats()
        self.identity = ""
        self.disk: BlockFiles | None = None
        self._ram: OrderedDict[str, bytes] = OrderedDict()
        self._ram_bytes = 0
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._warn = warn
        if model.stat().st_size <= INLINE_HASH_BYTES:  # a fraction of a second: the first request already finds the cache
            self._identify(describe, model, disk_bytes)
        else:
            threading.Thread(target=self._identify, args=(describe, model, disk_bytes), name="localinfer-model-hash", daemon=True).start()

    def _identify(self, describe: dict[str, object], model: Path, disk_bytes: int) -> None:
        remembered = self.folder / "model-hashes.json" if self.folder is not None else Path(os.devnull)
        try:
            sha = file_sha256(model, remembered)
        except OSError as e:
            self._warn(f"prompt cache: cannot read {model} to identify it ({e.strerror or e}); nothing is cached")
            return
        full = {"format": FORMAT, "model_sha256": sha, "model": model.name, "block_tokens": self.block, **describe}
        self.identity = hashlib.blake2b(json.dumps(full, sort_keys=True).encode(), digest_size=16).hexdigest()
        if self.folder is not None and disk_bytes > 0:
            self.disk = BlockFiles(self.folder, self.identity, full, disk_bytes, self._warn)
        self._ready.set()

    @property
    def ready(self) -> bool:
        return self._ready.is_set()

    def wait_ready(self, timeout: float = 60.0) -> bool:
        return self._ready.wait(timeout)

    @property
    def ram_bytes(self) -> int:
        return self._ram_bytes

    def keys(self, tokens: list[int], known: list[str] | None = None) -> list[str]:
        return block_hashes(self.identity, tokens, self.block, known)

    def tail(self, keys: list[str], tokens: list[int]) -> str:
        """The key of `tokens`, the part of a prompt after its whole blocks (whose keys are `keys`)."""
        return tail_key(keys[-1] if keys else self.identity, tokens)

    def has(self, key: str) -> bool:
        return key in self._ram or (self.disk is not None and self.disk.has(key))

    def get(self, key: str) -> tuple[bytes, str] | None:
        """The block's bytes and the tier they came from ("ram" or "disk"), or None."""
        with self._lock:
            data = self._ram.get(key)
            if data is not None:
                self._ram.move_to_end(key)
                self.stats.hits["ram"] += 1
                return data, "ram"
        data = self.disk.read(key) if self.disk is not None else None
        if data is None:
            self.stats.misses += 1
            return None
        self.stats.hits["disk"] += 1
        self._keep(key, data)
        return data, "disk"

    def put(self, key: str, n_tokens: int, data: bytes) -> None:
        """A new block: into RAM, and queued for the disk."""
        self.stats.stored += 1
        self._keep(key, data)
        if self.disk is not None:
            self.disk.write(key, n_tokens, data)

    def discard(self, key: str) -> None:
        """A block the backend would not take back: gone from both tiers."""
        with self._lock:
            data = self._ram.pop(key, None)
            self._ram_bytes -= len(data) if data is not None else 0
        if self.disk is not None:
            self.disk.path(key).unlink(missing_ok=True)

    def _keep(self, key: str, data: bytes) -> None:
        if len(data) > self.ram_budget:
            return
        with self._lock:
            if key in self._ram:
                self._ram.move_to_end(key)
                return
            self._ram[key] = data
            self._ram_bytes += len(data)
            while self._ram_bytes > self.ram_budget:
                _, old = self._ram.popitem(last=False)
                self._ram_bytes -= len(old)
                self.stats.ram_evictions += 1

    def flush(self) -> None:
        """Wait for queued disk writes (tests; a clean exit)."""
        if self.disk is not None:
            self.disk.flush()

    def close(self) -> None:
        if self.disk is not None:
            self.disk.close()
