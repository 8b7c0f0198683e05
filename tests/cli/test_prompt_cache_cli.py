"""The prompt cache from the command line: `run --json` and `--verbose` say where a prompt's
tokens came from, a second process finds the first one's blocks on disk, and `localinfer
cache` lists and clears them."""

from __future__ import annotations

import json
from pathlib import Path

from ..conftest import run_cli

PROMPT = " ".join(f"Line {i} of the harbour log: the tide turned at {i % 12} o'clock." for i in range(30)) + " What turned?"


def test_run_then_run_again_from_disk_then_list_and_clear(tmp_path: Path) -> None:
    folder = ["--cache-dir", str(tmp_path)]
    first = run_cli("run", "--json", "-n", "8", "--temperature", "0", *folder, PROMPT)
    assert first.returncode == 0, first.stderr
    cold = json.loads(first.stdout)
    assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and cold["cached_from"] == {}
    second = run_cli("run", "--verbose", "-n", "8", "--temperature", "0", *folder, PROMPT)
    assert second.returncode == 0, second.stderr
    n = cold["usage"]["prompt_tokens"] - 1  # all but the last token, put back from the files
    assert f"prompt cache: {n} of {n + 1} prompt tokens not computed: {n} from disk" in second.stderr
    assert second.stdout.strip() == cold["text"].strip()

    listed = json.loads(run_cli("cache", "--json", *folder).stdout)
    assert len(listed["entries"]) == 1 and listed["entries"][0]["blocks"] >= 2 and listed["bytes"] > 0
    assert listed["entries"][0]["engine"] in ("native", "llama.cpp") and listed["entries"][0]["kv_types"] == ["f16", "f16"]
    cleared = json.loads(run_cli("cache", "clear", "--json", *folder).stdout)
    assert cleared["deleted_blocks"] == listed["entries"][0]["blocks"]
    assert json.loads(run_cli("cache", "--json", *folder).stdout)["entries"] == []


def test_bad_sizes_and_off_are_one_line(tmp_path: Path) -> None:
    bad = run_cli("run", "--cache-ram", "lots", "Hi")
    assert bad.returncode == 2 and "not a size" in bad.stderr and "Traceback" not in bad.stderr
    off = run_cli("run", "-n", "4", "--no-prompt-cache", "--cache-dir", str(tmp_path), "Hi")
    assert off.returncode == 0, off.stderr
    assert list(tmp_path.iterdir()) == []
