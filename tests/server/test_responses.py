"""OpenAI's Responses API on a real `localinfer serve` through the `openai` SDK's
`responses.create`: whole and streamed (its documented event order, sequence numbers one
by one), a function-call round trip, `text.format` json_schema, `previous_response_id` and
reasoning, each answer checked against the same request on /v1/chat/completions."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import openai
import pytest

from .conftest import check_nesting
from .test_serve import WEATHER, WEATHER_PARAMS, Server

QUESTION = "Why is the sky blue?"
WEATHER_TOOL = {"type": "function", **WEATHER["function"]}


def reference(server: Server, messages: list[dict], max_tokens: int, **kw: object):  # type: ignore[no-untyped-def]
    return server.client().chat.completions.create(model=kw.pop("model", server.model), messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def check_order(events: list) -> str:
    """Sequence numbers 0, 1, 2...; created and in_progress first, completed or incomplete
    last; every item added, then its deltas, then done, at consecutive output indices.
    Returns the text the deltas spell."""
    assert [e.sequence_number for e in events] == list(range(len(events)))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] in ("response.completed", "response.incomplete"), kinds
    steps = {"response.output_item.added": "start", "response.output_item.done": "stop"}
    check_nesting([(steps.get(e.type, "delta"), e.output_index) for e in events[2:-1]])
    return "".join(e.delta for e in events if e.type == "response.output_text.delta")


def test_a_response_streamed_and_not(dialects: Server) -> None:
    """(test_dialects.py checks the answer against the other dialects'.)"""
    ask = {"model": dialects.model, "instructions": "Be brief.", "input": QUESTION, "max_output_tokens": 24, "temperature": 0}
    response = dialects.client().responses.create(**ask)
    assert response.output_text and (response.status, response.incomplete_details.reason) == ("incomplete", "max_output_tokens")
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens and response.usage.output_tokens == 24
    events = list(dialects.client().responses.create(**ask, stream=True))
    assert check_order(events) == response.output_text and events[-1].response.output_text == response.output_text


def test_a_function_call_round_trip(dialects: Server) -> None:
    ask = {"model": dialects.model, "input": "What is the weather in Paris?", "tools": [WEATHER_TOOL], "temperature": 0, "max_output_tokens": 64}
    response = dialects.client().responses.create(**ask, tool_choice={"type": "function", "name": "get_weather"})
    calls = [item for item in response.output if item.type == "function_call"]
    assert len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_PARAMS)
    events = list(dialects.client().responses.create(**ask, tool_choice={"type": "function", "name": "get_weather"}, stream=True))
    check_order(events)
    assert [e.arguments for e in events if e.type == "response.function_call_arguments.done"] == [calls[0].arguments]

    result = json.dumps({"temperature": 21, "unit": "celsius"})
    follow = [{"role": "user", "content": ask["input"]}, {"type": "function_call", "call_id": calls[0].call_id, "name": "get_weather", "arguments": calls[0].arguments},
              {"type": "function_call_output", "call_id": calls[0].call_id, "output": result}]  # fmt: skip
    answer = dialects.client().responses.create(**{**ask, "input": follow, "max_output_tokens": 16})
    chat = [{"role": "user", "content": ask["input"]}, {"role": "assistant", "content": "", "tool_calls": [{"id": calls[0].call_id, "type": "function", "function": {"name": "get_weather", "arguments": calls[0].arguments}}]},
            {"role": "tool", "tool_call_id": calls[0].call_id, "content": result}]  # fmt: skip
    assert answer.output_text == reference(dialects, chat, 16, tools=[WEATHER]).choices[0].message.content


def test_text_format_json_schema_shapes_the_answer(dialects: Server) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20}}, "required": ["colour"], "additionalProperties": False}
    response = dialects.client().responses.create(model=dialects.model, input="Name a colour.", max_output_tokens=48, temperature=0,
                                                  text={"format": {"type": "json_schema", "name": "colour", "schema": schema}})  # fmt: skip
    jsonschema.validate(json.loads(response.output_text), schema)


def test_previous_response_id_continues_a_stored_response(dialects: Server) -> None:
    client = dialects.client()
    first = client.responses.create(model=dialects.model, input=QUESTION, max_output_tokens=12, temperature=0, store=True)
    second = client.responses.create(model=dialects.model, input="Say it in French.", previous_response_id=first.id, max_output_tokens=12, temperature=0)
    history = [{"role": "user", "content": QUESTION}, {"role": "assistant", "content": first.output_text}, {"role": "user", "content": "Say it in French."}]
    assert second.output_text == reference(dialects, history, 12).choices[0].message.content
    unstored = client.responses.create(model=dialects.model, input=QUESTION, max_output_tokens=2)
    for rid in ("resp_nosuchresponse", unstored.id):  # stateless by default: nothing kept without store
        with pytest.raises(openai.NotFoundError) as e:
            client.responses.create(model=dialects.model, input="Hi", previous_response_id=rid, max_output_tokens=2)
        assert e.value.body["param"] == "previous_response_id"


def test_reasoning_is_its_own_item(dialects: Server, r1_f32_path: Path) -> None:
    """Streamed as reasoning_text deltas of a reasoning item; effort "none" leaves it out.
    (test_dialects.py checks the reasoning against the other dialects'.)"""
    model, question = str(r1_f32_path), "What is the capital of France?"
    events = list(dialects.client().responses.create(model=model, input=question, max_output_tokens=40, temperature=0, stream=True))
    check_order(events)
    final = events[-1].response
    assert [item.type for item in final.output] == ["reasoning"]  # 40 tokens end inside the thinking
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == final.output[0].content[0].text != ""
    off = dialects.client().responses.create(model=model, input=question, max_output_tokens=40, temperature=0, reasoning={"effort": "none"})
    assert [item.type for item in off.output] == ["message"]
