"""The C set's mixture-of-experts op (native/c/moe.c): a layer's router and stacked experts
packed once into the li_moe struct, so a call costs one ctypes call for the whole FFN."""

from __future__ import annotations

import ctypes
import weakref
from collections.abc import Callable

import numpy as np

from localinfer_native.types import MoeFFN, MoeOp, QMatrix

_P, _I64, _I32 = ctypes.c_void_p, ctypes.c_int64, ctypes.c_int32
GATING = {"softmax_norm": 0, "topk_softmax": 1}  # LI_ROUTE_*
ACTIVATION = {"swiglu": 0, "geglu": 1, "swiglu_oai": 2}  # LI_ACT_*
_F32 = np.dtype(np.float32)


class _Experts(ctypes.Structure):
    """li_experts in kernels.h"""

    _fields_ = [("type", _I32), ("w", _P), ("packed", _P), ("rows", _I64), ("k", _I64), ("w_stride", _I64),
                ("packed_stride", _I64), ("bias", _P)]  # fmt: skip


class _Buffer(ctypes.Structure):
    _fields_ = [("base", _P), ("bytes", _I64)]


class Scratch(ctypes.Structure):
    """li_moe_scratch: the buffers moe.c grows to its largest call, shared by a model's layers."""

    _fields_ = [("fixed", _Buffer), ("works", _Buffer)]


class MoeStruct(ctypes.Structure):
    """li_moe in kernels.h"""

    _fields_ = [("router", _P), ("router_bias", _P), ("gate", _Experts), ("up", _Experts), ("down", _Experts),
                ("n_expert", _I32), ("n_used", _I32), ("gating", _I32), ("activation", _I32),
                ("nthreads", ctypes.POINTER(_I32)), ("scratch", ctypes.POINTER(Scratch))]  # fmt: skip


def bind(lib: ctypes.CDLL) -> bool:
    """Declare moe.c's functions; False where the library's li_moe is not this layout."""
    lib.li_moe_size.restype, lib.li_moe_size.argtypes = ctypes.c_int, []
    lib.li_moe_ffn.restype = ctypes.c_int
    lib.li_moe_ffn.argtypes = [_P, _P, _I64, _P]
    lib.li_moe_scratch_free.restype, lib.li_moe_scratch_free.argtypes = None, [_P]
    return lib.li_moe_size() == ctypes.sizeof(MoeStruct)


def new_scratch(lib: ctypes.CDLL) -> Scratch:
    """A scratch whose buffers moe.c frees when the object goes."""
    scratch = Scratch()
    weakref.finalize(scratch, lib.li_moe_scratch_free, ctypes.addressof(scratch))
    return scratch


def _bias(a: np.ndarray | None, shape: tuple[int, ...]) -> np.ndarray | None:
    if a is None:
        return None
    if a.dtype != _F32 or not a.flags.c_contiguous or a.shape != shape:
        raise ValueError(f"an expert bias must be a C-contiguous float32 {shape} array, got {a.dtype} {a.shape}")
    return a


def _experts(m: QMatrix, n_expert: int, panels: np.ndarray | None, bias: np.ndarray | None) -> _Experts:
    rows = m.rows // n_expert
    return _Experts(int(m.type), m.data.ctypes.data, panels.ctypes.data if panels is not None else None, rows, m.cols,
                    m.data.nbytes // n_expert, panels.nbytes // n_expert if panels is not None else 0,
                    bias.ctypes.data if bias is not None else None)  # fmt: skip


def make_op(lib: ctypes.CDLL, ffn: MoeFFN, router_op: Callable, packed: Callable[[QMatrix, int], np.ndarray | None],
            threads: ctypes.c_int32, scratch: Scratch) -> MoeOp:  # fmt: skip
    """li_moe_ffn over ffn's tensors. `router_op` is the router's bound product (an op of
    c_kernels, whose li_op struct sits first in its _keep); `packed(m, n_expert)` gives a
    stacked tensor's panels (every expert's the same size), or None."""
    if ffn.gating not in GATING or ffn.activation not in ACTIVATION:
        raise ValueError(f"the C kernels have no router '{ffn.gating}' or expert activation '{ffn.activation}'")
    n, n_embd, n_ff = ffn.n_expert, ffn.gate.cols, ffn.gate.rows // ffn.n_expert
    biases = (_bias(ffn.router_bias, (n,)), _bias(ffn.gate_bias, (n, n_ff)), _bias(ffn.up_bias, (n, n_ff)),
              _bias(ffn.down_bias, (n, n_embd)))  # fmt: skip
    panels = [packed(m, n) for m in (ffn.gate, ffn.up, ffn.down)]
    st = MoeStruct()
    st.router = ctypes.addressof(router_op._keep[0])
    st.router_bias = biases[0].ctypes.data if biases[0] is not None else None
    st.gate, st.up, st.down = (_experts(m, n, p, b) for m, p, b in zip((ffn.gate, ffn.up, ffn.down), panels, biases[1:]))
    st.n_expert, st.n_used = n, ffn.n_used
    st.gating, st.activation = GATING[ffn.gating], ACTIVATION[ffn.activation]
    st.nthreads, st.scratch = ctypes.pointer(threads), ctypes.pointer(scratch)
    fn, ref = lib.li_moe_ffn, ctypes.byref(st)

    def op(x: np.ndarray, out: np.ndarray, n_fast: int = 0) -> None:  # n_fast: moe.c has no fast path (li_moe_ffn)
        if (x.dtype != _F32 or out.dtype != _F32 or x.ndim != 2 or x.shape[1] != n_embd or out.shape != x.shape
                or not x.flags.c_contiguous or not out.flags.c_contiguous or not out.flags.writeable):  # fmt: skip
            raise ValueError(f"moe op takes C-contiguous float32 x and out of shape [n, {n_embd}]")
        if len(x) == 0:
            return
        rc = fn(ref, x.ctypes.data, len(x), out.ctypes.data)
        if rc:
            raise RuntimeError(f"C mixture of experts failed (error {rc})")

    op._keep = (st, ffn, router_op, panels, biases, threads, scratch)  # type: ignore[attr-defined]  # outlive the op
    return op
