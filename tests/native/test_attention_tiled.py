"""The C set's tiled attention over long sequences: a float64 reference of causal grouped-query
attention for every KV cache type, and the promise speculative decoding rests on: a row's output
is the same, bit for bit, whatever rows share its call (alone as in decode, in a whole prefill,
or in the chunks of a chunked prefill).

The reference reads the cache's own bytes back (gguf-py dequantizes them), so what it checks is
the attention, not the store (test_kv_quant checks that). Against quantized keys the kernel
quantizes each rotated query head to q8_0; the reference rotates in float32 with the kernel's
own butterflies, so gguf-py's q8_0 of it is the kernel's query to the bit.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from localinfer_native.types import KEY_TILE, KV_TYPES, kv_rows_of, kv_rotation, kv_row_bytes

T = 300  # positions: ten key blocks and a part, ten row tiles and a part
TYPES = [("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"), ("f16", "q4_0"), ("q8_0", "f16")]
HEADS = [(4, 4, 64), (6, 2, 128), (8, 1, 96)]  # n_head, n_head_kv, head_dim: MHA, GQA, MQA (96: no rotation)


@pytest.fixture(scope="module", params=["c", "c-avx2", "c-portable"])
def kernels(request):
    from localinfer_native.c_kernels import CKernels

    if request.param == "c":
        return CKernels(threads=2)
    return CKernels(threads=2, library=request.getfixturevalue(f"{request.param[2:]}_library"))


def fwht(x: np.ndarray, n: int) -> np.ndarray:
    """x [..., hd] times the orthonormal Walsh-Hadamard matrix, chunks of n, in x's float type:
    the butterflies of native/c/kvcache.c's li_fwht, in its order (n = 0: x)."""
    if not n:
        return x
    v = x.reshape(-1, x.shape[-1] // n, n).copy()
    h = 1
    while h < n:
        pairs = v.reshape(*v.shape[:2], n // (2 * h), 2, h)
        a, b = pairs[..., 0, :].copy(), pairs[..., 1, :].copy()
        pairs[..., 0, :], pairs[..., 1, :] = a + b, a - b
        h *= 2
    norm = x.dtype.type(1) / np.sqrt(x.dtype.type(n))
    return (v * norm).reshape(x.shape)


def cached(rows: np.ndarray, kv_type: str, hd: int) -> np.ndarray:
    """The cache's rows [..., row_bytes] as float64 values [..., hd] (still rotated)."""
    return dequantize(rows, KV_TYPES[kv_type]).astype(np.float64).reshape(*rows.shape[:-1], hd)


def query_as_read(q: np.ndarray, k_type: str) -> np.ndarray:
    """q [m, n_head, hd] as the kernel scores it: rounded to f16, or rotated and through q8_0."""
    if k_type == "f16":
        return q.astype(np.float16).astype(np.float64)
    hd = q.shape[-1]
    rq = fwht(q.astype(np.float32), kv_rotation(k_type, hd, True))
    return dequantize(quantize(rq, Q.Q8_0), Q.Q8_0).astype(np.float64).reshape(q.shape)


def reference(
    q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions: np.ndarray, types: tuple[str, str], scale: float, tiled: frozenset[str], window: int = 0
) -> np.ndarray:  # fmt: skip
    """Causal grouped-query attention in float64: query head h reads kv head h // group, row i
    sees positions 0..positions[i]; the output rotated back as the values were stored. Keys of
    the `tiled` types (the kernel set's tiled_keys) are read back as rows."""
    m, n_head, hd = q.shape
    group = n_head // keys.shape[0]
    keys = kv_rows_of(keys, types[0], types[0] in tiled)
    k, v, qv = cached(keys, types[0], hd), cached(values, types[1], hd), query_as_read(q, types[0])
    at = np.arange(keys.shape[1])[None, :]
    seen = (at <= positions[:, None]) & ((at > positions[:, None] - window) if window else True)  # [m, n_ctx]
    out = np.empty((m, n_head, hd))
    for h in range(n_head):
        s = np.where(seen, qv[:, h] @ k[h // group].T * scale, -np.inf)
        w = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, h] = (w / w.sum(axis=1, keepdims=True)) @ v[h // group]
    return fwht(out, kv_rotation(types[1], hd, False)).reshape(m, n_head * hd)


def case(types: tuple[str, str], heads: tuple[int, int, int], seed: int = 7, length: int = T) -> tuple:
    """An empty cache of `length` positions (rounded up to whole key tiles) and `length` rows
    of queries, keys and values."""
    n_head, n_head_kv, hd = heads
    rng = np.random.default_rng(seed)
    n_ctx = -(-length // KEY_TILE) * KEY_TILE
    keys = np.zeros((n_head_kv, n_ctx, kv_row_bytes(types[0], hd)), np.uint8)
    values = np.zeros((n_head_kv, n_ctx, kv_row_bytes(types[1], hd)), np.uint8)
    q = rng.standard_normal((length, n_head, hd)).astype(np.float32)
    k_new = rng.standard_normal((length, n_head_kv, hd)).astype(np.float32) * 2
    v_new = rng.standard_normal((length, n_head_kv, hd)).astype(np.float32)
    return q, k_new, v_new, keys, values, 1 / np.sqrt(hd)


def attend(kernels, q, k_new, v_new, keys, values, rows: slice, scale: float, types: tuple[str, str], window: int = 0) -> np.ndarray:
    """The kernel over rows (their positions are their indices), storing their keys and values."""
    positions = np.arange(len(q), dtype=np.int32)[rows]
    out = np.empty((len(positions), q.shape[1] * q.shape[2]), np.float32)
    kernels.attention(q[rows], k_new[rows], v_new[rows], keys, values, positions, out, scale, types, window)
    return out


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}x{h[1]}x{h[2]}")
@pytest.mark.parametrize("types", TYPES, ids="/".join)
def test_a_long_prefill_matches_float64_attention(kernels, types: tuple[str, str], heads: tuple[int, int, int]) -> None:
    q, k_new, v_new, keys, values, scale = case(types, heads)
    out = attend(kernels, q, k_new, v_new, keys, values, slice(0, T), scale, types)
    want = reference(q, keys, values, np.arange(T), types, scale, kernels.tiled_keys)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())


@pytest.mark.parametrize("types", TYPES, ids="/".join)
def test_a_row_does_not_depend_on_the_rows_beside_it(kernels, types: tuple[str, str]) -> None:
    """Bit for bit: all T rows at once, each row alone (decode), and 128 + 128 + 44 (chunked prefill)."""
    heads = HEADS[1]
    q, k_new, v_new, keys, values, scale = case(types, heads, seed=11)
    whole = attend(kernels, q, k_new, v_new, keys, values, slice(0, T), scale, types)
    alone = np.concatenate([attend(kernels, q, k_new, v_new, keys, values, slice(i, i + 1), scale, types) for i in range(T)])
    np.testing.assert_array_equal(alone, whole)
    _, _, _, keys, values, _ = case(types, heads, seed=11)  # a fresh cache
    chunks = [attend(kernels, q, k_new, v_new, keys, values, slice(a, b), scale, types) for a, b in ((0, 128), (128, 256), (256, T))]
    np.testing.assert_array_equal(np.concatenate(chunks), whole)


def test_threads_do_not_change_a_row(kernels) -> None:
    q, k_new, v_new, keys, values, scale = case(("f16", "f16"), HEADS[1])
    kernels.set_threads(1)
    try:
        one = attend(kernels, q, k_new, v_new, keys, values, slice(0, T), scale, ("f16", "f16"))
    finally:
        kernels.set_threads(2)
    np.testing.assert_array_equal(attend(kernels, q, k_new, v_new, keys, values, slice(0, T), scale, ("f16", "f16")), one)


@pytest.mark.parametrize("hd", [36, 40])
def test_a_head_size_the_vectors_do_not_divide(kernels, hd: int) -> None:
    """An f16 cache takes any head size, with the same promises: the tiles' scores run over
    any number of elements, and value sums the vectors do not divide run the plain loops."""
    types, heads = ("f16", "f16"), (3, 1, hd)
    q, k_new, v_new, keys, values, scale = case(types, heads)
    whole = attend(kernels, q, k_new, v_new, keys, values, slice(0, T), scale, types)
    want = reference(q, keys, values, np.arange(T), types, scale, kernels.tiled_keys)
    np.testing.assert_allclose(whole, want, rtol=0, atol=2e-5 * np.abs(want).max())
    for i in (0, 7, 8, 31, 32, 33, T - 1):
        np.testing.assert_array_equal(attend(kernels, q, k_new, v_new, keys, values, slice(i, i + 1), scale, types)[0], whole[i])


LONG = 2600  # positions: three of the kernel's 1,024-position spans, the last one partial
LONG_ROWS = (0, 1023, 1024, 1500, 2047, 2048, LONG - 1)  # each side of the span edges


@pytest.mark.parametrize("heads", [(8, 1, 96), (6, 2, 128)], ids=lambda h: f"{h[0]}x{h[1]}x{h[2]}")
@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0"), ("f16", "q4_0")], ids="/".join)
def test_decode_deep_in_a_context_splits_its_positions_without_changing_a_bit(kernels, types, heads) -> None:
    """A decode row past one span runs its spans on both threads (flash-decoding), a prefill
    row folds them in one task: both give the same bits, at every thread count, and the
    float64 reference's values. One kv head (MQA) is the case where only the split keeps the
    second thread busy."""
    q, k_new, v_new, keys, values, scale = case(types, heads, seed=5, length=LONG)
    whole = attend(kernels, q, k_new, v_new, keys, values, slice(0, LONG), scale, types)
    rows = np.array(LONG_ROWS)
    want = reference(q[rows], keys, values, rows, types, scale, kernels.tiled_keys)
    np.testing.assert_allclose(whole[rows], want, rtol=0, atol=2e-5 * np.abs(want).max())
    for threads in (1, 3, 2):
        kernels.set_threads(threads)
        try:
            for i in LONG_ROWS:
                np.testing.assert_array_equal(attend(kernels, q, k_new, v_new, keys, values, slice(i, i + 1), scale, types)[0], whole[i])
        finally:
            kernels.set_threads(2)


# n_head, n_head_kv, head_dim and sliding window of the five architectures' common sizes:
# Qwen2.5-0.5B, Llama-3.2-3B, Qwen3-0.6B, gemma-3-1b's local layers, Phi-3-mini
ARCH_HEADS = {"qwen2": (14, 2, 64, 0), "llama": (24, 8, 128, 0), "qwen3": (16, 8, 128, 0), "gemma3": (4, 1, 256, 512), "phi3": (32, 32, 96, 0)}
DEEP = 1100  # past one span, and past gemma3's window


@pytest.mark.parametrize("arch", ARCH_HEADS)
@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0")], ids="/".join)
def test_every_architectures_heads_deep_in_a_context(kernels, types: tuple[str, str], arch: str) -> None:
    """Each architecture's grouping of query heads (7, 3, 2, 4 with a window, and 1 to a kv
    head) over the tiled keys, past a span's edge: the float64 reference's values, and the
    last row decoded alone at one and two threads equals its prefill, bit for bit."""
    n_head, n_head_kv, hd, window = ARCH_HEADS[arch]
    q, k_new, v_new, keys, values, scale = case(types, (n_head, n_head_kv, hd), seed=9, length=DEEP)
    whole = attend(kernels, q, k_new, v_new, keys, values, slice(0, DEEP), scale, types, window)
    rows = np.array([0, window - 1 if window else 700, window + 3 if window else 1023, DEEP - 1])
    want = reference(q[rows], keys, values, rows, types, scale, kernels.tiled_keys, window)
    np.testing.assert_allclose(whole[rows], want, rtol=0, atol=2e-5 * np.abs(want).max())
    for threads in (1, 2):
        kernels.set_threads(threads)
        try:
            alone = attend(kernels, q, k_new, v_new, keys, values, slice(DEEP - 1, DEEP), scale, types, window)
        finally:
            kernels.set_threads(2)
        np.testing.assert_array_equal(alone[0], whole[DEEP - 1])
