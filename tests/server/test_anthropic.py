"""Anthropic's Messages API on a real `localinfer serve` through the official `anthropic`
SDK: the same greedy request answers as it does on /v1/chat/completions (the reference, in
the same test), streamed in Anthropic's documented event order, with stop sequences, a tool
round trip, thinking, token counting and Anthropic's error bodies."""

from __future__ import annotations

import json
from pathlib import Path

import anthropic
import httpx
import jsonschema
import pytest

from .conftest import check_nesting
from .test_serve import WEATHER, WEATHER_PARAMS, Server

QUESTION = "Why is the sky blue?"
GREEDY = {"temperature": 0}  # sampling fields this SDK no longer sends itself (Claude models ignore them); servers of local models take them
WEATHER_TOOL = {"name": "get_weather", "description": WEATHER["function"]["description"], "input_schema": WEATHER_PARAMS}


@pytest.fixture
def server(dialects: Server) -> Server:
    return dialects


def client(server: Server, key: str = "none") -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.url, api_key=key, max_retries=0, timeout=120)


def check_order(events: list) -> None:
    """Anthropic's documented sequence: message_start, then blocks each started, given deltas
    and stopped in turn with consecutive indices, then message_delta and message_stop."""
    events = [e for e in events if e.type in ("message_start", "content_block_start", "content_block_delta", "content_block_stop", "message_delta", "message_stop")]
    kinds = [e.type for e in events]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    check_nesting([(e.type.removeprefix("content_block_"), e.index) for e in events[1:-2]])


def test_a_message_streamed_and_not(server: Server) -> None:
    """(test_dialects.py checks the answer against the other dialects'.)"""
    ask = {"model": server.model, "max_tokens": 24, "extra_body": GREEDY, "messages": [{"role": "user", "content": QUESTION}]}
    message = client(server).messages.create(**ask)
    assert [b.type for b in message.content] == ["text"] and message.content[0].text
    assert (message.stop_reason, message.stop_sequence, message.role) == ("max_tokens", None, "assistant")
    with client(server).messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    check_order(events)
    assert final.content[0].text == message.content[0].text and final.stop_reason == "max_tokens"
    with httpx.stream("POST", server.url + "/v1/messages", json={**ask, "max_tokens": 2, **GREEDY, "stream": True}, timeout=120) as r:  # what the SDK hides
        kinds = [line.removeprefix("event: ").strip() for line in r.iter_lines() if line.startswith("event:")]
    assert kinds[:2] == ["message_start", "ping"] and kinds[-1] == "message_stop"  # a ping while the prompt is prefilled
    counted = client(server).messages.count_tokens(model=server.model, messages=ask["messages"])
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens


def test_a_stop_sequence_ends_the_answer_and_is_named(server: Server) -> None:
    ask = {"model": server.model, "max_tokens": 24, "extra_body": GREEDY, "system": "Answer briefly.", "messages": [{"role": "user", "content": QUESTION}]}
    whole = client(server).messages.create(**ask).content[0].text
    stop = whole.split()[3]
    message = client(server).messages.create(**ask, stop_sequences=[stop])
    assert message.stop_reason == "stop_sequence" and message.stop_sequence == stop
    assert message.content[0].text == whole[: whole.index(stop)]


def test_a_tool_round_trip(server: Server) -> None:
    """A required call (tool_choice: tool) is a tool_use block valid for its schema; its
    result sent back as a tool_result block reads as OpenAI's tool message does."""
    ask = {"model": server.model, "max_tokens": 64, "extra_body": GREEDY, "tools": [WEATHER_TOOL], "messages": [{"role": "user", "content": "What is the weather in Paris?"}]}
    message = client(server).messages.create(**ask, tool_choice={"type": "tool", "name": "get_weather"})
    calls = [b for b in message.content if b.type == "tool_use"]
    assert message.stop_reason == "tool_use" and len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(calls[0].input, WEATHER_PARAMS)
    with client(server).messages.stream(**ask, tool_choice={"type": "tool", "name": "get_weather"}) as stream:
        events = list(stream)
        streamed = stream.get_final_message()
    check_order(events)
    assert [b.input for b in streamed.content if b.type == "tool_use"] == [calls[0].input] and streamed.stop_reason == "tool_use"

    result = json.dumps({"temperature": 21, "unit": "celsius"})
    follow = [*ask["messages"], {"role": "assistant", "content": [{"type": "tool_use", "id": calls[0].id, "name": "get_weather", "input": calls[0].input}]},
              {"role": "user", "content": [{"type": "tool_result", "tool_use_id": calls[0].id, "content": result}]}]  # fmt: skip
    answer = client(server).messages.create(**{**ask, "max_tokens": 16, "messages": follow})
    openai_follow = [*ask["messages"], {"role": "assistant", "content": "", "tool_calls": [{"id": calls[0].id, "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(calls[0].input)}}]},
                     {"role": "tool", "tool_call_id": calls[0].id, "content": result}]  # fmt: skip
    reference = server.client().chat.completions.create(model=server.model, messages=openai_follow, tools=[WEATHER], max_tokens=16, temperature=0)
    assert "".join(b.text for b in answer.content if b.type == "text") == reference.choices[0].message.content


def test_thinking_is_its_own_block(server: Server, r1_f32_path: Path) -> None:
    """Streamed as thinking_delta events in a block before the text's; `disabled` leaves it
    out. (test_dialects.py checks the thinking against the other dialects'.)"""
    ask = {"model": str(r1_f32_path), "max_tokens": 40, "extra_body": GREEDY, "messages": [{"role": "user", "content": "What is the capital of France?"}],
           "thinking": {"type": "enabled", "budget_tokens": 8}}  # fmt: skip
    with client(server).messages.stream(**ask) as stream:
        events = list(stream)
        final = stream.get_final_message()
    check_order(events)
    assert any(e.type == "content_block_delta" and e.delta.type == "thinking_delta" for e in events)
    assert [b.type for b in final.content] == ["thinking", "text"] and final.content[0].thinking and final.content[1].text  # the budget closed the block
    off = client(server).messages.create(**{**ask, "thinking": {"type": "disabled"}})
    assert [b.type for b in off.content] == ["text"]


def test_errors_have_anthropics_shape(server: Server) -> None:
    r = httpx.post(server.url + "/v1/messages", json={"model": server.model, "messages": [{"role": "user", "content": "Hi"}]}, timeout=60)
    assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error" and "max_tokens" in r.json()["error"]["message"]
    with pytest.raises(anthropic.NotFoundError) as e:
        client(server).messages.create(model="no-such-model", max_tokens=4, messages=[{"role": "user", "content": "Hi"}])
    assert e.value.body["error"]["type"] == "not_found_error"
    r = httpx.post(server.url + "/v1/messages", content=b"{not json", headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400 and r.json()["error"]["type"] == "invalid_request_error"
