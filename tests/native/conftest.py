"""The native tests share the llama.cpp-made models of tests/conftest.py (F32, Q4_K_M), and a
portable build of the C kernels."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import llama_quantize

__all__ = ["llama_quantize"]  # benchmarks import it from here

SRC = Path(__file__).resolve().parents[2] / "native" / "c"


@pytest.fixture(scope="session")
def portable_library(tmp_path_factory) -> Path:
    """native/c compiled without -march: the scalar paths, single-threaded (no OpenMP)."""
    cc = shutil.which("gcc") or shutil.which("cc")
    if cc is None or sys.platform == "win32":
        pytest.skip("no C compiler for the portable build")
    out = tmp_path_factory.mktemp("portable") / "_ckernels_portable.so"
    sources = sorted(str(p) for p in SRC.glob("*.c"))
    subprocess.run([cc, "-O2", "-std=gnu11", "-shared", "-fPIC", "-I", str(SRC), *sources, "-o", str(out), "-lm"],
                   check=True, capture_output=True, text=True)  # fmt: skip
    return out
