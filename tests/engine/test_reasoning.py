"""Reasoning models: thinking split from the answer above the backends.

No reasoning model is at hand offline, so the model here is scripted: the embedded
model's real tokenizer (in whose vocabulary `<think>` and `</think>` are several tokens
each, so every tag arrives split across tokens) behind a backend whose logits write a
given text, token by token, by position. The chat templates are Qwen3's (it reads
`enable_thinking`; the model opens the block) and DeepSeek-R1-Distill-Qwen's (the
generation prompt opens it), as their model cards ship them.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import Backend, Batch
from localinfer.engine.engine import Engine
from localinfer.engine.reasoning import BUDGET_CLOSE, CLOSE, OPEN, ReasoningSplitter, ThinkSyntax
from localinfer.engine.types import SamplingParams

from .scripted import OverTokenizer

TEMPLATES = Path(__file__).parent / "templates"
QWEN3, R1 = (TEMPLATES / "qwen3.jinja").read_text(), (TEMPLATES / "deepseek-r1-distill-qwen.jinja").read_text()
GREEDY = SamplingParams(temperature=0, repeat_penalty=1.0)


class Scripted(OverTokenizer):
    """The embedded model's tokenizer; forward's logits pick script[position + 1 - prompt
    length] (then end of generation), so the answer is the script whatever the engine
    writes itself in between."""

    name = "scripted"

    def __init__(self, tokenizer: Backend, template: str, script: str, prompt_len: int) -> None:
        super().__init__(tokenizer, template, n_seq_max=1)
        self.script, self.prompt_len = tokenizer.tokenize(script, add_special=False), prompt_len

    def forward(self, batch: Batch) -> np.ndarray:
        rows = np.flatnonzero(batch.want_logits)
        logits = np.zeros((len(rows), self.vocab.n_vocab), np.float32)
        for out, row in enumerate(rows):
            i = int(batch.positions[row]) + 1 - self.prompt_len
            logits[out, self.script[i] if i < len(self.script) else self.vocab.eos_id] = 1.0
        return logits

    def embed(self, batch: Batch) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def kv_clear(self, seq_id: int) -> None:
        pass

    def kv_truncate(self, seq_id: int, n_keep: int) -> int:
        return n_keep

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        return n_tokens

    def kv_read(self, seq_id: int, start: int, end: int) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def kv_write(self, seq_id: int, start: int, data: bytes) -> int:  # pragma: no cover
        raise NotImplementedError


def answer(backend: Backend, template: str, script: str, params: SamplingParams = GREEDY, think: bool = True):
    """(the rendered prompt, the engine's result) for one user turn answered by `script`."""
    plain = Engine(Scripted(backend, template, "", 0))
    prompt = plain.render_chat([{"role": "user", "content": "What is the capital of France?"}], think=think)
    tokens = plain.tokenize_prompt(prompt)
    engine = Engine(Scripted(backend, template, script, len(tokens)))
    return prompt, engine.complete(tokens, params)


def tokens_through(backend: Backend, text: str, tag: str) -> int:
    """How many of text's tokens it takes to have written `tag`."""
    tokens = backend.tokenize(text, add_special=False)
    return next(n for n in range(1, len(tokens) + 1) if tag in b"".join(map(backend.token_bytes, tokens[:n])).decode(errors="replace"))


def test_the_syntax_is_found_in_the_template(backend) -> None:
    tokenize = lambda text: backend.tokenize(text, add_special=False)  # noqa: E731
    assert ThinkSyntax.detect(QWEN3, tokenize) == ThinkSyntax(switchable=True)
    assert ThinkSyntax.detect(R1, tokenize) == ThinkSyntax(switchable=False)
    assert ThinkSyntax.detect(backend.facts.chat_template, tokenize) is None  # SmolLM2 does not think
    assert len(tokenize(OPEN)) > 1 and len(tokenize(CLOSE)) > 1  # so every tag below arrives in pieces


def test_the_models_thinking_is_split_from_its_answer(backend) -> None:
    prompt, out = answer(backend, QWEN3, f"{OPEN}\nFrance is in Europe.\n{CLOSE}\n\nParis.")
    assert prompt.endswith("<|im_start|>assistant\n")  # Qwen3 thinks unless told not to; the model opens the block
    assert (out.reasoning, out.text, out.finish_reason) == ("France is in Europe.\n", "Paris.", "stop")
    assert out.reasoning_tokens == tokens_through(backend, f"{OPEN}\nFrance is in Europe.\n{CLOSE}\n\nParis.", CLOSE) < out.completion_tokens
    assert out.usage()["completion_tokens_details"] == {"reasoning_tokens": out.reasoning_tokens}


def test_a_template_that_opens_the_block_starts_inside_it(backend) -> None:
    prompt, out = answer(backend, R1, f"Europe, then.\n{CLOSE}\n\nParis.")
    assert prompt.rstrip().endswith(OPEN)
    assert (out.reasoning, out.text) == ("Europe, then.\n", "Paris.")
    assert out.reasoning_tokens == tokens_through(backend, f"Europe, then.\n{CLOSE}\n\nParis.", CLOSE)


def test_thinking_off(backend) -> None:
    prompt, out = answer(backend, QWEN3, "Paris.", think=False)
    assert prompt.endswith(f"{OPEN}\n\n{CLOSE}\n\n")  # Qwen3's template closes an empty block itself
    assert (out.reasoning, out.text, out.reasoning_tokens) == ("", "Paris.", 0)
    prompt, out = answer(backend, R1, "Paris.", think=False)
    assert prompt.endswith(f"{OPEN}\n{CLOSE}\n\n")  # R1's cannot: the engine closes the block it opened
    assert (out.reasoning, out.text) == ("", "Paris.")


def test_stop_strings_apply_to_the_answer_only(backend) -> None:
    params = replace(GREEDY, stop=("Paris",))
    _, out = answer(backend, QWEN3, f"{OPEN}Is it Paris? Yes.{CLOSE}\n\nIt is Paris, of course.", params)
    assert (out.reasoning, out.text, out.finish_reason) == ("Is it Paris? Yes.", "It is ", "stop")


def test_a_reply_cut_inside_its_thinking_is_all_thinking(backend) -> None:
    script = f"{OPEN}\nLet me think about this for a long while, step by step."
    n = len(backend.tokenize(script, add_special=False)) - 3
    _, out = answer(backend, QWEN3, script, replace(GREEDY, max_tokens=n))
    assert out.finish_reason == "length" and out.text == ""
    assert script[len(OPEN) + 1 :].startswith(out.reasoning) and len(out.reasoning) > 10
    assert out.reasoning_tokens == n  # never closed: every token was thinking


def test_a_thinking_budget_closes_the_block(backend) -> None:
    script = f"{OPEN}\none two three four five six seven eight nine ten eleven twelve"
    _, out = answer(backend, QWEN3, script, replace(GREEDY, think_budget=6))
    forced = backend.tokenize(BUDGET_CLOSE, add_special=False)
    assert out.tokens[6 : 6 + len(forced)] == forced  # the engine wrote the close once 6 tokens were spent
    assert out.reasoning_tokens == 6 + tokens_through(backend, BUDGET_CLOSE, CLOSE)  # its close counts as thinking
    assert out.reasoning and out.text  # what the script writes after the close is the answer


@pytest.mark.parametrize("pieces", [["<thi", "nk>a", "b</th", "ink>", "\n\nc"], ["  <think>ab</think>c"], ["<", "think>ab<", "/think>", "c"]])
def test_the_splitter_holds_a_tag_until_it_is_whole(pieces: list[str]) -> None:
    splitter, reasoning, answer_text = ReasoningSplitter(ThinkSyntax(), inside=False), "", ""
    for piece in pieces:
        r, a = splitter.push(piece)
        reasoning, answer_text = reasoning + r, answer_text + a
    r, a = splitter.flush()
    assert (reasoning + r, answer_text + a) == ("ab", "c")


def test_text_that_does_not_open_a_block_is_all_answer() -> None:
    splitter = ReasoningSplitter(ThinkSyntax(), inside=False)
    assert splitter.push("<b>bold</b> and <think>") == ("", "<b>bold</b> and <think>")
    assert splitter.flush() == ("", "")
