"""The KV cache's own operations over both key layouts: rows (the Numba set) and tiles of
KEY_TILE positions (the C set's f16 and q8_0 keys). Writes, reads and copies that start and end inside
a tile must move exactly their positions, and the bytes read (the prompt cache's) are rows
either way, so a prompt cache file does not depend on the kernel set that wrote it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.native.config import ModelConfig
from localinfer.backends.native.kvcache import KVCache
from localinfer.modelfile import inspect
from localinfer_native.types import KEY_TILE

LAYOUTS = {"rows": frozenset(), "tiles": frozenset({"f16", "q8_0"})}


@pytest.fixture(scope="module")
def config(model_path: Path) -> ModelConfig:
    return ModelConfig.from_gguf(inspect(model_path))


def random_rows(cache: KVCache, n: int, rng: np.random.Generator) -> bytes:
    """n positions of every layer, keys then values, as `read` gives them: random bytes."""
    per_position = sum(int(np.prod(a.shape[:2])) * a.shape[3] for a in cache.sequence(0))
    return rng.integers(0, 256, size=n * per_position, dtype=np.uint8).tobytes()


@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "f16")], ids="/".join)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_positions_move_exactly_across_tile_edges(config: ModelConfig, layout: str, types: tuple[str, str]) -> None:
    cache = KVCache(config, 100, 2, types, LAYOUTS[layout])
    assert cache.capacity % KEY_TILE == 0 and cache.capacity >= 100
    rng = np.random.default_rng(3)
    first, more = random_rows(cache, 37, rng), random_rows(cache, 10, rng)
    assert cache.write(0, 0, first) == 37 and cache.write(0, 37, more) == 47
    assert cache.read(0, 0, 37) == first and cache.read(0, 37, 47) == more
    # a read from inside one tile to inside another is the matching part of each layer's rows
    whole, inner = as_arrays(cache, cache.read(0, 0, 47), 47), as_arrays(cache, cache.read(0, 5, 35), 30)
    for part, of_whole in zip(inner, whole):
        np.testing.assert_array_equal(part, of_whole[:, :, 5:35])
    # a copy of 21 positions into a sequence that already holds 30 keeps its own 21..29
    own = random_rows(cache, 30, rng)
    assert cache.write(1, 0, own) == 30
    assert cache.copy(0, 1, 21) == 21
    assert cache.read(1, 0, 21) == cache.read(0, 0, 21)
    assert cache.read(1, 21, 30) == KVCache.read(_fresh(config, types, layout, own), 0, 21, 30)


def as_arrays(cache: KVCache, data: bytes, n: int) -> tuple[np.ndarray, np.ndarray]:
    """`read`'s bytes of n positions as keys and values, uint8 [layers, heads, n, row bytes]."""
    shapes = [(*a.shape[:2], n, a.shape[3]) for a in cache.sequence(0)]
    split = int(np.prod(shapes[0]))
    raw = np.frombuffer(data, np.uint8)
    return raw[:split].reshape(shapes[0]), raw[split:].reshape(shapes[1])


def _fresh(config: ModelConfig, types: tuple[str, str], layout: str, data: bytes) -> KVCache:
    cache = KVCache(config, 100, 1, types, LAYOUTS[layout])
    cache.write(0, 0, data)
    return cache


def test_both_layouts_read_the_same_bytes(config: ModelConfig) -> None:
    """What one layout wrote and read, the other reads back the same: the prompt cache's bytes are rows."""
    data = random_rows(KVCache(config, 64, 1), 50, np.random.default_rng(5))
    rows, tiles = (_fresh(config, ("f16", "f16"), layout, data) for layout in LAYOUTS)
    assert rows.read(0, 3, 50) == tiles.read(0, 3, 50)
    assert not np.array_equal(rows.sequence(0)[0], tiles.sequence(0)[0])  # the keys do sit differently
