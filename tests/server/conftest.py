"""One server for the dialect tests (Anthropic, Responses, Ollama): the F32 model, whose
greedy answers cannot flip on a cached prompt, and any other model by path (--allow-paths),
so a test can ask the R1-template model for thinking without a server of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_serve import Server


@pytest.fixture(scope="session")
def dialects(f32_path: Path) -> Iterator[Server]:
    s = Server(str(f32_path), "--parallel", "2", "--allow-paths", "--max-loaded", "2", "--ctx", "1024")
    s.model = str(f32_path)
    yield s
    assert s.stop()[0] == 0
