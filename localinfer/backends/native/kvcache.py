"""Keys and values per sequence, for every layer.

Each sequence gets its own [n_layer, n_head_kv, n_ctx, row_bytes] byte arrays in anonymous
memory that the OS fills in lazily, 4 KiB at a time, so only the positions a sequence has
reached take resident memory.
A row (one position of one kv head) is stored in the cache's type, as llama.cpp stores it:
f16 halves (the default: half the memory of floats, and both engines attend over the same
numbers), or ggml's q8_0 / q4_0 blocks of 32 values (kv_row_bytes), for more context and
slots in the same memory. A kernel set may keep keys of some types in tiles of KEY_TILE
positions (its `tiled_keys`; the C set's f16 and q8_0 keys), so the cache's arrays hold
n_ctx rounded up to a whole tile (`capacity`), and copies, reads and writes go through the
rows of the tiles they touch (kv_rows_of, kv_tiles_of): the bytes read (the prompt
cache's) are rows whatever the layout.

A sliding-window layer (gemma3's local layers) only ever reads a sequence's last `window`
positions, so the cache gives the older ones' pages back to the OS as a sequence grows: it
keeps the last HELD_WINDOWS windows of those layers (the extra one so that a rollback of up
to a window, such as regenerating a reply, still finds what it needs) and every position of
the global layers. `floor` is a sequence's first position the local layers still hold; a
truncate or copy that would need a position below it keeps nothing instead (kv_truncate's
contract), and the runtime prefills again.
"""

from __future__ import annotations

import mmap

import numpy as np

from localinfer.backends.native.config import ModelConfig
from localinfer.errors import BackendError, ContextOverflow
from localinfer_native.types import KEY_TILE, kv_row_bytes, kv_rows_of, kv_tiles_of

HELD_WINDOWS = 2  # of a local layer's positions kept behind a sequence's newest
PAGE = mmap.PAGESIZE


def local_positions_held(window: int, n_ctx: int, n_batch: int) -> int:
    """The most positions a local layer holds at once: HELD_WINDOWS windows behind a batch's
    first row, up to half a window not yet given back (it goes in steps), and the batch."""
    return min(n_ctx, HELD_WINDOWS * window + window // 2 + n_batch)


def lazy_zeros(size: int) -> mmap.mmap:
    """Zeros that take RAM only where written. Not np.zeros: numpy asks for 2 MiB
    huge pages on big arrays, and one write per layer and head would then make 2 MiB each
    resident (hundreds of MB for a cache that holds a few tokens)."""
    # Private, so the pages count as the process's own (RssAnon), not as shared memory.
    buf = mmap.mmap(-1, size, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS) if hasattr(mmap, "MAP_PRIVATE") else mmap.mmap(-1, size)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        buf.madvise(mmap.MADV_NOHUGEPAGE)
    return buf


class KVCache:
    def __init__(
        self, config: ModelConfig, n_ctx: int, n_seq_max: int, types: tuple[str, str] = ("f16", "f16"), tiled_keys: frozenset[str] = frozenset()
    ) -> None:  # fmt: skip
        self.n_ctx, self.n_seq_max, self.types = n_ctx, n_seq_max, types
        self.capacity = -(-n_ctx // KEY_TILE) * KEY_TILE  # positions each array holds: whole tiles
        self._tiled = (types[0] in tiled_keys, False)  # K, V
        rows = (config.n_layer, config.n_head_kv, self.capacity)
        self._shapes = tuple((*rows, kv_row_bytes(t, config.head_dim)) for t in types)  # K, V
        self.window = config.window if any(config.local_layers) and config.window < n_ctx else 0
        self._local = np.array(config.local_layers, dtype=bool) if self.window else np.zeros(config.n_layer, dtype=bool)
        per_layer = config.n_head_kv * sum(shape[3] for shape in self._shapes)
        self._bytes_local = int(self._local.sum()) * per_layer  # per position held
        self._bytes_global = (config.n_layer - int(self._local.sum())) * per_layer
        self.keys: dict[int, np.ndarray] = {}
        self.values: dict[int, np.ndarray] = {}
        self._buffers: dict[int, tuple[mmap.mmap, mmap.mmap]] = {}
        self.length: dict[int, int] = {}
        self.floor: dict[int, int] = {}  # the first position the local layers still hold
        self._layers: dict[int, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        self.peak_bytes = 0  # the most the cache has held at once

    def sequence(self, seq_id: int) -> tuple[np.ndarray, np.ndarray]:
        if seq_id not in self.keys:
            if not 0 <= seq_id < self.n_seq_max:
                raise BackendError(f"sequence id {seq_id} is out of range (n_seq_max {self.n_seq_max})")
            buffers = tuple(lazy_zeros(int(np.prod(shape))) for shape in self._shapes)
            self._buffers[seq_id] = buffers  # type: ignore[assignment]
            self.keys[seq_id], self.values[seq_id] = (np.frombuffer(b, np.uint8).reshape(s) for b, s in zip(buffers, self._shapes))
            self.length[seq_id] = self.floor[seq_id] = 0
        return self.keys[seq_id], self.values[seq_id]

    def layers(self, seq_id: int) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Per-layer views of a sequence's keys and values, made once (kernels cache their pointers)."""
        views = self._layers.get(seq_id)
        if views is None:
            keys, values = self.sequence(seq_id)
            views = self._layers[seq_id] = (list(keys), list(values))
        return views

    def reserve(self, seq_id: int, positions: np.ndarray) -> None:
        """Check that a batch's positions fit, note how far the sequence now reaches, and let
        the local layers' positions no query of this batch or later can see go."""
        end, first = int(positions.max()) + 1, int(positions.min())
        if end > self.n_ctx:
            raise ContextOverflow(f"the KV cache is full (context {self.n_ctx} tokens); raise --ctx")
        self.sequence(seq_id)
        if not self._resumable(seq_id, first):
            raise BackendError(f"sequence {seq_id}'s positions before {self.floor[seq_id] + self.window - 1} are no longer cached")
        self.length[seq_id] = max(self.length[seq_id], end)
        floor = first - HELD_WINDOWS * self.window
        if self.window and floor - self.floor[seq_id] >= max(1, self.window // 2):  # in steps, not a syscall a token
            self._release(seq_id, floor)
        self.peak_bytes = max(self.peak_bytes, self.used_bytes())

    def _resumable(self, seq_id: int, n: int) -> bool:
        """Do the local layers hold what a query at position n sees (positions n - window + 1 on)?"""
        floor = self.floor.get(seq_id, 0)
        return floor == 0 or n >= floor + self.window - 1

    def _release(self, seq_id: int, floor: int) -> None:
        """Give back the pages of the local layers' positions before `floor`."""
        self.floor[seq_id] = floor
        if not hasattr(mmap, "MADV_DONTNEED"):
            return
        n_head, below = self._shapes[0][1], floor // KEY_TILE * KEY_TILE  # a tile's bytes mix its positions
        for buf, shape in zip(self._buffers[seq_id], self._shapes):
            row_bytes = shape[3]
            for layer in np.flatnonzero(self._local):
                for head in range(n_head):
                    region = (int(layer) * n_head + head) * self.capacity * row_bytes
                    start, stop = -(-region // PAGE) * PAGE, (region + below * row_bytes) // PAGE * PAGE
                    if stop > start:
                        buf.madvise(mmap.MADV_DONTNEED, start, stop - start)

    def clear(self, seq_id: int) -> None:
        self.length[seq_id] = self.floor[seq_id] = 0

    def truncate(self, seq_id: int, n_keep: int) -> int:
        if seq_id not in self.length:
            return 0
        if not self._resumable(seq_id, n_keep):
            self.clear(seq_id)
            return 0
        self.length[seq_id] = min(self.length[seq_id], n_keep)
        return n_keep

    def copy(self, src: int, dst: int, n_tokens: int) -> int:
        if src == dst:
            return min(n_tokens, self.length.get(src, 0))
        sk, sv = self.sequence(src)
        dk, dv = self.sequence(dst)
        n, floor = min(n_tokens, self.length[src]), self.floor[src]
        if not self._resumable(src, n):
            return 0
        glob = ~self._local
        for source, target, kv_type, tiled in zip((sk, sv), (dk, dv), self.types, self._tiled):
            for layers, lo in ((glob, 0), (self._local, floor)):  # below floor: pages given back
                if lo < n:
                    self._put(target, kv_type, tiled, lo, self._get(source, kv_type, tiled, lo, n)[layers], layers)
        # dst's local positions from src's floor up to n are written again; its own past n
        # are held where they were at or above its old floor
        self.floor[dst] = floor if n >= self.floor[dst] else max(self.floor[dst], floor)
        self.length[dst] = max(self.length[dst], n)
        return n

    def read(self, seq_id: int, start: int, end: int) -> bytes:
        """Positions [start, end) of every layer, keys then values (the prompt cache's bytes)."""
        arrays = zip(self.sequence(seq_id), self.types, self._tiled)
        return b"".join(self._get(array, kv_type, tiled, start, end).tobytes() for array, kv_type, tiled in arrays)

    @staticmethod
    def _get(array: np.ndarray, kv_type: str, tiled: bool, lo: int, hi: int) -> np.ndarray:
        """Positions [lo, hi) of every layer and head as rows, uint8 [layers, heads, n, row bytes]."""
        t0, t1 = lo // KEY_TILE * KEY_TILE, -(-hi // KEY_TILE) * KEY_TILE  # the whole tiles they sit in
        return kv_rows_of(array[:, :, t0:t1], kv_type, tiled)[:, :, lo - t0 : hi - t0]

    @staticmethod
    def _put(array: np.ndarray, kv_type: str, tiled: bool, lo: int, rows: np.ndarray, layers: np.ndarray | slice = slice(None)) -> None:
        """rows ([layers, heads, n, row bytes]) at positions lo on of `layers`; the other
        positions of the tiles they touch are kept."""
        hi = lo + rows.shape[2]
        if not tiled:
            array[layers, :, lo:hi] = rows
            return
        t0, t1 = lo // KEY_TILE * KEY_TILE, -(-hi // KEY_TILE) * KEY_TILE
        whole = kv_rows_of(array[layers, :, t0:t1], kv_type, tiled)  # a copy: tiles are rearranged
        whole[:, :, lo - t0 : hi - t0] = rows
        array[layers, :, t0:t1] = kv_tiles_of(whole, kv_type, tiled)

    def write(self, seq_id: int, start: int, data: bytes) -> int:
        """Bytes `read` gave, back at positions start on, after the sequence's first `start`;
        the positions it then holds (`start` if they are not this cache's layout or do not fit)."""
        keys, values = self.sequence(seq_id)
        per_position = sum(int(np.prod(a.shape[:2])) * a.shape[3] for a in (keys, values))
        n = len(data) // per_position
        if self.length[seq_id] != start or n * per_position != len(data) or not 0 < start + n <= self.n_ctx or not self._resumable(seq_id, start):
            return self.length[seq_id]
        split = int(np.prod(keys.shape[:2])) * keys.shape[3] * n
        for array, part, kv_type, tiled in zip((keys, values), (data[:split], data[split:]), self.types, self._tiled):
            self._put(array, kv_type, tiled, start, np.frombuffer(part, np.uint8).reshape(*array.shape[:2], n, array.shape[3]))
        self.length[seq_id] = start + n
        self.peak_bytes = max(self.peak_bytes, self.used_bytes())
        return start + n

    def used_bytes(self) -> int:
        """What the sequences' positions take: every layer's up to their length, less the
        local layers' positions already given back."""
        return sum(n * self._bytes_global + (n - self.floor[s]) * self._bytes_local for s, n in self.length.items())
