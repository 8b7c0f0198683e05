"""The machine's own limits, measured by native/c/membench.c (compiled into the C kernels'
library): memory read bandwidth and the peak rate of each multiply-add instruction. The
benchmarks in bench/ compare the kernels with them."""

from __future__ import annotations

import ctypes
import functools

from localinfer_native import KernelsUnavailable


@functools.cache
def library() -> ctypes.CDLL:
    """The C kernels' library with membench.c's functions declared; KernelsUnavailable where
    it is not built, or built before membench.c."""
    from localinfer_native.c_kernels import library_path

    path = library_path()
    if path is None:
        raise KernelsUnavailable("the C kernels are not built; reinstall with a C compiler (./install.sh)")
    lib = ctypes.CDLL(str(path))
    try:
        lib.li_read_bandwidth.restype = ctypes.c_double
        lib.li_read_bandwidth.argtypes = [ctypes.c_void_p, ctypes.c_int64, ctypes.c_int, ctypes.c_int, ctypes.POINTER(ctypes.c_uint64)]
        lib.li_peak_gmacs.restype = ctypes.c_double
        lib.li_peak_gmacs.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64]
        lib.li_peak_kind.restype = ctypes.c_int
        lib.li_peak_kind.argtypes = [ctypes.c_int]
    except AttributeError:
        raise KernelsUnavailable(f"{path.name} predates native/c/membench.c; reinstall to rebuild it (./install.sh)") from None
    lib.li_build_info.restype = ctypes.c_char_p
    lib.li_build_info.argtypes = []
    return lib
