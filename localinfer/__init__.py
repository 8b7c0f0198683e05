"""localinfer: a local LLM runtime. The engine is in `localinfer.engine`, backends in `localinfer.backends`."""

import sys

__version__ = "0.1.0"


def _libstdcxx_first() -> None:
    """Put the system's libstdc++ in the global symbol scope before llama_cpp loads its libraries.

    llama-cpp-python opens them RTLD_GLOBAL, and a CUDA build's libggml-cuda.so carries a
    static copy of libstdc++ whose 3,464 std:: symbols it exports. Where numpy or numba had
    loaded libstdc++ first (privately), libllama's std::regex then bound to that copy's locale
    facets and crashed at model load (an H200, CUDA 13; docs/benchmarks.md). Promoting the
    shared libstdc++ to global scope first makes every later library bind to it."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL("libstdc++.so.6", mode=ctypes.RTLD_GLOBAL)
        except OSError:  # no shared libstdc++ (a static toolchain): nothing to bind to
            pass


_libstdcxx_first()
