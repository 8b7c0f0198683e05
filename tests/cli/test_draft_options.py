"""`run --draft ...` as a user types it: the switch, its report, and its bad values."""

from __future__ import annotations

import json

import pytest

from ..conftest import run_cli
from .test_errors import assert_one_line_error

QUOTE = "Repeat exactly: the cat sat on the mat, the cat sat on the mat, the cat sat on the mat."


@pytest.mark.parametrize("engine", ["llama.cpp", "native"])
def test_draft_none_and_prompt_lookup_both_answer_and_report(engine: str) -> None:
    common = ("run", "--engine", engine, "--temperature", "0", "--max-tokens", "40", "--json")
    off = json.loads(run_cli(*common, "--draft", "none", QUOTE).stdout)
    on = json.loads(run_cli(*common, QUOTE).stdout)
    assert off["timings"]["drafted"] == 0 and off["timings"]["tokens_per_forward"] == 1.0
    assert on["timings"]["drafted"] > 0 and on["timings"]["accepted"] > 0 and on["timings"]["tokens_per_forward"] > 1.0
    assert on["text"] and off["text"]
    verbose = run_cli("run", "--engine", engine, "--temperature", "0", "--max-tokens", "40", "--verbose", QUOTE)
    assert verbose.returncode == 0 and "tokens per target forward" in verbose.stderr


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--draft", " "), "auto, prompt-lookup, none"),
        (("--draft-max", "0"), "between 1 and 32"),
        (("--draft-ngram-min", "5", "--draft-ngram-max", "2"), "--draft-ngram-min (5) is more than --draft-ngram-max (2)"),
    ],
)
def test_bad_draft_options_get_one_line(args: tuple[str, ...], needle: str) -> None:
    r = run_cli("run", *args, "Hi")
    assert_one_line_error(r, needle, code=2)
