"""`run` on a reasoning model: the answer on stdout without the thinking (a pipe), the
thinking as its own `reasoning` field under --json, --think-budget, --think off, -n."""

from __future__ import annotations

import json
from pathlib import Path

from ..conftest import THREADS, run_cli

ASK = ("--temperature", "0", "--threads", str(THREADS), "--draft", "none", "-n", "40", "What is the capital of France?")


def test_thinking_is_apart_from_the_answer(r1_model_path: Path) -> None:
    r = run_cli("run", str(r1_model_path), "--think-budget", "8", "--json", *ASK)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["reasoning"] and out["text"] and "think>" not in out["reasoning"] and not out["text"].startswith("</think>")
    assert 8 < out["usage"]["completion_tokens_details"]["reasoning_tokens"] < out["usage"]["completion_tokens"] <= 40
    piped = run_cli("run", str(r1_model_path), "--think-budget", "8", *ASK)  # stdout is a pipe: the answer alone
    assert piped.returncode == 0 and piped.stdout == out["text"] + "\n"


def test_think_off_closes_the_block_the_template_opens(r1_model_path: Path) -> None:
    r = run_cli("run", str(r1_model_path), "--think", "off", "--json", *ASK)
    assert r.returncode == 0, r.stderr
    out = json.loads(r.stdout)
    assert out["reasoning"] == "" and out["text"] and out["usage"]["completion_tokens_details"]["reasoning_tokens"] == 0
    assert run_cli("run", "--think", "maybe", "hi").returncode == 2
