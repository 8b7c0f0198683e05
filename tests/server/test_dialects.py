"""One greedy request through all four dialects (OpenAI chat, OpenAI Responses, Anthropic
Messages, Ollama chat), on one server: the same text, thinking, tool call and token counts
come back from each, since each route only translates."""

from __future__ import annotations

import json
from pathlib import Path

from .test_anthropic import WEATHER_TOOL as ANTHROPIC_WEATHER
from .test_anthropic import client as anthropic_client
from .test_ollama import client as ollama_client
from .test_responses import WEATHER_TOOL as RESPONSES_WEATHER
from .test_serve import WEATHER, Server


def four_ways(server: Server, model: str, question: str, n: int) -> list[tuple[str, str, int, int]]:
    """(thinking, text, prompt tokens, answer tokens) from each dialect."""
    messages = [{"role": "user", "content": question}]
    chat = server.client().chat.completions.create(model=model, messages=messages, max_tokens=n, temperature=0)
    response = server.client().responses.create(model=model, input=question, max_output_tokens=n, temperature=0)
    message = anthropic_client(server).messages.create(model=model, messages=messages, max_tokens=n, extra_body={"temperature": 0})
    ollama = ollama_client(server).chat(model=model, messages=messages, options={"num_predict": n, "temperature": 0})
    reasoning = [item.content[0].text for item in response.output if item.type == "reasoning"]
    thought = [b.thinking for b in message.content if b.type == "thinking"]
    return [
        (chat.choices[0].message.model_extra.get("reasoning_content") or "", chat.choices[0].message.content, chat.usage.prompt_tokens, chat.usage.completion_tokens),
        ("".join(reasoning), response.output_text, response.usage.input_tokens, response.usage.output_tokens),
        ("".join(thought), "".join(b.text for b in message.content if b.type == "text"), message.usage.input_tokens + message.usage.cache_read_input_tokens, message.usage.output_tokens),
        (ollama.message.thinking or "", ollama.message.content, ollama.prompt_eval_count, ollama.eval_count),
    ]  # fmt: skip


def test_one_request_four_dialects_one_answer(dialects: Server, r1_f32_path: Path) -> None:
    plain = four_ways(dialects, dialects.model, "Why is the sky blue?", 24)
    assert plain[0][1] and all(answer == plain[0] for answer in plain), plain
    thinking = four_ways(dialects, str(r1_f32_path), "What is the capital of France?", 40)
    assert thinking[0][0] and all(answer == thinking[0] for answer in thinking), thinking  # 40 tokens end inside the thinking


def test_a_required_call_is_the_same_call_in_each_dialect(dialects: Server) -> None:
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    chat = dialects.client().chat.completions.create(model=dialects.model, messages=question, tools=[WEATHER], tool_choice="required", max_tokens=64, temperature=0)
    response = dialects.client().responses.create(model=dialects.model, input=question[0]["content"], tools=[RESPONSES_WEATHER], tool_choice="required", max_output_tokens=64, temperature=0)
    message = anthropic_client(dialects).messages.create(model=dialects.model, messages=question, tools=[ANTHROPIC_WEATHER], tool_choice={"type": "any"}, max_tokens=64, extra_body={"temperature": 0})
    calls = [
        [(c.function.name, json.loads(c.function.arguments)) for c in chat.choices[0].message.tool_calls],
        [(item.name, json.loads(item.arguments)) for item in response.output if item.type == "function_call"],
        [(b.name, b.input) for b in message.content if b.type == "tool_use"],
    ]
    assert calls[0] and calls[1] == calls[0] and calls[2] == calls[0], calls
