"""The per-token layer operations of the C set (native/c/ops.c): RMSNorm, RoPE,
attention over the KV cache, SwiGLU; and an encoder's (native/c/encoder.c): LayerNorm,
GELU. One ctypes call each, arguments checked by numpy's
own asserts being cheap: shapes come from the forward pass, which owns every buffer.
"""

from __future__ import annotations

import ctypes
import weakref

import numpy as np

from localinfer_native.types import KV_TYPES, kv_rotation, kv_row_bytes

_P, _I64, _F, _INT = ctypes.c_void_p, ctypes.c_int64, ctypes.c_float, ctypes.c_int


def bind(lib: ctypes.CDLL) -> None:
    lib.li_rms_norm.restype = None
    lib.li_rms_norm.argtypes = [_P, _P, _P, _I64, _I64, _F]
    lib.li_rope.restype = None
    lib.li_rope.argtypes = [_P, _I64, _I64, _I64, _P, _P, _P, _I64, ctypes.c_int]
    for glu in (lib.li_swiglu, lib.li_geglu):
        glu.restype = None
        glu.argtypes = [_P, _P, _I64, ctypes.c_int]
    lib.li_attention.restype = ctypes.c_int
    lib.li_attention.argtypes = [_P, _P, _P, _P, _P, _INT, _INT, _I64, _I64, _P, _P, _I64, _I64, _I64, _I64, _I64, _F, _I64, _P, _INT, _INT]
    lib.li_layer_norm.restype = None
    lib.li_layer_norm.argtypes = [_P, _P, _P, _P, _I64, _I64, _F, _INT]
    lib.li_add_layer_norm.restype = None
    lib.li_add_layer_norm.argtypes = [_P, _P, _P, _P, _P, _I64, _I64, _F, _INT]
    lib.li_gelu.restype = None
    lib.li_gelu.argtypes = [_P, _P, _I64, _I64, _INT]


_view = {
    np.dtype(np.float32): ctypes.c_float.from_buffer,
    np.dtype(np.int32): ctypes.c_int32.from_buffer,
    np.dtype(np.float16): ctypes.c_uint16.from_buffer,
    np.dtype(np.uint8): ctypes.c_uint8.from_buffer,
}
_byref = ctypes.byref


def _ptr(a: np.ndarray, dtype: type = np.float32) -> object:
    """A pointer to a's data. byref(from_buffer) is the cheapest way ctypes offers (~0.3 us);
    it refuses read-only and non-contiguous arrays, which take the checked slow path."""
    try:
        if a.dtype == dtype:
            return _byref(_view[a.dtype](a))
    except (TypeError, ValueError):
        pass
    if a.dtype != dtype or not a.flags.c_contiguous:
        raise ValueError(f"expected a C-contiguous {np.dtype(dtype).name} array, got {a.dtype} {a.shape}")
    return ctypes.c_void_p(a.ctypes.data)


_pinned: dict[int, tuple[weakref.ref, ctypes.c_void_p]] = {}


def _pinned_ptr(a: np.ndarray, dtype: type = np.float32) -> object:
    """_ptr for arrays passed again and again (weights, buffers, cache views), made once.
    The cache holds the address and a weak reference, never the array: a closed model's
    cache must not stay alive here, and a dead entry never matches a new array."""
    hit = _pinned.get(id(a))
    if hit is not None and hit[0]() is a:
        return hit[1]
    _ptr(a, dtype)  # the checks
    if len(_pinned) > 4096:
        _pinned.clear()
    ptr = ctypes.c_void_p(a.ctypes.data)
    _pinned[id(a)] = (weakref.ref(a), ptr)
    return ptr


class COps:
    """Mixed into CKernels; needs `self._lib` and `self._threads` (a c_int32)."""

    _lib: ctypes.CDLL
    _threads: ctypes.c_int32

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        n, d = x.shape
        assert out.shape == x.shape and weight.shape == (d,)
        self._lib.li_rms_norm(_ptr(x), _pinned_ptr(weight), _pinned_ptr(out), n, d, eps)

    def rope(self, x: np.ndarray, positions: np.ndarray, cos: np.ndarray, sin: np.ndarray, neox: bool) -> None:
        n, heads, head_dim = x.shape
        dims = 2 * cos.shape[1]
        assert len(positions) == n and dims <= head_dim and int(positions.max()) < len(cos)
        self._lib.li_rope(_pinned_ptr(x), n, heads, head_dim, _ptr(positions, np.int32), _pinned_ptr(cos), _pinned_ptr(sin), dims, int(neox))

    def swiglu(self, gate: np.ndarray, up: np.ndarray) -> None:
        assert gate.shape == up.shape
        self._lib.li_swiglu(_pinned_ptr(gate), _pinned_ptr(up), gate.size, self._threads.value)

    def geglu(self, gate: np.ndarray, up: np.ndarray) -> None:
        assert gate.shape == up.shape
        self._lib.li_geglu(_pinned_ptr(gate), _pinned_ptr(up), gate.size, self._threads.value)

    def layer_norm(self, x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float, out: np.ndarray) -> None:
        n, d = x.shape
        assert out.shape == x.shape and weight.shape == bias.shape == (d,)
        self._lib.li_layer_norm(_ptr(x), _pinned_ptr(weight), _pinned_ptr(bias), _ptr(out), n, d, eps, self._threads.value)

    def add_layer_norm(self, x: np.ndarray, y: np.ndarray, y_bias: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float) -> None:
        n, d = x.shape
        assert y.shape == x.shape and y_bias.shape == weight.shape == bias.shape == (d,)
        self._lib.li_add_layer_norm(_ptr(x), _ptr(y), _pinned_ptr(y_bias), _pinned_ptr(weight), _pinned_ptr(bias), n, d, eps, self._threads.value)

    def gelu(self, x: np.ndarray, bias: np.ndarray | None = None) -> None:
        n, d = x.shape
        assert bias is None or bias.shape == (d,)
        self._lib.li_gelu(_ptr(x), None if bias is None else _pinned_ptr(bias), n, d, self._threads.value)

    def attention(
        self, q: np.ndarray, k_new: np.ndarray, v_new: np.ndarray, keys: np.ndarray, values: np.ndarray,
        positions: np.ndarray, out: np.ndarray, scale: float, kv_types: tuple[str, str] = ("f16", "f16"), window: int = 0,
        sinks: np.ndarray | None = None, causal: bool = True,
    ) -> None:  # fmt: skip
        m, n_head, head_dim = q.shape
        assert sinks is None or sinks.shape == (n_head,)
        assert causal or not window
        n_head_kv, n_ctx, _ = keys.shape
        type_k, type_v = KV_TYPES[kv_types[0]], KV_TYPES[kv_types[1]]
        assert keys.shape[2] == kv_row_bytes(kv_types[0], head_dim) and values.shape == (n_head_kv, n_ctx, kv_row_bytes(kv_types[1], head_dim))
        assert k_new.shape == v_new.shape == (m, n_head_kv, head_dim)
        assert out.shape == (m, n_head * head_dim) and len(positions) == m
        rc = self._lib.li_attention(
            _pinned_ptr(q), _pinned_ptr(k_new), _pinned_ptr(v_new), _pinned_ptr(keys, np.uint8), _pinned_ptr(values, np.uint8),
            int(type_k), int(type_v), kv_rotation(kv_types[0], head_dim, True), kv_rotation(kv_types[1], head_dim, False),
            _ptr(positions, np.int32), _pinned_ptr(out),
            m, n_head, n_head_kv, head_dim, n_ctx, scale, window, None if sinks is None else _pinned_ptr(sinks), int(causal), self._threads.value,
        )  # fmt: skip
        if rc:
            raise RuntimeError(f"C attention failed with code {rc} (position outside the cache?)")
