"""Attention over a quantized KV cache (q8_0, q4_0) against a numpy reference of the same
block math, for the C kernels (installed, AVX2-only and portable builds) and the Numba ones.

The reference quantizes with gguf-py (llama.cpp's own format code): the cache must hold
exactly the bytes gguf-py writes for each key and value row, and against quantized keys the
queries go through gguf-py's q8_0 too, as ggml's vec_dot quantizes them. A quantized cache
stores its rows rotated by a Walsh-Hadamard matrix, as llama.cpp's does; the reference builds
that matrix as a Kronecker power and rotates by a plain product. What is left between kernel
and reference is float32 rounding.
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q
from gguf.quants import dequantize, quantize

from localinfer_native.types import KV_TYPES, kv_rows_of, kv_rotation, kv_row_bytes

N_HEAD, N_HEAD_KV, HD, N_CTX = 6, 2, 128, 48
TYPES = [("q8_0", "q8_0"), ("q4_0", "q4_0"), ("q8_0", "q4_0"), ("f16", "q4_0"), ("q4_0", "f16"), ("f16", "f16")]


def rotated(x: np.ndarray, n: int) -> np.ndarray:
    """x [..., HD] times the orthonormal Walsh-Hadamard matrix of size n, chunk by chunk (n = 0: x)."""
    if not n:
        return x
    h = np.ones((1, 1))
    while len(h) < n:
        h = np.kron(np.array([[1, 1], [1, -1]]), h)
    return (x.reshape(-1, n).astype(np.float64) @ (h / np.sqrt(n))).reshape(x.shape)


def rows_as_stored(x: np.ndarray, kv_type: str, keys: bool) -> np.ndarray:
    """gguf-py's bytes for rows [..., HD] of this type, rotated as llama.cpp's cache rotates them."""
    x = rotated(x, kv_rotation(kv_type, HD, keys)).astype(np.float32)
    raw = x.astype(np.float16).view(np.uint8) if kv_type == "f16" else quantize(x, KV_TYPES[kv_type])
    return raw.reshape(*x.shape[:-1], kv_row_bytes(kv_type, HD))


def values_of(rows: np.ndarray, kv_type: str) -> np.ndarray:
    return dequantize(rows, KV_TYPES[kv_type]).astype(np.float64).reshape(*rows.shape[:-1], HD)


def reference(q: np.ndarray, keys: np.ndarray, values: np.ndarray, positions: np.ndarray, types: tuple[str, str], scale: float) -> np.ndarray:
    """Causal grouped-query attention over the stored bytes, in float64."""
    k, v = values_of(keys, types[0]), values_of(values, types[1])
    if types[0] == "f16":
        qv = q.astype(np.float16).astype(np.float64)
    else:
        q = rotated(q, kv_rotation(types[0], HD, True)).astype(np.float32)
        qv = dequantize(quantize(q, Q.Q8_0), Q.Q8_0).astype(np.float64).reshape(q.shape)
    out = np.empty((len(q), N_HEAD * HD))
    group = N_HEAD // N_HEAD_KV
    for i, p in enumerate(positions):
        for h in range(N_HEAD):
            s = k[h // group, : p + 1] @ qv[i, h] * scale
            w = np.exp(s - s.max())
            out[i, h * HD : (h + 1) * HD] = (w / w.sum()) @ v[h // group, : p + 1]
    return rotated(out, kv_rotation(types[1], HD, False))


@pytest.mark.parametrize("types", TYPES, ids="/".join)
def test_attention_matches_the_block_math(every_kernel_set, types: tuple[str, str]) -> None:
    rng = np.random.default_rng(7)
    keys = np.zeros((N_HEAD_KV, N_CTX, kv_row_bytes(types[0], HD)), np.uint8)
    values = np.zeros((N_HEAD_KV, N_CTX, kv_row_bytes(types[1], HD)), np.uint8)
    k_all = rng.standard_normal((N_CTX, N_HEAD_KV, HD)).astype(np.float32) * 2
    v_all = rng.standard_normal((N_CTX, N_HEAD_KV, HD)).astype(np.float32)
    k_all[5, 1, :32] = 0  # an all-zero block: scale 0, nothing divided by it
    scale = 1 / np.sqrt(HD)
    # a prefill of 40 positions, then a decode step, then a 3-row verification
    for positions in (np.arange(40), np.array([40]), np.array([41, 42, 43])):
        positions = positions.astype(np.int32)
        q = rng.standard_normal((len(positions), N_HEAD, HD)).astype(np.float32)
        out = np.empty((len(positions), N_HEAD * HD), np.float32)
        every_kernel_set.attention(q, k_all[positions], v_all[positions], keys, values, positions, out, scale, types)
        n = int(positions.max()) + 1
        key_rows = kv_rows_of(keys, types[0], types[0] in every_kernel_set.tiled_keys)  # the C set tiles f16 and q8_0 keys
        np.testing.assert_array_equal(key_rows[:, :n], rows_as_stored(k_all[:n].transpose(1, 0, 2), types[0], keys=True))
        np.testing.assert_array_equal(values[:, :n], rows_as_stored(v_all[:n].transpose(1, 0, 2), types[1], keys=False))
        want = reference(q, key_rows, values, positions, types, scale)
        np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())


def test_row_bytes_are_ggml_block_sizes() -> None:
    assert [kv_row_bytes(t, 64) for t in ("f16", "q8_0", "q4_0")] == [128, 68, 36]
    with pytest.raises(ValueError, match="multiple of 32"):
        kv_row_bytes("q8_0", 48)


def test_the_rotation_is_llama_cpps_choice() -> None:
    """Keys: the largest power of two dividing the head (at least 64); values: 64; f16 and
    heads that are not a multiple of 64: none."""
    assert [kv_rotation("q8_0", hd, True) for hd in (64, 96, 128, 192, 256)] == [64, 0, 128, 64, 256]
    assert [kv_rotation("q4_0", hd, False) for hd in (64, 128, 256)] == [64, 64, 64]
    assert kv_rotation("f16", 128, True) == kv_rotation("f16", 128, False) == 0
