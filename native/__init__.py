"""localinfer's native kernels (installed as `localinfer_native`): products of GGUF
blocks with float activations, in C (compiled at install time) and in Numba.

The forward pass that uses them lives in `localinfer.backends.native`.
"""

from __future__ import annotations

import os

from localinfer_native.types import SUPPORTED_TYPES, Kernels, MatmulOp, QMatrix

KERNEL_SETS = ("auto", "c", "numba")


class KernelsUnavailable(RuntimeError):
    """The chosen kernel set cannot run here (e.g. the C library did not compile)."""


def load_kernels(name: str | None = None, threads: int | None = None) -> Kernels:
    """The kernel set `name` (default: $LOCALINFER_KERNELS, else auto).

    auto takes C where it compiled, and Numba otherwise. Numba is imported only when it
    is chosen, because importing it costs half a second of cold start.
    """
    name = name or os.environ.get("LOCALINFER_KERNELS") or "auto"
    if name not in KERNEL_SETS:
        raise KernelsUnavailable(f"unknown kernel set '{name}'; choose one of: {', '.join(KERNEL_SETS)}")
    kernels: Kernels
    if name in ("auto", "c"):
        try:
            from localinfer_native.c_kernels import CKernels

            kernels = CKernels()
        except (ImportError, OSError, KernelsUnavailable) as e:
            if name == "c":
                raise KernelsUnavailable(f"the C kernels are not available ({e}); reinstall with a C compiler, or use --kernels numba") from e
            name = "numba"
    if name == "numba":
        from localinfer_native.numba_kernels import NumbaKernels

        kernels = NumbaKernels()
    if threads:
        kernels.set_threads(threads)
    return kernels


def kernel_types(name: str | None = None) -> frozenset:
    """The block types the set `name` (as load_kernels reads it) would run, found without
    compiling anything: the C set's where its library loads, else Numba's (importing Numba,
    which is then the set that runs), else the types every set runs."""
    name = name or os.environ.get("LOCALINFER_KERNELS") or "auto"
    if name in ("auto", "c"):
        try:
            from localinfer_native.c_kernels import CKernels, _load

            _load()
            return CKernels.supported_types
        except (ImportError, OSError, KernelsUnavailable):
            pass
    try:
        from localinfer_native.numba_ir import NUMBA_TYPES

        return NUMBA_TYPES
    except ImportError:
        return SUPPORTED_TYPES


__all__ = ["KERNEL_SETS", "SUPPORTED_TYPES", "Kernels", "KernelsUnavailable", "MatmulOp", "QMatrix", "kernel_types", "load_kernels"]
