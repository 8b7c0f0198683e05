"""`run` on a reasoning model: the answer on stdout without the thinking (a pipe), the
thinking as its own `reasoning` field under --json, --think-budget, --think off, -n; --think
with an effort, for gpt-oss's template; and on a base model without a chat template, the
one line that says what it does instead."""

from __future__ import annotations

import json
from pathlib import Path

from localinfer.engine.templates import render_chat

from ..conftest import THREADS, run_cli, with_template

ASK = ("--temperature", "0", "--threads", str(THREADS), "--draft", "none", "-n", "40", "What is the capital of France?")
GPT_OSS = (Path(__file__).parents[1] / "data" / "openai-gpt-oss-120b.jinja").read_text()


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
    refused = run_cli("run", "--think", "maybe", "hi")
    assert refused.returncode == 2 and "'maybe' is not on, off, low, medium or high" in refused.stderr


def test_think_takes_an_effort_to_a_template_that_reads_one(model_path: Path, tmp_path: Path) -> None:
    """The embedded model under gpt-oss's template: `--think high` answers as a --raw run of
    the prompt rendered with `reasoning_effort` high does (rendered here by the same sandbox).
    The model writes no harmony, so what it writes is all answer."""
    gguf = with_template(model_path, tmp_path / "gpt-oss-template.gguf", GPT_OSS)
    for effort in ("high", "low"):
        prompt = render_chat(GPT_OSS, [{"role": "user", "content": ASK[-1]}], variables={"reasoning_effort": effort})
        assert f"Reasoning: {effort}" in prompt
        asked, raw = run_cli("run", str(gguf), "--think", effort, "--json", *ASK), run_cli("run", str(gguf), "--raw", "--json", *ASK[:-1], prompt)
        assert asked.returncode == 0 and raw.returncode == 0, asked.stderr + raw.stderr
        out, want = json.loads(asked.stdout), json.loads(raw.stdout)
        assert (out["text"], out["usage"]["prompt_tokens"]) == (want["text"], want["usage"]["prompt_tokens"])
        assert out["text"] and out["reasoning"] == "" and "<|" not in out["text"]


def test_a_model_without_a_chat_template_says_so_once(model_path: Path, tmp_path: Path) -> None:
    base = with_template(model_path, tmp_path / "base.gguf", None)
    r = run_cli("run", str(base), *ASK)
    assert r.returncode == 0 and r.stdout.strip()
    assert [line for line in r.stderr.splitlines() if line.strip()] == [
        "note: this model has no chat template (a base model?); prompts are wrapped in ChatML. Use --raw to send them as they are."
    ]
    raw = run_cli("run", str(base), "--raw", *ASK)
    assert raw.returncode == 0 and raw.stderr.strip() == ""
