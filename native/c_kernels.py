"""The C kernel set: native/c/*.c, compiled at install time into `_ckernels`, loaded with ctypes.

The library sits next to this file (setup.py builds it there, or into the installed
package). If it is missing or was built for another ABI, CKernels() raises
KernelsUnavailable and `load_kernels("auto")` takes the Numba set instead.

A bound op costs one ctypes call per use: the matrices' types, pointers and shapes are
packed into a C struct once, in matmul_op, and each call passes only the activation and
output buffers.
"""

from __future__ import annotations

import ctypes
import mmap
import os
from collections.abc import Sequence
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import numpy as np

from localinfer_native import KernelsUnavailable, c_decode, c_moe, c_ops
from localinfer_native.types import C_TYPES, DecodePlan, DecodeStep, MatmulOp, MoeFFN, MoeOp, QMatrix

ABI_VERSION = 8
MAX_MATS = 3
_F32 = np.dtype(np.float32)
_ERRORS = {1: "unsupported block type", 2: "row length not a multiple of the block size", 3: "bad arguments", 4: "out of memory"}


class _Op(ctypes.Structure):
    """li_op in matmul.c"""

    _fields_ = [
        ("nmat", ctypes.c_int32),
        ("types", ctypes.c_int32 * MAX_MATS),
        ("w", ctypes.c_void_p * MAX_MATS),
        ("packed", ctypes.c_void_p * MAX_MATS),
        ("rows", ctypes.c_int64 * MAX_MATS),
        ("k", ctypes.c_int64),
        ("nthreads", ctypes.POINTER(ctypes.c_int32)),
    ]


def library_path() -> Path | None:
    """The built library beside this file, preferring this interpreter's own suffix."""
    here = Path(__file__).resolve().parent
    found = [p for p in here.glob("_ckernels*") if p.suffix in (".so", ".pyd", ".dylib", ".dll")]
    for suffix in EXTENSION_SUFFIXES:
        for p in found:
            if p.name == "_ckernels" + suffix:
                return p
    return found[0] if found else None


_libs: dict[Path, ctypes.CDLL] = {}


def _load(path: Path | None = None) -> ctypes.CDLL:
    path = path or library_path()
    if path is None:
        raise KernelsUnavailable("the C library was not built (no _ckernels library in the localinfer_native package)")
    if path in _libs:
        return _libs[path]
    try:
        lib = ctypes.CDLL(str(path))
    except OSError as e:
        raise KernelsUnavailable(f"cannot load {path.name}: {e}") from e
    try:
        lib.li_abi_version.restype = ctypes.c_int
        lib.li_abi_version.argtypes = []
        version = lib.li_abi_version()
    except AttributeError as e:
        raise KernelsUnavailable(f"{path.name} is not a localinfer kernel library") from e
    if version != ABI_VERSION:
        raise KernelsUnavailable(f"{path.name} has ABI {version}, this localinfer needs {ABI_VERSION}; reinstall to rebuild it")
    lib.li_op_size.restype = ctypes.c_int
    if lib.li_op_size() != ctypes.sizeof(_Op) or not c_decode.bind(lib) or not c_moe.bind(lib):
        raise KernelsUnavailable(f"{path.name} was built with another op layout; reinstall to rebuild it")
    lib.li_build_info.restype = ctypes.c_char_p
    lib.li_build_info.argtypes = []
    lib.li_matmul.restype = ctypes.c_int
    lib.li_matmul.argtypes = [
        ctypes.c_int, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_void_p), ctypes.POINTER(ctypes.c_void_p),
        ctypes.POINTER(ctypes.c_int64), ctypes.c_int64, ctypes.c_void_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_void_p),
        ctypes.c_int, ctypes.c_int64,
    ]  # fmt: skip
    lib.li_pack_bytes.restype = ctypes.c_int64
    lib.li_pack_bytes.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    lib.li_pack.restype = ctypes.c_int
    lib.li_pack.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    lib.li_amx_exact_runs.restype = ctypes.c_int
    lib.li_amx_exact_runs.argtypes = [ctypes.c_int]
    lib.li_amx_usable.restype = ctypes.c_int  # 1 where this build has AMX and the OS lets us use it
    lib.li_amx_usable.argtypes = []
    # li_matmul_op is called without argtypes, for speed: every argument passed to it is
    # a ctypes object (byref of the op, c_float views of the buffers) or a small int.
    lib.li_matmul_op.restype = ctypes.c_int
    lib.li_quantize_row_q8_0.restype = None
    lib.li_quantize_row_q8_0.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    lib.li_quantize_row_q8_1.restype = None
    lib.li_quantize_row_q8_1.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64]
    c_ops.bind(lib)
    _libs[path] = lib
    return lib


def default_threads() -> int:
    """Physical cores this process may run on."""
    try:
        import psutil

        cores = psutil.cpu_count(logical=False) or os.cpu_count() or 1
    except ImportError:
        cores = os.cpu_count() or 1
    try:
        cores = min(cores, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        pass
    return max(1, cores)


def _check_matrix(m: QMatrix) -> None:
    if m.type not in C_TYPES:
        raise ValueError(f"the C kernels do not run {m.type.name} matrices")
    d = m.data
    if d.dtype != np.uint8 or d.ndim != 2 or not d.flags.c_contiguous or d.shape[0] != m.rows:
        raise ValueError("QMatrix.data must be a C-contiguous uint8 [rows, row_bytes] array")


class CKernels(c_ops.COps):
    """The C kernel set (see localinfer_native.types.Kernels)."""

    name = "c"
    supported_types = C_TYPES  # the block types matmul_op takes
    tiled_keys = frozenset({"f16", "q8_0"})  # scored in place, sixteen positions a vector (kvcache.c)

    def __init__(self, threads: int | None = None, library: str | os.PathLike | None = None, pack: bool | None = None) -> None:
        """`library`: another build of native/c (tests use a portable one); default: the installed one.
        `pack`: repack matrices into panels for the fast products (default: unless LOCALINFER_PACK=0)."""
        self._lib = _load(Path(library).resolve() if library else None)
        self._pack = os.environ.get("LOCALINFER_PACK", "1") != "0" if pack is None else pack
        self._info = self._lib.li_build_info().decode()
        if not self._lib.li_amx_usable():  # built with AMX, but this OS or LOCALINFER_AMX=0 says no
            self._info = " ".join(w for w in self._info.split() if w != "amx")
        self._threads = ctypes.c_int32(threads or default_threads())
        self._moe_scratch = c_moe.new_scratch(self._lib)  # one call at a time, as the forward runs

    @property
    def threads(self) -> int:
        return self._threads.value

    def set_threads(self, n: int) -> None:
        """Applies to ops already bound as well."""
        if n < 1:
            raise ValueError(f"threads must be at least 1, got {n}")
        self._threads.value = int(n)

    def describe(self) -> str:
        words = self._info.split()
        simd = " ".join(w for w in words if w not in ("openmp", "serial")) or "portable"
        par = "openmp" if "openmp" in words else "no openmp"
        return f"c ({simd}, {par}, {self.threads} thread{'s' if self.threads != 1 else ''})"

    def matmul_op(self, mats: Sequence[QMatrix]) -> MatmulOp:
        mats = list(mats)
        if not 1 <= len(mats) <= MAX_MATS:
            raise ValueError(f"an op binds 1 to {MAX_MATS} matrices, got {len(mats)}")
        k = mats[0].cols
        for m in mats:
            _check_matrix(m)
            if m.cols != k:
                raise ValueError(f"fused matrices must share their row length: {m.cols} != {k}")
        st = _Op()
        st.nmat = len(mats)
        for i, m in enumerate(mats):
            st.types[i] = int(m.type)
            st.w[i] = m.data.ctypes.data
            st.rows[i] = m.rows
        st.k = k
        st.nthreads = ctypes.pointer(self._threads)
        panels = [self._packed(m) for m in mats]
        for i, p in enumerate(panels):
            st.packed[i] = p.ctypes.data if p is not None else None
        return _make_op(self._lib.li_matmul_op, st, tuple(mats), panels, self._threads, k)

    def moe_op(self, ffn: MoeFFN) -> MoeOp:
        """moe.c's li_moe_ffn over the layer's stacked experts, each packed once as a whole."""
        return c_moe.make_op(self._lib, ffn, self.matmul_op([ffn.router]), self._stacked_panels, self._threads, self._moe_scratch)

    def _stacked_panels(self, m: QMatrix, n_expert: int) -> np.ndarray | None:
        """A stacked expert tensor's panels, where each expert's rows fill whole panels (so
        expert e's are the e-th equal share). Its mapped pages go even where AMX is usable:
        moe.c never takes the fast path that reads them, so the experts (most of the
        model) are resident once."""
        return self._packed(m, drop_mapped=True) if (m.rows // n_expert) % 16 == 0 else None

    def decode_step(self, plan: DecodePlan) -> DecodeStep | None:
        """li_decode over the plan's layers, whose products this set bound (else None)."""
        layer_ops = [(lw.qkv, lw.o, lw.gate_up, lw.down, lw.moe) for lw in plan.layers]
        structs = [[_struct_of(op) if op is not None else None for op in ops] for ops in layer_ops]
        if any(op is not None and st is None for ops, sts in zip(layer_ops, structs) for op, st in zip(ops, sts)):
            return None  # an op another set bound
        return c_decode.make_step(self._lib, plan, structs, self._threads)

    def packs(self, m: QMatrix) -> bool:
        """Whether matmul_op repacks this matrix into panels of 16 interleaved rows (packed.c):
        this build packs its type, packing is on, and AMX does not run the type bit-exactly
        (its exact path repeats the row dots' rounding, which the panels do not)."""
        if not self._pack or self._lib.li_pack_bytes(int(m.type), m.rows, m.cols) <= 0:
            return False
        return not (self._lib.li_amx_usable() and self._lib.li_amx_exact_runs(int(m.type)))

    def _packed(self, m: QMatrix, drop_mapped: bool = False) -> np.ndarray | None:
        """The matrix in panels where `packs` says so; None keeps the row dots. The mapped
        rows are dropped after packing unless AMX's fast path may still read them."""
        if not self.packs(m):
            return None
        size = self._lib.li_pack_bytes(int(m.type), m.rows, m.cols)
        buf = np.empty(size + 64, np.uint8)
        out = buf[-buf.ctypes.data % 64 :][:size]  # 64-byte aligned: whole cache lines per chunk
        if self._lib.li_pack(int(m.type), m.data.ctypes.data, m.rows, m.cols, out.ctypes.data):
            return None
        if drop_mapped or not self._lib.li_amx_usable():  # (AMX's fast path still reads the file's layout)
            _drop_mapped_pages(m.data[: m.rows // 16 * 16])
        return out

    # -- helpers for tests ----------------------------------------------------------------

    def quantize_q8_0(self, x: np.ndarray) -> np.ndarray:
        """ggml block_q8_0 bytes of a float32 row (as the dots see the activations)."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(x.size // 32 * 34, np.uint8)
        self._lib.li_quantize_row_q8_0(x.ctypes.data, out.ctypes.data, x.size)
        return out

    def quantize_q8_1(self, x: np.ndarray) -> np.ndarray:
        """ggml block_q8_1 bytes of a float32 row."""
        x = np.ascontiguousarray(x, dtype=np.float32)
        out = np.empty(x.size // 32 * 36, np.uint8)
        self._lib.li_quantize_row_q8_1(x.ctypes.data, out.ctypes.data, x.size)
        return out


def _drop_mapped_pages(data: np.ndarray) -> None:
    """Once a matrix is packed, its rows in the model file are not read again: drop their
    pages from this process (the OS page cache keeps them while memory allows), so the
    weights are not resident twice. Only for views of a file mapping: on anonymous memory
    MADV_DONTNEED would zero the data."""
    base = data
    while isinstance(base, np.ndarray):
        base = base.base
    if isinstance(base, memoryview):  # np.frombuffer's view of the map
        base = base.obj
    if not isinstance(base, mmap.mmap) or not hasattr(mmap, "MADV_DONTNEED") or data.size == 0:
        return
    start = data.ctypes.data - np.frombuffer(base, np.uint8, count=1).ctypes.data
    page = mmap.PAGESIZE
    first, end = -(-start // page) * page, (start + data.nbytes) // page * page
    if end > first:
        base.madvise(mmap.MADV_DONTNEED, first, end - first)


def _struct_of(op: MatmulOp | MoeOp) -> ctypes.Structure | None:
    """The C struct behind an op this set made: li_op (_make_op), li_moe (c_moe.make_op)."""
    keep = getattr(op, "_keep", None)
    return keep[0] if keep and isinstance(keep[0], (_Op, c_moe.MoeStruct)) else None


def _make_op(fn, st: _Op, mats: tuple[QMatrix, ...], panels: list, threads: ctypes.c_int32, k: int) -> MatmulOp:
    opref = ctypes.byref(st)
    view = ctypes.c_float.from_buffer  # refuses read-only and non-contiguous buffers
    byref = ctypes.byref
    rows = [m.rows for m in mats]
    nmat = len(mats)
    f32 = _F32

    def check(x: np.ndarray, outs: Sequence[np.ndarray]) -> int:
        if not isinstance(x, np.ndarray) or x.dtype != f32 or x.ndim != 2 or x.shape[1] != k or not x.flags.c_contiguous:
            raise ValueError(f"x must be a C-contiguous float32 [n, {k}] array")
        n = x.shape[0]
        if len(outs) != nmat:
            raise ValueError(f"this op writes {nmat} outputs, got {len(outs)}")
        for o, r in zip(outs, rows):
            if not isinstance(o, np.ndarray) or o.dtype != f32 or o.shape != (n, r) or not o.flags.c_contiguous or not o.flags.writeable:
                raise ValueError(f"outputs must be C-contiguous writable float32 [n, rows] arrays; expected {(n, r)}")
        if n >= 2**31:
            raise ValueError("too many activation rows")
        return n

    def slow(x: np.ndarray, outs: Sequence[np.ndarray], n_fast: int = 0) -> None:
        """Checks everything; also runs read-only activations, which c_float views refuse."""
        n = check(x, outs)
        if n == 0:
            return
        ys = [ctypes.c_void_p(o.ctypes.data) for o in outs] + [None] * (MAX_MATS - nmat)
        rc = fn(opref, ctypes.c_void_p(x.ctypes.data), n, *ys, max(0, min(int(n_fast), n)))
        if rc:
            raise RuntimeError(f"C matmul failed: {_ERRORS.get(rc, rc)}")

    # The common shapes, unrolled. The fast path reads a few attributes; c_float views
    # refuse non-contiguous, read-only and empty buffers, which then take the slow path.
    if nmat == 1:
        (r0,) = rows

        def op(x: np.ndarray, outs: Sequence[np.ndarray], n_fast: int = 0) -> None:
            n = len(x)
            (y0,) = outs
            if x.dtype is not f32 or y0.dtype is not f32 or x.shape != (n, k) or y0.shape != (n, r0):
                return slow(x, outs, n_fast)
            try:
                rc = fn(opref, byref(view(x)), n, byref(view(y0)), None, None, n_fast)
            except (TypeError, ValueError):
                return slow(x, outs, n_fast)
            if rc:
                raise RuntimeError(f"C matmul failed: {_ERRORS.get(rc, rc)}")

    elif nmat == 2:
        r0, r1 = rows

        def op(x: np.ndarray, outs: Sequence[np.ndarray], n_fast: int = 0) -> None:
            n = len(x)
            y0, y1 = outs
            if (x.dtype is not f32 or y0.dtype is not f32 or y1.dtype is not f32 or x.shape != (n, k)
                    or y0.shape != (n, r0) or y1.shape != (n, r1)):  # fmt: skip
                return slow(x, outs, n_fast)
            try:
                rc = fn(opref, byref(view(x)), n, byref(view(y0)), byref(view(y1)), None, n_fast)
            except (TypeError, ValueError):
                return slow(x, outs, n_fast)
            if rc:
                raise RuntimeError(f"C matmul failed: {_ERRORS.get(rc, rc)}")

    else:
        r0, r1, r2 = rows

        def op(x: np.ndarray, outs: Sequence[np.ndarray], n_fast: int = 0) -> None:
            n = len(x)
            y0, y1, y2 = outs
            if (x.dtype is not f32 or y0.dtype is not f32 or y1.dtype is not f32 or y2.dtype is not f32
                    or x.shape != (n, k) or y0.shape != (n, r0) or y1.shape != (n, r1) or y2.shape != (n, r2)):  # fmt: skip
                return slow(x, outs, n_fast)
            try:
                rc = fn(opref, byref(view(x)), n, byref(view(y0)), byref(view(y1)), byref(view(y2)), n_fast)
            except (TypeError, ValueError):
                return slow(x, outs, n_fast)
            if rc:
                raise RuntimeError(f"C matmul failed: {_ERRORS.get(rc, rc)}")

    op._keep = (st, mats, panels, threads)  # type: ignore[attr-defined]  # the weights must outlive the op
    return op
