"""A reasoning model through the API and the `openai` client: thinking in
`message.reasoning_content` and streamed `delta.reasoning_content`, never in `content`, with
`usage.completion_tokens_details.reasoning_tokens`; a thinking budget; thinking off."""

from __future__ import annotations

from pathlib import Path

from .test_serve import Server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


def test_thinking_comes_apart_from_the_answer(r1_f32_path: Path) -> None:
    server = Server(str(r1_f32_path), "--parallel", "1", "--ctx", "512", "--draft", "none")
    try:
        client = server.client()
        ask = {"model": str(r1_f32_path), "messages": QUESTION, "max_tokens": 40, "temperature": 0, "extra_body": {"thinking_budget_tokens": 8}}
        whole = client.chat.completions.create(**ask)
        message, usage = whole.choices[0].message, whole.usage
        thinking = message.model_extra["reasoning_content"]
        assert thinking and message.content, message
        assert "think>" not in thinking and not message.content.lstrip().startswith("</think>")  # the tags are neither's
        assert usage.completion_tokens_details.reasoning_tokens > 8  # the budget, and the close the engine wrote
        assert usage.completion_tokens_details.reasoning_tokens < usage.completion_tokens

        chunks = [c for c in client.chat.completions.create(**ask, stream=True) if c.choices]
        streamed_thinking = "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks)
        assert (streamed_thinking, "".join(c.choices[0].delta.content or "" for c in chunks)) == (thinking, message.content)

        # This template cannot turn thinking off: the engine closes the block the prompt opens.
        off = client.chat.completions.create(**{**ask, "extra_body": {"chat_template_kwargs": {"enable_thinking": False}}})
        assert off.choices[0].message.model_extra.get("reasoning_content") is None and off.choices[0].message.content
        assert off.usage.completion_tokens_details.reasoning_tokens == 0
        none = client.chat.completions.create(**{**ask, "reasoning_effort": "none", "extra_body": {}})
        assert none.choices[0].message.content == off.choices[0].message.content
    finally:
        server.stop()
