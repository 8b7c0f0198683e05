"""Fixtures for the quantization toolkit: real source models built from the embedded one.

Session-scoped, since each costs seconds: an F16 GGUF widened from the embedded
SmolLM2-135M-Instruct Q4_1 (`f16_source_path`), and that model written as a Hugging
Face checkpoint folder (`hf_folder`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from localinfer_quant.hf import export_hf
from localinfer_quant.source import embedded_f16

from ..conftest import made_once


@pytest.fixture(scope="session")
def f16_source_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2-135M-Instruct as an F16 GGUF (matrices F16, norms F32)."""
    return made_once(tmp_path_factory, "SmolLM2-135M-Instruct.F16.gguf", embedded_f16)


@pytest.fixture(scope="session")
def hf_folder(f16_source_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The F16 source as a Hugging Face folder: config.json, tokenizer files, model.safetensors."""
    return made_once(tmp_path_factory, "SmolLM2-135M-Instruct", lambda out: export_hf(f16_source_path, out))
