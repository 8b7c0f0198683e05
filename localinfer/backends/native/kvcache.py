"""Keys and values per sequence, for every layer.

Each sequence gets its own [n_layer, n_head_kv, n_ctx, row_bytes] byte arrays in anonymous
memory that the OS fills in lazily, 4 KiB at a time, so only the positions a sequence has
reached take resident memory.
A row (one position of one kv head) is stored in the cache's type, as llama.cpp stores it:
f16 halves (the default: half the memory of floats, and both engines attend over the same
numbers), or ggml's q8_0 / q4_0 blocks of 32 values (kv_row_bytes), for more context and
slots in the same memory.
"""

from __future__ import annotations

import mmap

import numpy as np

from localinfer.backends.native.config import ModelConfig
from localinfer.errors import BackendError, ContextOverflow
from localinfer_native.types import kv_row_bytes


def lazy_zeros(shape: tuple[int, ...], dtype: type = np.uint8) -> np.ndarray:
    """Zeros that take RAM only where written. Not np.zeros: numpy asks for 2 MiB
    huge pages on big arrays, and one write per layer and head would then make 2 MiB each
    resident (hundreds of MB for a cache that holds a few tokens)."""
    size = int(np.prod(shape)) * np.dtype(dtype).itemsize
    # Private, so the pages count as the process's own (RssAnon), not as shared memory.
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if hasattr(mmap, "MAP_PRIVATE") else mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(buf, dtype=dtype).reshape(shape)


class KVCache:
    def __init__(self, config: ModelConfig, n_ctx: int, n_seq_max: int, types: tuple[str, str] = ("f16", "f16")) -> None:
        self.n_ctx, self.n_seq_max, self.types = n_ctx, n_seq_max, types
        rows = (config.n_layer, config.n_head_kv, n_ctx)
        self._shapes = tuple((*rows, kv_row_bytes(t, config.head_dim)) for t in types)  # K, V
        self._bytes_per_position = config.n_layer * config.n_head_kv * sum(shape[3] for shape in self._shapes)
        self.keys: dict[int, np.ndarray] = {}
        self.values: dict[int, np.ndarray] = {}
        self.length: dict[int, int] = {}
        self._layers: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.peak_bytes = 0  # the most the cache has held at once

    def sequence(self, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
        if seq_id not in self.keys:
            if not 0 <= seq_id < self.n_seq_max:
                raise BackendError(f"sequence id {seq_id} is out of range (n_seq_max {self.n_seq_max})")
            self.keys[seq_id] = lazy_zeros(self._shapes[0])
            self.values[seq_id] = lazy_zeros(self._shapes[1])
            self.length[seq_id] = 0
        return self.keys[seq_id], self.values[seq_id]

    def layers(self, seq_id: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per-layer views of a sequence's keys and values, made once (kernels cache their pointers)."""
        views = self._layers.get(seq_id)
        if views is None:
            keys, values = self.sequence(seq_id)
            views = self._layers[seq_id] = (list(keys), list(values))
        return views

    def reserve(self, seq_id: int, positions: np.ndarray) -> None:
        """Check that a batch's positions fit, and note how far the sequence now reaches."""
        end = int(positions.max()) + 1
        if end > self.n_ctx:
            raise ContextOverflow(f"the KV cache is full (context {self.n_ctx} tokens); raise --ctx")
        self.sequence(seq_id)
        self.length[seq_id] = max(self.length[seq_id], end)
        self.peak_bytes = max(self.peak_bytes, self.used_bytes())

    def clear(self, seq_id: int) -> None:
        self.length[seq_id] = 0

    def truncate(self, seq_id: int, n_keep: int) -> None:
        if seq_id in self.length:
            self.length[seq_id] = min(self.length[seq_id], n_keep)

    def copy(self, src: int, dst: int, n_tokens: int) -> None:
        if src == dst:
            return
        n = min(n_tokens, self.length.get(src, 0))
        sk, sv = self.sequence(src)
        dk, dv = self.sequence(dst)
        dk[:, :, :n] = sk[:, :, :n]
        dv[:, :, :n] = sv[:, :, :n]
        self.length[dst] = max(self.length[dst], n)

    def used_bytes(self) -> int:
        return sum(self.length.values()) * self._bytes_per_position
