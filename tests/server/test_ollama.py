"""Ollama's API on a real `localinfer serve` through the official `ollama` client: chat
and generate (streamed and not) answer as /v1/chat/completions does (the reference, in the
same test), with Ollama's counts and nanosecond timings; embed, list, show, ps; thinking,
`format`, tool messages; pull and delete against a fake hub, only under --allow-pull."""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import jsonschema
import numpy as np
import ollama
import pytest

from ..fakehub import FakeHub
from ..store import test_pull
from .test_serve import Server

QUESTION = [{"role": "user", "content": "Why is the sky blue?"}]
GREEDY = {"temperature": 0, "num_predict": 24}
# The ollama client's tool model keeps a property's type, description and enum only (a
# maxLength would not reach the server), so the tool here has no more than that.
CITY_WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}  # fmt: skip
hub_root = test_pull.hub_root  # a fixture: a fake hub's repo holding the embedded model


def client(server: Server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


def reference(server: Server, messages: list[dict], max_tokens: int = 24, **kw: object):  # type: ignore[no-untyped-def]
    return server.client().chat.completions.create(model=kw.pop("model", server.model), messages=messages, max_tokens=max_tokens, temperature=0, **kw)


def test_chat_streamed_and_not(dialects: Server) -> None:
    """(test_dialects.py checks the answer against the other dialects'.)"""
    whole = client(dialects).chat(model=dialects.model, messages=QUESTION, options=GREEDY, stream=False)
    assert whole.message.content and whole.done and whole.done_reason == "length" and whole.eval_count == 24
    assert whole.total_duration > whole.eval_duration > 0 and whole.prompt_eval_duration >= 0 and whole.prompt_eval_count > 0
    parts = list(client(dialects).chat(model=dialects.model, messages=QUESTION, options=GREEDY, stream=True))
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert "".join(p.message.content for p in parts) == whole.message.content and parts[-1].eval_count == whole.eval_count


def test_generate_renders_the_template_and_raw_does_not(dialects: Server) -> None:
    want = reference(dialects, [{"role": "system", "content": "Be brief."}, *QUESTION])
    whole = client(dialects).generate(model=dialects.model, prompt=QUESTION[0]["content"], system="Be brief.", options=GREEDY)
    assert whole.response == want.choices[0].message.content
    streamed = list(client(dialects).generate(model=dialects.model, prompt=QUESTION[0]["content"], system="Be brief.", options=GREEDY, stream=True))
    assert "".join(p.response for p in streamed) == whole.response and streamed[-1].done
    raw = client(dialects).generate(model=dialects.model, prompt="The sky is blue because", raw=True, options=GREEDY)
    text = dialects.client().completions.create(model=dialects.model, prompt="The sky is blue because", max_tokens=24, temperature=0).choices[0].text
    assert raw.response == text
    assert client(dialects).generate(model=dialects.model, prompt="").done_reason == "load"


def test_embed_list_show_ps(dialects: Server) -> None:
    vectors = client(dialects).embed(model=dialects.model, input=["red", "blue"]).embeddings
    want = dialects.client().embeddings.create(model=dialects.model, input=["red", "blue"]).data
    assert np.allclose(vectors, [d.embedding for d in want], atol=1e-6)
    older = np.array(client(dialects).embeddings(model=dialects.model, prompt="red").embedding)  # Ollama's older route: not normalised
    assert np.linalg.norm(older) > 1.5 and np.allclose(older / np.linalg.norm(older), want[0].embedding, atol=1e-6)
    listed = {m.model: m for m in client(dialects).list().models}
    assert "smollm2:135m" in listed and listed["smollm2:135m"].details.family == "llama" and listed["smollm2:135m"].size > 0
    shown = client(dialects).show("smollm2:135m")
    assert "im_start" in shown.template and shown.details.format == "gguf" and "completion" in shown.capabilities and "vision" not in shown.capabilities
    assert shown.modelinfo["general.architecture"] == "llama"
    running = client(dialects).ps().models
    assert dialects.model in [m.model for m in running] and all(m.context_length == 1024 for m in running)
    assert client(dialects)._client.get("/api/version").json()["version"]


def test_format_think_and_tool_messages(dialects: Server, r1_f32_path: Path) -> None:
    schema = {"type": "object", "properties": {"colour": {"type": "string", "maxLength": 20}}, "required": ["colour"]}
    shaped = client(dialects).chat(model=dialects.model, messages=[{"role": "user", "content": "Name a colour as JSON."}], format=schema, options={"temperature": 0, "num_predict": 48})
    jsonschema.validate(json.loads(shaped.message.content), schema)

    model, question = str(r1_f32_path), [{"role": "user", "content": "What is the capital of France?"}]
    assert client(dialects).chat(model=model, messages=question, think=False, options={"temperature": 0, "num_predict": 40}).message.thinking is None

    call = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
    messages = [{"role": "user", "content": "What is the weather in Paris?"}, {"role": "assistant", "content": "", "tool_calls": [{"function": call}]},
                {"role": "tool", "content": json.dumps({"temperature": 21})}]  # fmt: skip
    answer = client(dialects).chat(model=dialects.model, messages=messages, tools=[CITY_WEATHER], options={"temperature": 0, "num_predict": 16})
    chat = [messages[0], {"role": "assistant", "content": "", "tool_calls": [{"id": "call_0", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps(call["arguments"])}}]},
            {"role": "tool", "tool_call_id": "call_0", "content": messages[2]["content"]}]  # fmt: skip
    assert answer.message.content == reference(dialects, chat, 16, tools=[CITY_WEATHER]).choices[0].message.content


def test_errors_have_ollamas_shape_and_the_store_is_closed_by_default(dialects: Server) -> None:
    with pytest.raises(ollama.ResponseError) as e:
        client(dialects).chat(model="no-such-model:1b", messages=QUESTION)
    assert e.value.status_code == 404
    r = httpx.post(dialects.url + "/api/chat", json={"messages": QUESTION}, timeout=60)
    assert r.status_code == 400 and list(r.json()) == ["error"]
    for method, path in (("POST", "/api/pull"), ("DELETE", "/api/delete")):
        r = httpx.request(method, dialects.url + path, json={"model": "acme/tiny-GGUF:Q4_1"}, timeout=60)
        assert r.status_code == 403 and "--allow-pull" in r.json()["error"]


def test_pull_and_delete_under_allow_pull(hub_root: Path, isolated_home: Path, model_path: Path) -> None:
    with FakeHub(hub_root) as hub:
        s = Server(str(model_path), "--allow-pull", env=test_pull.hub_env(hub, isolated_home))
        try:
            lines = list(client(s).pull("acme/tiny-GGUF:Q4_1", stream=True))
            assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
            assert any(p.total and p.completed == p.total for p in lines)
            assert "acme/tiny-GGUF:Q4_1" in [m.model for m in client(s).list().models]
            assert client(s).delete("acme/tiny-GGUF:Q4_1").status == "success"
            assert "acme/tiny-GGUF:Q4_1" not in [m.model for m in client(s).list().models]
            with pytest.raises(ollama.ResponseError) as e:
                client(s).delete("acme/tiny-GGUF:Q4_1")
            assert e.value.status_code == 404
        finally:
            assert s.stop()[0] == 0
