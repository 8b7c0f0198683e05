"""The native tests share the llama.cpp-made models of tests/conftest.py (F32, Q4_K_M), and a
portable build of the C kernels."""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from localinfer_native.c_kernels import CKernels
from localinfer_native.types import QMatrix

from ..conftest import llama_quantize, made_once

__all__ = ["llama_quantize"]  # benchmarks import it from here

SRC = Path(__file__).resolve().parents[2] / "native" / "c"


def build_library(out: Path, flags: list[str]) -> Path:
    """native/c compiled with these flags into `out` (a test-only build beside the installed one)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or sys.platform == "win32":
        pytest.skip("no C compiler for a test build of the kernels")
    objects = {src: out.with_name(f"{out.stem}-{src.stem}.o") for src in sorted(SRC.glob("*.c"))}

    def compile_one(src: Path) -> None:  # a source per process: the machine's cores build at once
        subprocess.run([cc, "-O2", "-std=gnu11", "-fPIC", *flags, "-I", str(SRC), "-c", str(src), "-o", str(objects[src])],
                       check=True, capture_output=True, text=True)  # fmt: skip

    with ThreadPoolExecutor(os.cpu_count() or 1) as pool:
        list(pool.map(compile_one, objects))
    subprocess.run([cc, "-shared", *flags, *map(str, objects.values()), "-o", str(out), "-lm"], check=True, capture_output=True, text=True)
    return out


def cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return set()
    return set(next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), []))


@pytest.fixture(scope="session")
def portable_library(tmp_path_factory) -> Path:
    """native/c compiled without -march: the scalar paths, single-threaded (no OpenMP)."""
    return made_once(tmp_path_factory, "_ckernels_portable.so", lambda out: build_library(out, []))


@pytest.fixture(scope="session")
def avx2_library(tmp_path_factory) -> Path:
    """native/c for AVX2 alone (no AVX-512, no VNNI), so the AVX2 paths stay tested on CPUs that have more."""
    if not {"avx2", "fma", "f16c"} <= cpu_flags():
        pytest.skip("this CPU has no AVX2")
    return made_once(tmp_path_factory, "_ckernels_avx2.so", lambda out: build_library(out, ["-mavx2", "-mfma", "-mf16c"]))


@pytest.fixture(scope="session", params=["installed", "avx2", "portable"])
def kernels(request) -> CKernels:
    """The installed build, an AVX2-only build and a portable (scalar) one, each test on all three."""
    if request.param == "installed":
        return CKernels(threads=2)
    kc = CKernels(threads=2, library=request.getfixturevalue(f"{request.param}_library"))
    if request.param == "avx2":
        assert "avx2" in kc.describe() and "vnni" not in kc.describe()
    else:
        assert "scalar" in kc.describe()
    return kc


@pytest.fixture(scope="module", params=["installed", "avx2", "portable", "numba"])
def every_kernel_set(request):
    """Each C build (the installed one, AVX2-only, portable: as `kernels`) and the Numba set."""
    if request.param == "numba":
        from localinfer_native.numba_kernels import NumbaKernels

        return NumbaKernels()
    if request.param == "installed":
        return CKernels(threads=2)
    return CKernels(threads=2, library=request.getfixturevalue(f"{request.param}_library"))


@pytest.fixture(scope="session")
def ggml_quantize():
    """llama.cpp's own quantizer for one matrix (ggml_quantize_chunk, which llama_model_quantize calls)."""
    import llama_cpp

    fn = ctypes.CDLL(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.so")).ggml_quantize_chunk
    fn.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64, ctypes.c_int64, ctypes.c_void_p]
    fn.restype = ctypes.c_size_t

    def run_quantize(qtype: Q, w: np.ndarray) -> QMatrix:
        w = np.ascontiguousarray(w, dtype=np.float32)
        rows, cols = w.shape
        block, size = GGML_QUANT_SIZES[qtype]
        out = np.zeros((rows, cols // block * size), np.uint8)
        assert fn(int(qtype), w.ctypes.data, out.ctypes.data, 0, rows, cols, None) == out.size
        return QMatrix.from_array(qtype, out, cols)

    return run_quantize
