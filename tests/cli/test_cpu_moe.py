"""`--cpu-moe` and `--n-cpu-moe` on the command line: listed by every command that loads a
model to decode (run, chat, serve, bench model), refused in one line where the value is
bad, and the plan's split in bytes per device from `run --verbose` and `doctor MODEL`, on a
tiny qwen3moe written here and run by real llama.cpp."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ..conftest import run_cli
from ..native.test_architectures import first_tokens, tiny_model, vocabulary_of
from .test_bad_input_property import invoke

COMMANDS = (["run"], ["chat"], ["serve"], ["bench", "model"])


@pytest.fixture(scope="module")
def moe_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_model(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe.gguf", "qwen3moe", first_tokens(vocabulary_of(model_path), 1024), 4, 2, np.random.default_rng(5))


def test_help_lists_both_flags() -> None:
    for words in COMMANDS:
        code, out, _ = invoke([*words, "--help"])
        assert code == 0 and "--cpu-moe" in out and "-ncmoe, --n-cpu-moe" in out, words


def one_line_usage_error(argv: list[str], *needles: str) -> None:
    code, _, err = invoke(argv)
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (argv, code, err)
    for needle in needles:
        assert needle in lines[0], (argv, lines[0])


def test_a_bad_value_is_one_line(isolated_home: Path) -> None:
    # --engine vllm fails the command after the option, so a check that is missing shows as a wrong error, not a load
    for words in (["run"], ["chat"], ["serve"]):
        one_line_usage_error([*words, "--n-cpu-moe", "-1", "--engine", "vllm"], "--n-cpu-moe", "not -1")
        one_line_usage_error([*words, "-ncmoe", "two", "--engine", "vllm"], "--n-cpu-moe")
    one_line_usage_error(["run", "--cpu-moe", "--n-cpu-moe", "2", "Hi"], "--n-cpu-moe", "not both")
    one_line_usage_error(["bench", "model", "-ncmoe", "0,-1", "nope"], "-ncmoe", "not -1")
    one_line_usage_error(["bench", "model", "-ncmoe", "some", "nope"], "-ncmoe", "'some' is not a number of layers")
    one_line_usage_error(["bench", "model", "--cpu-moe", "-ncmoe", "1", "nope"], "--n-cpu-moe", "not both")
    code, _, err = invoke(["bench", "model", "-ncmoe", "0,1,all,auto", "nope"])  # a good list: on to the model, which is not there
    assert code == 1 and err.startswith("error: unknown model 'nope'"), err


def test_verbose_and_doctor_show_the_split_in_bytes_per_device(moe_path: Path) -> None:
    r = run_cli("run", str(moe_path), "--raw", "--temp", "0", "-n", "2", "--verbose", "--no-prompt-cache", "--draft", "none", "Hi", env={"COLUMNS": "400"})
    assert r.returncode == 0, r.stderr
    memory = json.loads(run_cli("doctor", str(moe_path), "--json").stdout)["model"]["memory"]
    assert memory["fits"] and "read per token" in memory["split"] and memory["ram_bytes"] > 0
    assert f"split: {memory['split']}" in r.stderr  # run's defaults: the same plan
    text = run_cli("doctor", str(moe_path), env={"COLUMNS": "400"}).stdout
    assert f"memory: {memory['split']}; {memory['placement']}" in text
