"""The C set's fused decode step (native/c/decode.c): a DecodePlan packed once into the
structs li_decode reads, so a decode token (or a verify's few) costs one ctypes call for all
its layers instead of about fifteen per layer.
"""

from __future__ import annotations

import ctypes

import numpy as np

from localinfer_native.types import KV_TYPES, DecodePlan, DecodeStep, kv_rotation, kv_row_bytes

_P, _I64, _I32, _F = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32, ctypes.c_float
BUFFERS = ("h", "q", "k", "v", "attn", "o", "gate", "up")
VECTORS = ("attn_norm", "ffn_norm", "q_bias", "k_bias", "v_bias", "q_norm", "k_norm", "post_attn_norm", "post_ffn_norm", "o_bias", "sinks")  # a layer's, 0 where None
OPS = ("qkv", "o", "gate_up", "down", "moe")  # a layer's bound products; gate_up/down or moe 0


class _Layer(ctypes.Structure):
    """li_layer in decode.c"""

    _fields_ = [*((name, _P) for name in (*OPS, *VECTORS)), ("window", _I64)]


class _Decoder(ctypes.Structure):
    """li_decoder in decode.c"""

    _fields_ = [
        *((name, _I64) for name in ("n_layer", "n_embd", "n_head", "n_head_kv", "hd", "n_ff", "n_ctx", "rope_dims", "max_rows")),
        *((name, _I32) for name in ("neox", "type_k", "type_v", "gelu")),
        ("rot_k", _I64), ("rot_v", _I64), ("eps", _F), ("scale", _F),
        *((name, _P) for name in ("cos_t", "sin_t", "cos_local", "sin_local", "layers")),
        *((name, _P) for name in BUFFERS),
        ("nthreads", ctypes.POINTER(_I32)),
    ]  # fmt: skip


def bind(lib: ctypes.CDLL) -> bool:
    """Declare li_decode's arguments; False where the library's structs are not these."""
    for fn in (lib.li_decoder_size, lib.li_layer_size):
        fn.restype, fn.argtypes = ctypes.c_int, []
    lib.li_decode.restype = ctypes.c_int
    lib.li_decode.argtypes = [_P, _P, _I64, _P, _P, _P]
    return lib.li_decoder_size() == ctypes.sizeof(_Decoder) and lib.li_layer_size() == ctypes.sizeof(_Layer)


def _address(a: np.ndarray | None) -> int | None:
    if a is None:
        return None
    if a.dtype != np.float32 or not a.flags.c_contiguous:
        raise ValueError(f"expected a C-contiguous float32 array, got {a.dtype} {a.shape}")
    return a.ctypes.data


def make_step(lib: ctypes.CDLL, plan: DecodePlan, structs: list[list[ctypes.Structure | None]], threads: ctypes.c_int32) -> DecodeStep:
    """The step over `plan`; `structs` holds each layer's structs of OPS (li_op, li_moe), None where it has none."""
    bufs = plan.buffers
    layers = (_Layer * len(plan.layers))()
    for dst, lw, ops in zip(layers, plan.layers, structs):
        for name, st in zip(OPS, ops):
            setattr(dst, name, ctypes.addressof(st) if st is not None else None)
        for name in VECTORS:
            setattr(dst, name, _address(getattr(lw, name)))
        dst.window = lw.window
    type_k, type_v = plan.kv_types
    d = _Decoder(
        n_layer=len(plan.layers), n_embd=bufs["h"].shape[1], n_head=plan.n_head, n_head_kv=plan.n_head_kv, hd=plan.head_dim,
        n_ff=bufs["gate"].shape[1], n_ctx=plan.n_ctx, max_rows=plan.max_rows, rope_dims=2 * plan.cos.shape[1], neox=int(plan.neox),
        type_k=int(KV_TYPES[type_k]), type_v=int(KV_TYPES[type_v]), gelu=int(plan.gelu),
        rot_k=kv_rotation(type_k, plan.head_dim, True), rot_v=kv_rotation(type_v, plan.head_dim, False),
        eps=plan.eps, scale=plan.scale, cos_t=_address(plan.cos), sin_t=_address(plan.sin), layers=ctypes.addressof(layers),
        cos_local=_address(plan.cos if plan.cos_local is None else plan.cos_local), sin_local=_address(plan.sin if plan.sin_local is None else plan.sin_local),
        nthreads=ctypes.pointer(threads), **{name: _address(bufs[name]) for name in BUFFERS},
    )  # fmt: skip
    n_embd, decode, ref = bufs["h"].shape[1], lib.li_decode, ctypes.byref(d)
    rows = (len(plan.layers), plan.n_head_kv, plan.n_ctx)
    shapes = ((*rows, kv_row_bytes(type_k, plan.head_dim)), (*rows, kv_row_bytes(type_v, plan.head_dim)))

    def step(x: np.ndarray, positions: np.ndarray, keys: np.ndarray, values: np.ndarray) -> None:
        n = len(positions)
        if x.dtype != np.float32 or x.shape != (n, n_embd) or not x.flags.c_contiguous or not x.flags.writeable:
            raise ValueError(f"x must be a writable C-contiguous float32 array of {n} x {n_embd} values")
        if positions.dtype != np.int32 or not positions.flags.c_contiguous or not 1 <= n <= plan.max_rows:
            raise ValueError(f"positions must be a C-contiguous int32 array of 1 to {plan.max_rows} values")
        for c, shape in zip((keys, values), shapes):
            if c.dtype != np.uint8 or c.shape != shape or not c.flags.c_contiguous:
                raise ValueError(f"keys and values must be one sequence's C-contiguous uint8 cache {shape}")
        rc = decode(ref, x.ctypes.data, n, positions.ctypes.data, keys.ctypes.data, values.ctypes.data)
        if rc:
            raise RuntimeError(f"C decode step failed with code {rc} (position outside the cache?)")

    step._keep = (plan, structs, layers, d, threads)  # type: ignore[attr-defined]  # what the C structs point into
    return step
