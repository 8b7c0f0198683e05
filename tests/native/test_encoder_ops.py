"""An encoder's operations in every kernel set (each C build and Numba): attention that is not
causal (every row of a sequence sees all of it), LayerNorm with a bias after a residual add,
and GELU after a bias, each against a float64 or ggml-arithmetic reference written here.

Non-causal attention is the causal kernel with every row's last position the call's last, so
its float64 reference is test_attention_tiled's with every row at the last position; its
promise is the causal one's: a row's output does not depend on the rows beside it, nor on
the thread count, bit for bit (an encoder's sequence comes out the same alone or among others).
"""

from __future__ import annotations

import ctypes
import os

import numpy as np
import pytest

from .test_attention_tiled import HEADS, case, reference

T = 200  # positions: six key blocks and a part
TYPES = [("f16", "f16"), ("q8_0", "q8_0"), ("f16", "q4_0")]


def attend_all(kernels, q, k_new, v_new, keys, values, order: np.ndarray, scale: float, types: tuple[str, str]) -> np.ndarray:
    """The kernel, not causal, over the rows in `order` (their positions are their indices)."""
    positions = order.astype(np.int32)
    out = np.empty((len(order), q.shape[1] * q.shape[2]), np.float32)
    kernels.attention(q[order], k_new[order], v_new[order], keys, values, positions, out, scale, types, causal=False)
    return out


@pytest.mark.parametrize("heads", HEADS, ids=lambda h: f"{h[0]}x{h[1]}x{h[2]}")
@pytest.mark.parametrize("types", TYPES, ids="/".join)
def test_every_row_sees_the_whole_sequence(every_kernel_set, types: tuple[str, str], heads: tuple[int, int, int]) -> None:
    q, k_new, v_new, keys, values, scale = case(types, heads, length=T)
    out = attend_all(every_kernel_set, q, k_new, v_new, keys, values, np.arange(T), scale, types)
    want = reference(q, keys, values, np.full(T, T - 1), types, scale, every_kernel_set.tiled_keys)
    # The reference quantizes the query as the C set rotates it, to the bit; Numba rotates by
    # a matrix product, so a value at a q8_0 rounding edge may go the other way (as it does
    # in causal attention: quantized caches there are test_kv_quant's)
    loose = every_kernel_set.name == "numba" and types[0] != "f16"
    np.testing.assert_allclose(out, want, rtol=0, atol=(2e-3 if loose else 2e-5) * np.abs(want).max())


def test_a_row_is_the_same_in_any_order_and_at_any_thread_count(every_kernel_set) -> None:
    """Rows shuffled within the call, and one thread against two: the same bits per row."""
    types, kernels = ("f16", "f16"), every_kernel_set
    q, k_new, v_new, keys, values, scale = case(types, HEADS[1], seed=3, length=T)
    whole = attend_all(kernels, q, k_new, v_new, keys, values, np.arange(T), scale, types)
    shuffled = np.random.default_rng(5).permutation(T)
    np.testing.assert_array_equal(attend_all(kernels, q, k_new, v_new, keys, values, shuffled, scale, types), whole[shuffled])
    kernels.set_threads(1)
    try:
        one = attend_all(kernels, q, k_new, v_new, keys, values, np.arange(T), scale, types)
    finally:
        kernels.set_threads(2)
    np.testing.assert_array_equal(one, whole)


def test_causal_attention_is_unchanged_beside_it(every_kernel_set) -> None:
    """The same call with causal left on still stops each row at its own position."""
    types = ("f16", "f16")
    q, k_new, v_new, keys, values, scale = case(types, HEADS[0], length=T)
    out = np.empty((T, q.shape[1] * q.shape[2]), np.float32)
    positions = np.arange(T, dtype=np.int32)
    every_kernel_set.attention(q, k_new, v_new, keys, values, positions, out, scale, types)
    want = reference(q, keys, values, positions, types, scale, every_kernel_set.tiled_keys)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-5 * np.abs(want).max())


def ggml_layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray, eps: float) -> np.ndarray:
    """ggml_norm's arithmetic (the sum and the centred squares summed in double, the rest in
    float32), then ggml_mul and ggml_add."""
    f32 = np.float32
    mean = (x.astype(np.float64).sum(axis=1).astype(f32) / f32(x.shape[1]))[:, None]
    c = x - mean
    variance = ((c * c).astype(np.float64).sum(axis=1) / x.shape[1]).astype(f32)[:, None]
    return c * (f32(1) / np.sqrt(variance + f32(eps))) * w + b


def rows(shape: tuple[int, int], seed: int, scale: float = 1.0, shift: float = 0.0) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(shape) * scale + shift).astype(np.float32)


@pytest.mark.parametrize("shape", [(1, 64), (37, 768), (300, 384)], ids=lambda s: f"{s[0]}x{s[1]}")  # 300 x 384: on the threads
def test_layer_norm_is_ggml_norm_times_weight_plus_bias(every_kernel_set, shape: tuple[int, int]) -> None:
    n, d = shape
    x, w, b = rows(shape, 1, 3.0, 0.5), rows((1, d), 2)[0], rows((1, d), 3)[0]
    want = ggml_layer_norm(x, w, b, 1e-12)
    out = np.empty_like(x)
    every_kernel_set.layer_norm(x, w, b, 1e-12, out)
    np.testing.assert_allclose(out, want, rtol=0, atol=2e-6 * np.abs(want).max())
    every_kernel_set.layer_norm(x, w, b, 1e-12, x)  # in place
    np.testing.assert_array_equal(x, out)


def test_the_residual_and_its_bias_are_added_first(every_kernel_set) -> None:
    x, y, yb = rows((300, 384), 4), rows((300, 384), 5), rows((1, 384), 6)[0]
    w, b = rows((1, 384), 7)[0], rows((1, 384), 8)[0]
    want = ggml_layer_norm(x + (y + yb), w, b, 1e-5)
    every_kernel_set.add_layer_norm(x, y, yb, w, b, 1e-5)
    np.testing.assert_allclose(x, want, rtol=0, atol=2e-6 * np.abs(want).max())


@pytest.fixture(scope="module")
def ggml_gelu_table() -> np.ndarray:
    """ggml's own table (ggml_table_gelu_f16: GELU's tanh approximation of every float16
    value, rounded to float16), read from the ggml llama.cpp runs, as float32."""
    import llama_cpp

    lib = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-cpu.so"))
    lib.ggml_cpu_init()  # fills the tables (once)
    return np.ctypeslib.as_array((ctypes.c_uint16 * (1 << 16)).in_dll(lib, "ggml_table_gelu_f16")).view(np.float16).astype(np.float32)


def ggml_gelu(x: np.ndarray, table: np.ndarray) -> np.ndarray:
    """ggml_vec_gelu_f32: 0 at or below -10, x from 10 up, else the table at x rounded to float16."""
    return np.where(x <= -10, np.float32(0), np.where(x >= 10, x, table[x.astype(np.float16).view(np.uint16)]))


def exact_gelu(kernels) -> bool:
    return kernels.name == "c" and "scalar" not in kernels.describe()


def test_gelu_is_ggmls_at_every_float16(every_kernel_set, ggml_gelu_table: np.ndarray) -> None:
    """Every finite float16 value in (-10, 10): a C build with FMA makes ggml's table to the bit
    (the same libm tanhf, its multiply-adds fused as ggml's build fuses them); the portable
    build (no FMA) and Numba (numpy's arithmetic) may be a float16 step off in a few entries."""
    h = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(np.float16).astype(np.float32)
    x = h[np.isfinite(h) & (h > -10) & (h < 10)].reshape(64, -1).copy()
    want = ggml_gelu(x, ggml_gelu_table)
    every_kernel_set.gelu(x)
    if exact_gelu(every_kernel_set):
        np.testing.assert_array_equal(x, want)
    else:
        assert np.mean(x == want) > 0.9999
        np.testing.assert_allclose(x, want, rtol=2**-10, atol=1e-7)


@pytest.mark.parametrize("shape", [(3, 37), (64, 3072)], ids=lambda s: f"{s[0]}x{s[1]}")  # 37: the vectors' tails
def test_gelu_after_a_bias(every_kernel_set, ggml_gelu_table: np.ndarray, shape: tuple[int, int]) -> None:
    x, bias = rows(shape, 9, 4.0), rows((1, shape[1]), 10, 4.0)[0]
    x[0, :4] = np.array([-10.0, 10.0, -30.0, 25.0], np.float32) - bias[:4]  # about the ends, once the bias is added
    want = ggml_gelu(x + bias, ggml_gelu_table)
    every_kernel_set.gelu(x, bias)
    if exact_gelu(every_kernel_set):
        np.testing.assert_array_equal(x, want)
    else:
        np.testing.assert_allclose(x, want, rtol=2**-10, atol=1e-7)
