"""`localinfer serve` as a user runs it: a real process with uvicorn on a loopback port, the
real embedded model, and the real `openai` client (plus httpx for what a client library
hides: status codes, headers, disconnects)."""

from __future__ import annotations

import json
import re
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import jsonschema
import openai
import pytest

from ..conftest import THREADS, parse_metrics, start_cli

MODEL = "smollm2:135m"
CHAT = [{"role": "user", "content": "Why is the sky blue?"}]
WEATHER_PARAMS = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city", "parameters": WEATHER_PARAMS}}


class Server:
    model = MODEL  # what requests name; a server started on a file names it by its path

    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        # The log goes to a file, not a pipe: a pipe nobody reads fills up after ~600 request
        # lines, and then the server blocks in its logger.
        self.log = tempfile.TemporaryFile()
        self.proc = start_cli("serve", "--port", str(self.port), "--threads", str(THREADS), *args, env=env, stdout=subprocess.DEVNULL, stderr=self.log)
        deadline = time.time() + 120
        while time.time() < deadline:
            assert self.proc.poll() is None, self.log_text()
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        raise AssertionError("the server did not become healthy")

    def client(self, key: str = "none") -> openai.OpenAI:
        return openai.OpenAI(base_url=self.url + "/v1", api_key=key, max_retries=0, timeout=120)

    def metrics(self) -> dict[str, float]:
        return parse_metrics(httpx.get(self.url + "/metrics", timeout=10).text)

    def log_text(self) -> str:
        self.log.seek(0)
        return self.log.read().decode(errors="replace")

    def stop(self) -> tuple[int, str]:
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(timeout=60)
        return self.proc.returncode, self.log_text()


def serving(model: Path, *args: str) -> Iterator[Server]:
    """A server started on a model file, whose path requests name it by; stopped after, and
    exiting 0 (a fixture's body: `yield from serving(...)`)."""
    s = Server(str(model), *args)
    s.model = str(model)
    yield s
    code, log = s.stop()
    assert code == 0, log


@pytest.fixture(scope="module")
def server(f32_path: Path) -> Iterator[Server]:
    """On the F32 widening of the embedded model: several tests compare two greedy answers
    to one prompt, and the second is served from the cached prompt (a batch of one token,
    not the whole prompt). On the quantized model that alone can flip a near-tie
    (tests/engine/test_engine_threads.py says why); on F32 it cannot."""
    s = Server(str(f32_path), "--parallel", "4", "--max-queue", "8")
    s.model = str(f32_path)
    yield s
    code, log = s.stop()
    assert code == 0, log  # SIGTERM drains and exits 0
    assert f"model={s.model}" in log and "status=" in log  # one line per request


def test_health_and_models(server: Server) -> None:
    assert httpx.get(server.url + "/health").json() == {"status": "ok"}
    assert server.model in [m.id for m in server.client().models.list().data]


def test_chat_and_its_stream_agree(server: Server) -> None:
    client = server.client()
    whole = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=16, temperature=0)
    assert whole.choices[0].finish_reason == "length" and whole.usage.completion_tokens == 16
    chunks = list(client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=16, temperature=0, stream=True, stream_options={"include_usage": True}))
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens and chunks[-1].usage.completion_tokens == 16
    m = server.metrics()
    for histogram in ("time_to_first_token", "time_per_output_token", "inter_token_latency", "e2e_request_latency"):
        assert m[f"localinfer_{histogram}_seconds_count"] >= 2, histogram
    assert m["localinfer_generation_tokens_total"] >= 32 and m['localinfer_requests_total{route="/v1/chat/completions",status="length"}'] >= 2


def test_the_stream_on_the_wire_is_openais(server: Server) -> None:
    """What clients stricter than the SDK parse: SSE `data:` lines ending in [DONE], the role
    once, and fields a chunk does not carry left out rather than null."""
    body = {"model": server.model, "messages": CHAT, "max_tokens": 4, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        lines = [line for line in r.iter_lines() if line]
    assert all(line.startswith("data: ") for line in lines) and lines[-1] == "data: [DONE]"
    deltas = [json.loads(line[6:])["choices"][0] for line in lines[:-1]]
    assert deltas[0]["delta"] == {"role": "assistant", "content": ""}
    assert all(set(d["delta"]) == {"content"} for d in deltas[1:-1]) and len(deltas) == 6
    assert deltas[-1]["delta"] == {} and deltas[-1]["finish_reason"] == "length"


def test_completions_and_stop(server: Server) -> None:
    client = server.client()
    out = client.completions.create(model=server.model, prompt="One, two, three, four,", max_tokens=24, temperature=0)
    text = out.choices[0].text
    assert text
    cut = text[len(text) // 2 :].strip()[:3] or text.strip()[:3]
    stopped = client.completions.create(model=server.model, prompt="One, two, three, four,", max_tokens=24, temperature=0, stop=[cut])
    assert stopped.choices[0].finish_reason == "stop" and cut not in stopped.choices[0].text
    streamed = "".join(c.choices[0].text for c in client.completions.create(model=server.model, prompt="One, two, three, four,", max_tokens=24, temperature=0, stream=True) if c.choices)
    assert streamed == text


def test_second_turn_reuses_the_first(server: Server) -> None:
    client = server.client()
    first = client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=12, temperature=0)
    turn = CHAT + [{"role": "assistant", "content": first.choices[0].message.content}, {"role": "user", "content": "Say it shorter."}]
    second = client.chat.completions.create(model=server.model, messages=turn, max_tokens=12, temperature=0)
    assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens - 1
    m = server.metrics()
    assert m["localinfer_prefix_cache_hit_tokens_total"] >= second.usage.prompt_tokens_details.cached_tokens
    assert m["localinfer_prefix_cache_tokens"] >= second.usage.prompt_tokens + second.usage.completion_tokens - 1  # its slot keeps turn 2


def test_disconnect_frees_the_slot(server: Server) -> None:
    before = server.metrics().get('localinfer_requests_total{status="disconnected"}', 0)
    body = {"model": server.model, "messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 2000, "temperature": 0, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=60) as r:
        lines = r.iter_lines()
        assert sum(1 for _, line in zip(range(6), lines) if line.startswith("data:")) >= 3
    deadline = time.time() + 30
    while time.time() < deadline:
        m = server.metrics()
        if m.get('localinfer_requests_total{status="disconnected"}', 0) > before and m["localinfer_requests_running"] == 0:
            break
        time.sleep(0.1)
    assert m['localinfer_requests_total{status="disconnected"}'] == before + 1
    assert m["localinfer_requests_running"] == 0 and m["localinfer_kv_cache_slots_free"] == 4
    assert m["localinfer_kv_cache_cells_used"] > 0 and m["localinfer_kv_cache_cells_free"] > 0  # the prefixes kept for reuse


@pytest.mark.parametrize(
    "body, status, needle",
    [
        (b"{not json", 400, "not valid JSON"),
        ({"messages": "hi"}, 400, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, 400, "role"),
        ({"messages": CHAT, "temperature": 5}, 400, "temperature"),
        ({"messages": CHAT, "max_tokens": 0}, 400, "max_tokens"),
        ({"messages": CHAT, "n": 17}, 400, "n"),
        ({"messages": CHAT, "top_logprobs": 21, "logprobs": True}, 400, "top_logprobs"),
        ({"messages": CHAT, "max_tokens": 100000}, 400, "context holds"),
        ({"messages": CHAT, "model": "nobody/nothing-GGUF"}, 404, "not downloaded"),
        ({"messages": [{"role": "assistant", "content": "a"}, {"role": "assistant", "content": "b"}]}, None, None),
        (b"x" * (9 * 1024 * 1024), 413, "over"),
        ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "objec"}}}}, 400, "invalid JSON schema"),
        ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, 400, "json_schema.schema"),
        ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "string", "format": "no-such"}}}}, 400, "JSON schema"),
        ({"messages": CHAT, "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"if": {"required": ["a"]}, "then": {}}}}}, 400, "Unimplemented"),
        ({"messages": CHAT, "response_format": {"type": "yaml"}}, 400, "response_format"),
        ({"messages": CHAT, "grammar": "root ::= ("}, 400, "grammar"),
        ({"messages": CHAT, "regex": "(unclosed"}, 400, "regex"),
        ({"messages": CHAT, "regex": "a", "grammar": 'root ::= "a"'}, 400, "not several"),
        ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "string"}}}]}, 400, "type object"),
        ({"messages": CHAT, "tools": [{"type": "function", "function": {"name": "two words"}}]}, 400, "tool name"),
        ({"messages": CHAT, "tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, 400, "not one of the tools"),
        ({"messages": CHAT, "tool_choice": "required"}, 400, "no tools"),
        ({"messages": CHAT, "tools": [WEATHER], "tool_choice": "required", "response_format": {"type": "json_object"}}, 400, "cannot both"),
        ({"messages": CHAT, "tools": [{"type": "retrieval"}]}, 400, "tools"),
    ],
)
def test_bad_requests_get_their_status_and_never_a_500(server: Server, body, status, needle) -> None:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    r = httpx.post(server.url + "/v1/chat/completions", content=content, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code < 500, r.text
    if status is not None:
        assert r.status_code == status, r.text
        error = r.json()["error"]
        assert set(error) == {"message", "type", "param", "code"} and needle in error["message"]
    assert httpx.get(server.url + "/health").status_code == 200


def test_structured_output_through_the_openai_client(server: Server) -> None:
    client = server.client()
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "population": {"type": "integer", "minimum": 0}, "coastal": {"type": "boolean"}},
        "required": ["city", "population", "coastal"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "json_schema": {"name": "city", "schema": schema, "strict": True}}
    ask = [{"role": "user", "content": "Describe a large city as JSON."}]
    whole = client.chat.completions.create(model=server.model, messages=ask, response_format=fmt, temperature=0.9, seed=7, max_tokens=80)
    jsonschema.validate(json.loads(whole.choices[0].message.content), schema)
    assert whole.choices[0].finish_reason == "stop"
    chunks = list(client.chat.completions.create(model=server.model, messages=ask, response_format=fmt, temperature=0.9, seed=7, max_tokens=80, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    anything = client.chat.completions.create(model=server.model, messages=ask, response_format={"type": "json_object"}, temperature=0, max_tokens=120)
    assert isinstance(json.loads(anything.choices[0].message.content), dict)
    regex = client.chat.completions.create(model=server.model, messages=CHAT, extra_body={"regex": r"(Yes|No), because [a-z ]{1,40}\."}, temperature=0.9, seed=1, max_tokens=40)
    assert re.fullmatch(r"(Yes|No), because [a-z ]{1,40}\.", regex.choices[0].message.content)
    grammar = client.completions.create(model=server.model, prompt="The answer is", extra_body={"grammar": 'root ::= " " ("yes" | "no")'}, temperature=0, max_tokens=5)
    assert grammar.choices[0].text in (" yes", " no") and grammar.choices[0].finish_reason == "stop"
    cut = client.chat.completions.create(model=server.model, messages=ask, response_format=fmt, temperature=0, max_tokens=3)
    assert cut.choices[0].finish_reason == "length"  # never passed off as complete JSON


def test_a_weather_tool_round_trip_through_the_openai_client(server: Server) -> None:
    client = server.client()
    ask = [{"role": "user", "content": "What is the weather in Paris?"}]
    whole = client.chat.completions.create(model=server.model, messages=ask, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80)
    assert whole.choices[0].finish_reason == "tool_calls" and whole.choices[0].message.content is None
    (call,) = whole.choices[0].message.tool_calls
    assert call.type == "function" and call.function.name == "get_weather" and call.id.startswith("call_")
    jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)
    chunks = list(client.chat.completions.create(model=server.model, messages=ask, tools=[WEATHER], tool_choice="required", temperature=0, max_tokens=80, stream=True))
    streamed = [tc for c in chunks if c.choices for tc in c.choices[0].delta.tool_calls or []]
    assert [(tc.index, tc.function.name, tc.function.arguments) for tc in streamed] == [(0, "get_weather", call.function.arguments)]
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "tool_calls"

    def answer(result: str):  # the call and its result back, as a client sends them
        back = [*ask, whole.choices[0].message.model_dump(exclude_none=True), {"role": "tool", "tool_call_id": call.id, "content": result}]
        return client.chat.completions.create(model=server.model, messages=back, tools=[WEATHER], temperature=0, max_tokens=40)

    short, longer = answer('{"temperature": 18}'), answer('{"temperature": 18, "sky": "clear", "wind": "light breeze from the west"}')
    assert short.choices[0].message.content and short.choices[0].finish_reason in ("stop", "length")
    assert longer.usage.prompt_tokens > short.usage.prompt_tokens  # the tool's result is in the prompt
    named = client.chat.completions.create(model=server.model, messages=ask, tools=[WEATHER, {"type": "function", "function": {"name": "get_time"}}],
                                           tool_choice={"type": "function", "function": {"name": "get_time"}}, temperature=0, max_tokens=40)  # fmt: skip
    assert [(c.function.name, json.loads(c.function.arguments)) for c in named.choices[0].message.tool_calls] == [("get_time", {})]


def test_tool_choice_required_always_yields_a_valid_call(server: Server) -> None:
    client = server.client()
    ask = [{"role": "user", "content": "Tell me a joke."}]  # nothing to do with the tool
    for seed in range(10):
        r = client.chat.completions.create(model=server.model, messages=ask, tools=[WEATHER], tool_choice="required", temperature=1.2, seed=seed, max_tokens=80)
        assert r.choices[0].finish_reason == "tool_calls"
        (call,) = r.choices[0].message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), WEATHER_PARAMS)


def test_no_cross_talk_between_concurrent_streams(f32_path: Path) -> None:
    """Four concurrent greedy streams each return what their prompt returns alone (on the F32
    model, whose logits do not depend on what else shares a batch; see test_engine_threads)."""
    s = Server(str(f32_path), "--parallel", "4")
    try:
        prompts = ["Why is the sky blue?", "Name three fruits.", "What is 2 + 2?", "Say hello in French."]
        client = s.client()
        ask = lambda q: "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(  # noqa: E731
            model=str(f32_path), messages=[{"role": "user", "content": q}], max_tokens=24, temperature=0, stream=True) if c.choices)  # fmt: skip
        alone = {q: ask(q) for q in prompts}
        together: dict[str, str] = {}
        threads = [threading.Thread(target=lambda q=q: together.__setitem__(q, ask(q))) for q in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout=120)
        assert together == alone
    finally:
        assert s.stop()[0] == 0


def test_full_queue_answers_503_with_retry_after() -> None:
    s = Server("--parallel", "1", "--max-queue", "0")
    try:
        body = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 500, "temperature": 0, "stream": True}  # greedy: 400+ tokens
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=body, timeout=60) as busy:
            lines = busy.iter_lines()
            first = next(lines)
            r = httpx.post(s.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=60)
            assert r.status_code == 503, (first, r.text, list(lines)[-3:])
            assert r.headers["retry-after"] == "1" and r.json()["error"]["type"] == "server_busy"
        time.sleep(0.5)
        assert httpx.post(s.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 2}, timeout=60).status_code == 200
    finally:
        assert s.stop()[0] == 0


def test_api_key() -> None:
    s = Server(env={"LOCALINFER_API_KEY": "sesame"})
    try:
        assert httpx.get(s.url + "/health").status_code == 200  # open, for load balancers
        for path in ("/v1/models", "/metrics"):
            r = httpx.get(s.url + path, headers={"Authorization": "Bearer wrong"})
            assert r.status_code == 401 and r.json()["error"]["type"] == "authentication_error"
        with pytest.raises(openai.AuthenticationError):
            s.client("wrong").chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2)
        assert s.client("sesame").chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2).choices[0].message.content is not None
        import anthropic  # Anthropic's clients send x-api-key; its errors have Anthropic's shape

        ask = {"model": MODEL, "max_tokens": 2, "messages": CHAT}
        with pytest.raises(anthropic.AuthenticationError) as e:
            anthropic.Anthropic(base_url=s.url, api_key="wrong", max_retries=0).messages.create(**ask)
        assert e.value.body["error"]["type"] == "authentication_error"
        assert anthropic.Anthropic(base_url=s.url, api_key="sesame", max_retries=0).messages.create(**ask).usage.output_tokens == 2
    finally:
        assert s.stop()[0] == 0


def test_presence_penalty_changes_a_greedy_answer(server: Server) -> None:
    client = server.client()
    ask = lambda **kw: client.chat.completions.create(model=server.model, messages=CHAT, max_tokens=32, temperature=0, **kw).choices[0].message.content  # noqa: E731
    assert ask() == ask(presence_penalty=0.0)
    assert ask(presence_penalty=2.0, frequency_penalty=2.0) != ask()


def test_models_load_on_demand_and_unload_when_idle(model_path: Path, tmp_path: Path) -> None:
    other = tmp_path / "second.gguf"
    other.symlink_to(model_path)  # another file: another model, as far as the server knows
    refusing = Server()
    try:  # by default a request may not name a file on the server's disk
        r = httpx.post(refusing.url + "/v1/chat/completions", json={"model": str(other), "messages": CHAT, "max_tokens": 2}, timeout=60)
        assert r.status_code == 403 and r.json()["error"]["param"] == "model" and "--allow-paths" in r.json()["error"]["message"]
        assert httpx.post(refusing.url + "/v1/chat/completions", json={"model": "/etc/passwd", "messages": CHAT}, timeout=60).status_code == 403
        assert refusing.client().chat.completions.create(model=MODEL, messages=CHAT, max_tokens=2).choices  # its own model still answers
    finally:
        assert refusing.stop()[0] == 0
    s = Server("--keep-alive", "2s", "--max-loaded", "2", "--allow-paths")
    try:
        client = s.client()
        # Ollama's keep_alive: a request keeps its model loaded forever (-1), past the server's 2 s
        assert httpx.post(s.url + "/api/generate", json={"model": MODEL, "keep_alive": -1}, timeout=60).json()["done_reason"] == "load"
        assert client.chat.completions.create(model=str(other), messages=CHAT, max_tokens=2).model == str(other)
        assert str(other) in [m.id for m in client.models.list().data]  # loaded: listed beside the downloaded ones
        deadline = time.time() + 30  # the reaper looks every few seconds
        while time.time() < deadline and str(other) in [m.id for m in client.models.list().data]:
            time.sleep(0.5)
        assert str(other) not in [m.id for m in client.models.list().data]  # unloaded after 2 s idle
        assert [m["model"] for m in httpx.get(s.url + "/api/ps", timeout=60).json()["models"]] == [MODEL]  # still loaded
        assert client.chat.completions.create(model=str(other), messages=CHAT, max_tokens=2).choices[0].message.content is not None  # and back
    finally:
        assert s.stop()[0] == 0


def test_logprobs(server: Server) -> None:
    client = server.client()
    # logprobs are the model's own distribution: without penalties, greedy takes its top-1
    kw = dict(model=server.model, messages=CHAT, max_tokens=8, temperature=0, logprobs=True, top_logprobs=3, extra_body={"repeat_penalty": 1.0})
    whole = client.chat.completions.create(**kw)
    content = whole.choices[0].logprobs.content
    assert len(content) == whole.usage.completion_tokens
    for entry in content:
        assert entry.logprob <= 0 and len(entry.top_logprobs) == 3
        assert [t.logprob for t in entry.top_logprobs] == sorted((t.logprob for t in entry.top_logprobs), reverse=True)
        assert entry.token == entry.top_logprobs[0].token and entry.logprob == entry.top_logprobs[0].logprob  # greedy: the top-1
        assert sum(2.718281828 ** t.logprob for t in entry.top_logprobs) <= 1.0001
    assert "".join(e.token for e in content) == whole.choices[0].message.content
    streamed = [e for c in client.chat.completions.create(**kw, stream=True) if c.choices and c.choices[0].logprobs for e in c.choices[0].logprobs.content]
    assert [(e.token, e.logprob) for e in streamed] == [(e.token, e.logprob) for e in content]
    legacy = client.completions.create(model=server.model, prompt="One, two, three,", max_tokens=6, temperature=0, logprobs=2).choices[0]
    assert "".join(legacy.logprobs.tokens) == legacy.text and len(legacy.logprobs.top_logprobs[0]) == 2
    assert legacy.logprobs.text_offset[0] == 0
    r = httpx.post(server.url + "/v1/chat/completions", json={"messages": CHAT, "top_logprobs": 2}, timeout=60)
    assert r.status_code == 400 and "logprobs" in r.json()["error"]["message"]


def test_n_choices_share_the_prompt(server: Server) -> None:
    client = server.client()
    hits = server.metrics()["localinfer_prefix_cache_hit_tokens_total"]
    prompt = [{"role": "user", "content": "Invent a name for a cat. " + "Think carefully. " * 10}]
    out = client.chat.completions.create(model=server.model, messages=prompt, n=3, max_tokens=12, temperature=1.0, seed=7)
    assert [c.index for c in out.choices] == [0, 1, 2] and all(c.finish_reason for c in out.choices)
    assert len({c.message.content for c in out.choices}) > 1  # seeds 7, 8, 9: different samples
    single = client.chat.completions.create(model=server.model, messages=prompt, max_tokens=12, temperature=0)
    assert out.usage.prompt_tokens == single.usage.prompt_tokens
    # choices 2 and 3 copied the prompt's cache from choice 1 (all but its last token)
    assert server.metrics()["localinfer_prefix_cache_hit_tokens_total"] - hits >= 2 * (out.usage.prompt_tokens - 1)
    seen: dict[int, str | None] = {}
    for chunk in client.chat.completions.create(model=server.model, messages=prompt, n=2, max_tokens=6, stream=True):
        for choice in chunk.choices:
            seen[choice.index] = choice.finish_reason or seen.get(choice.index)
    assert set(seen) == {0, 1} and all(seen.values())


@pytest.mark.parametrize("engine", ["llama.cpp", "native"])
def test_embeddings_match_llama_cpp_pythons_own(engine: str, model_path: Path) -> None:
    """Mean-pooled, L2-normalised final-norm hidden states, against llama-cpp-python's
    Llama(embedding=True, pooling MEAN).embed(normalize=True) on the same file."""
    import llama_cpp
    import numpy as np

    texts = ["The cat sat on the mat.", "A kitten is sitting on a rug.", "Stock markets fell sharply today."]
    reference = llama_cpp.Llama(str(model_path), embedding=True, pooling_type=llama_cpp.LLAMA_POOLING_TYPE_MEAN, n_ctx=512, verbose=False)
    want = [np.array(reference.embed(t, normalize=True)) for t in texts]
    reference.close()
    s = Server("--engine", engine, "--parallel", "2")
    try:
        got = s.client().embeddings.create(model=MODEL, input=texts)  # the client asks for base64
        vectors = [np.array(d.embedding) for d in got.data]
        assert [d.index for d in got.data] == [0, 1, 2] and got.usage.prompt_tokens > 0
        for v, w in zip(vectors, want):
            assert abs(np.linalg.norm(v) - 1) < 1e-4 and float(v @ w) > 0.998
        assert float(vectors[0] @ vectors[1]) > float(vectors[0] @ vectors[2])  # the kitten is nearer the cat than the stocks
        as_float = httpx.post(s.url + "/v1/embeddings", json={"input": texts[0], "encoding_format": "float"}, timeout=60).json()
        assert np.allclose(as_float["data"][0]["embedding"], vectors[0], atol=1e-6)
        assert httpx.post(s.url + "/v1/embeddings", json={"input": []}, timeout=60).status_code == 400
        assert httpx.post(s.url + "/v1/embeddings", json={"input": [10**9]}, timeout=60).status_code == 400
    finally:
        assert s.stop()[0] == 0


def test_a_disconnect_lets_a_queued_request_start() -> None:
    # --draft none: no verify-cost timing at start, which would hold the engine thread while the
    # first request arrives and count it as waiting too
    s = Server("--parallel", "1", "--max-queue", "4", "--draft", "none")
    try:
        long = {"messages": [{"role": "user", "content": "Write a very long story."}], "max_tokens": 2000, "temperature": 0, "stream": True}
        done: list[int] = []
        with httpx.stream("POST", s.url + "/v1/chat/completions", json=long, timeout=60) as first:
            lines = first.iter_lines()  # kept: a discarded iterator closes the connection (a flaky "disconnected")
            next(lines)  # decoding, holding the only slot
            waiter = threading.Thread(target=lambda: done.append(httpx.post(s.url + "/v1/chat/completions", json={"messages": CHAT, "max_tokens": 4}, timeout=120).status_code))
            waiter.start()
            deadline = time.time() + 30
            while s.metrics()["localinfer_requests_waiting"] < 1 and time.time() < deadline:
                time.sleep(0.05)
            assert s.metrics()["localinfer_requests_waiting"] == 1  # queued behind the stream
        waiter.join(timeout=120)  # the first client has gone: its slot goes to the queued request
        assert done == [200]
        assert s.metrics()['localinfer_requests_total{status="disconnected"}'] == 1
    finally:
        assert s.stop()[0] == 0
