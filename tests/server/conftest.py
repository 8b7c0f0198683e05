"""One server for the dialect tests (Anthropic, Responses, Ollama): the F32 model, whose
greedy answers cannot flip on a cached prompt, and any other model by path (--allow-paths),
so a test can ask the R1-template model for thinking without a server of its own."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from .test_serve import Server, serving


def check_nesting(steps: list[tuple[str, int]]) -> None:
    """A stream's parts (Anthropic's content blocks, Responses' output items) opened, given
    deltas and closed in turn at consecutive indices: `steps` are ("start" | "delta" |
    "stop", index), in the order the events came."""
    open_index, next_index = None, 0
    for step, index in steps:
        if step == "start":
            assert open_index is None and index == next_index, steps
            open_index, next_index = index, next_index + 1
        else:
            assert index == open_index, steps
            open_index = None if step == "stop" else open_index
    assert open_index is None and next_index > 0, steps


@pytest.fixture(scope="session")
def dialects(f32_path: Path) -> Iterator[Server]:
    yield from serving(f32_path, "--parallel", "2", "--allow-paths", "--max-loaded", "2", "--ctx", "1024")
