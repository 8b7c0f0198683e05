"""Every numeric field of every API dialect refuses what is not a finite number in its range
with a 400 in the dialect's own error shape: never a 500, never an answer.

The fields are found by walking each request schema (so a numeric field added later is
swept too), their ranges are checked against the engine's one table (engine/types.py
SAMPLING: a dialect may narrow a range, never widen it), and the bad values go out as raw
JSON text, since 1e999 and NaN are JSON a client can send (Python reads them as inf and
nan) though the SDKs refuse to write them. The SDKs carry the out-of-range values."""

from __future__ import annotations

import json

import anthropic
import httpx
import ollama
import openai
import pytest
from pydantic import BaseModel

from localinfer.engine.types import MAX_COUNT, SAMPLING
from localinfer.server import anthropic_wire as a
from localinfer.server import ollama_wire as o
from localinfer.server import protocol as p
from localinfer.server import responses_wire as r

from .test_serve import Server

CHAT = [{"role": "user", "content": "Hi"}]
# route -> (request schema, a body it answers with 200)
ROUTES: dict[str, tuple[type[BaseModel], dict]] = {
    "/v1/chat/completions": (p.ChatCompletionRequest, {"messages": CHAT, "max_tokens": 2}),
    "/v1/completions": (p.CompletionRequest, {"prompt": "Hi", "max_tokens": 2}),
    "/v1/embeddings": (p.EmbeddingRequest, {"input": "Hi"}),
    "/v1/responses": (r.ResponseRequest, {"input": "Hi", "max_output_tokens": 2}),
    "/v1/messages": (a.MessagesRequest, {"messages": CHAT, "max_tokens": 2, "thinking": {"type": "enabled", "budget_tokens": 8}}),
    "/v1/messages/count_tokens": (a.CountTokensRequest, {"messages": CHAT, "thinking": {"type": "enabled", "budget_tokens": 8}}),
    "/api/chat": (o.ChatRequest, {"messages": CHAT, "stream": False, "options": {"num_predict": 2}}),
    "/api/generate": (o.GenerateRequest, {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}}),
    "/api/embed": (o.EmbedRequest, {"input": "Hi"}),
}
# The wire's names for the engine's settings, where a dialect names them otherwise.
ENGINE_NAMES = {"max_completion_tokens": "max_tokens", "max_output_tokens": "max_tokens", "num_predict": "max_tokens"}
NOT_FINITE = ["1e999", "-1e999", "NaN", "Infinity"]  # JSON text; Python's parser takes all four


def numeric_fields(schema: dict, defs: dict | None = None, path: tuple[str, ...] = ()) -> dict[tuple[str, ...], dict]:
    """Every number or integer a request schema takes (nested objects included; arrays of
    token ids are not settings), by its path, with its JSON-schema bounds."""
    defs = schema.get("$defs", {}) if defs is None else defs
    found: dict[tuple[str, ...], dict] = {}
    for name, prop in schema.get("properties", {}).items():
        for option in prop.get("anyOf", [prop]):
            if "$ref" in option:
                found |= numeric_fields(defs[option["$ref"].split("/")[-1]], defs, (*path, name))
            elif option.get("type") in ("number", "integer"):
                found[(*path, name)] = {"type": option["type"], "minimum": option.get("minimum"), "maximum": option.get("maximum")}
    return found


def out_of_range(bounds: dict) -> list[str]:
    """Values just past each end of a field's range, as JSON text."""
    step = 1 if bounds["type"] == "integer" else 0.5
    values = []
    if bounds["minimum"] is not None:
        values.append(json.dumps(bounds["minimum"] - step))
    if bounds["maximum"] is not None:
        values.append(json.dumps(bounds["maximum"] + step))
    return values


def raw_body(base: dict, model: str, path: tuple[str, ...], value: str) -> str:
    """`base` with the field at `path` set to `value`, written as JSON text as it stands."""
    body = json.loads(json.dumps({"model": model, **base}))
    node = body
    for key in path[:-1]:
        node = node.setdefault(key, {})
    node[path[-1]] = "@@VALUE@@"
    return json.dumps(body).replace('"@@VALUE@@"', value)


def assert_refused(response: httpx.Response, route: str, field: str) -> None:
    """A 400 in the route's dialect, whose message names the field."""
    assert response.status_code == 400, (route, field, response.status_code, response.text[:300])
    body = response.json()
    if route.startswith("/api/"):
        message = body["error"]
    elif route.startswith("/v1/messages"):
        assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    else:
        assert body["error"]["type"] == "invalid_request_error"
        message = body["error"]["message"]
    assert field in message or field == "keep_alive", (route, field, message)


def test_every_numeric_field_takes_its_range_from_the_engines_table() -> None:
    for route, (schema, _) in ROUTES.items():
        for path, bounds in numeric_fields(schema.model_json_schema()).items():
            name = ENGINE_NAMES.get(path[-1], path[-1])
            if path[-1] == "keep_alive":
                continue  # a duration (negative: forever), checked by seconds() below
            if bounds["type"] == "integer":  # a whole number has an end: past it, it means nothing (or overflows C)
                assert bounds["maximum"] is not None and bounds["maximum"] <= 2**64 - 1, (route, path)
            if name in SAMPLING and path[-1] != "num_predict":  # num_predict's -1 and -2 are Ollama's own
                table = SAMPLING[name]
                assert bounds["minimum"] >= table.low, (route, path)
                assert table.high is None or bounds["maximum"] <= table.high, (route, path)


def test_every_numeric_field_of_every_dialect_refuses_inf_nan_and_out_of_range(dialects: Server) -> None:
    failures = []
    with httpx.Client(base_url=dialects.url, timeout=120, headers={"content-type": "application/json"}) as http:
        for route, (schema, base) in ROUTES.items():
            control = http.post(route, content=raw_body(base, dialects.model, ("model",), json.dumps(dialects.model)))
            assert control.status_code == 200, (route, control.text[:300])
            fields = numeric_fields(schema.model_json_schema())
            assert fields, route
            for path, bounds in fields.items():
                values = NOT_FINITE + out_of_range(bounds)
                if path[-1] == "keep_alive":
                    values += ["1e300", '"99999999999h"']  # longer than a century: an expiry no clock shows
                for value in values:
                    response = http.post(route, content=raw_body(base, dialects.model, path, value))
                    try:
                        assert_refused(response, route, path[-1])
                    except AssertionError as e:
                        failures.append(f"{route} {'.'.join(path)}={value}: {e}")
    assert not failures, "\n".join(failures)


def test_the_sdks_get_a_400_for_a_value_out_of_range(dialects: Server) -> None:
    chat = openai.OpenAI(base_url=dialects.url + "/v1", api_key="none", max_retries=0, timeout=120)
    for bad in ({"temperature": 2.5}, {"top_p": 1.5}, {"presence_penalty": -3}, {"seed": -2}, {"max_tokens": MAX_COUNT + 1}):
        with pytest.raises(openai.BadRequestError) as e:
            chat.chat.completions.create(model=dialects.model, messages=CHAT, **{"max_tokens": 2, **bad})
        assert next(iter(bad)) in str(e.value)
    with pytest.raises(openai.BadRequestError):
        chat.responses.create(model=dialects.model, input="Hi", temperature=-0.5)
    with pytest.raises(openai.BadRequestError):
        chat.completions.create(model=dialects.model, prompt="Hi", max_tokens=2, extra_body={"min_p": 2})

    claude = anthropic.Anthropic(base_url=dialects.url, api_key="none", max_retries=0, timeout=120)
    with pytest.raises(anthropic.BadRequestError) as e:
        claude.messages.create(model=dialects.model, max_tokens=2, messages=CHAT, extra_body={"temperature": 1.5})  # Anthropic's temperature ends at 1
    assert "temperature" in str(e.value)

    llama = ollama.Client(host=dialects.url, timeout=120)
    for options in ({"top_p": 2}, {"repeat_last_n": -2}, {"frequency_penalty": 2.5}, {"num_ctx": 0}):
        with pytest.raises(ollama.ResponseError) as oe:
            llama.chat(model=dialects.model, messages=CHAT, options=options)
        assert oe.value.status_code == 400 and next(iter(options)) in str(oe.value)

