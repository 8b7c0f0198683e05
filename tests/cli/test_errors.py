"""Every mistake a user makes gets one line on stderr, a non-zero exit, and no traceback."""

import pytest

from ..conftest import run_cli


def assert_one_line_error(r, *needles: str, code: int = 1) -> None:
    assert r.returncode == code, (r.returncode, r.stderr)
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, r.stderr
    assert lines[0].startswith("error: ")
    assert "Traceback" not in r.stderr
    for needle in needles:
        assert needle in lines[0]


def test_unknown_model_suggests_a_name() -> None:
    assert_one_line_error(run_cli("run", "smollm3:135m", "hi"), "unknown model", "did you mean 'smollm2:135m'")


def test_truncated_gguf(model_path, tmp_path) -> None:
    bad = tmp_path / "half.gguf"
    bad.write_bytes(model_path.read_bytes()[: 40_000_000])
    assert_one_line_error(run_cli("run", str(bad), "hi"), "truncated")


def test_not_a_gguf(tmp_path) -> None:
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 this is a zip file")
    assert_one_line_error(run_cli("run", str(bad), "hi"), "not a GGUF")


def test_missing_file() -> None:
    assert_one_line_error(run_cli("run", "./nope.gguf", "hi"), "no such file")


def test_context_too_small_for_the_prompt() -> None:
    assert_one_line_error(run_cli("run", "--ctx", "256", "word " * 400), "context holds", "--ctx")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--temperature", "hot"], "--temperature"),
        (["--top-p", "1.5"], "between 0 and 1"),
        (["--gpu-layers", "many"], "--gpu-layers"),
        (["--max-tokens", "0"], "--max-tokens"),
        (["--engine", "vllm"], "--engine"),
    ],
)
def test_invalid_option_values(args, needle) -> None:
    assert_one_line_error(run_cli("run", *args, "hi"), needle, code=2)


@pytest.mark.parametrize("value", ["0", "many"])
def test_a_bad_thread_count_in_the_environment(value: str) -> None:
    assert_one_line_error(run_cli("run", "hi", env={"LOCALINFER_THREADS": value}), "LOCALINFER_THREADS", code=2)


def test_pull_without_network() -> None:
    assert_one_line_error(run_cli("pull", "someone/some-model-GGUF"), "cannot reach the Hugging Face hub")


def test_pull_of_catalog_model_without_network() -> None:
    assert_one_line_error(run_cli("pull", "qwen2.5:0.5b"), "cannot reach the Hugging Face hub")


def test_rm_of_unknown_model() -> None:
    assert_one_line_error(run_cli("rm", "nothing-here"), "not a pulled model")


def test_no_traceback_even_for_a_directory(tmp_path) -> None:
    folder = tmp_path / "dir.gguf"
    folder.mkdir()
    assert_one_line_error(run_cli("run", str(folder), "hi"), "not a file")


def test_model_that_cannot_fit_is_refused_with_the_numbers() -> None:
    # A 50M-token context needs a KV cache of ~1 TiB: refused before llama.cpp allocates anything.
    assert_one_line_error(run_cli("run", "--ctx", "50000000", "hi"), "GiB of RAM", "KV cache", "free")
