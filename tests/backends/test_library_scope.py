"""localinfer puts the shared libstdc++ in the process's global symbol scope before anything
loads llama.cpp: a CUDA build's libggml-cuda.so exports its own static copy of libstdc++, and
libllama's std::regex bound to it and crashed where numpy had loaded libstdc++ privately first
(an H200, docs/benchmarks.md). The global scope is what dlopen(NULL) searches."""

from __future__ import annotations

import subprocess
import sys

import pytest

IN_GLOBAL_SCOPE = "import ctypes; ctypes.CDLL(None)._ZNSt6locale7classicEv"  # std::locale::classic()


def global_has_libstdcxx(before: str) -> bool:
    return subprocess.run([sys.executable, "-c", before + IN_GLOBAL_SCOPE], capture_output=True, timeout=60).returncode == 0


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the dynamic loader's scopes are Linux's (glibc)")
def test_libstdcxx_is_global_once_localinfer_is_imported() -> None:
    assert not global_has_libstdcxx("import numpy; ")  # numpy loads it privately (RTLD_LOCAL): the crash's condition
    assert global_has_libstdcxx("import numpy; import localinfer; ")
    assert global_has_libstdcxx("import localinfer; import numpy; ")
