"""The native tests share the llama.cpp-made models of tests/conftest.py (F32, Q4_K_M)."""

from ..conftest import llama_quantize

__all__ = ["llama_quantize"]  # benchmarks import it from here
