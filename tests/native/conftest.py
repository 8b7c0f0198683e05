"""Models made from the embedded one by llama.cpp's own quantizer, shared by the native tests."""

from __future__ import annotations

import ctypes
from pathlib import Path

import pytest

from localinfer.modelfile import inspect

from ..conftest import THREADS


def llama_quantize(src: Path, dst: Path, ftype: int) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize), from the embedded Q4_1."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the source is itself quantized
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


@pytest.fixture(scope="session")
def q4_k_m_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import llama_cpp

    path = llama_quantize(model_path, tmp_path_factory.mktemp("q4km") / "smollm2-135m-q4_k_m.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M)
    types = inspect(path).tensor_types
    assert types.get("Q4_K") and types.get("Q6_K"), types  # the K-quant kernels really run
    return path


@pytest.fixture(scope="session")
def f32_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import llama_cpp

    path = llama_quantize(model_path, tmp_path_factory.mktemp("f32") / "smollm2-135m-f32.gguf", llama_cpp.LLAMA_FTYPE_ALL_F32)
    assert set(inspect(path).tensor_types) == {"F32"}
    return path
