"""gpt-oss's harmony format through every dialect, with each dialect's own client (openai,
anthropic, ollama) against a real server on loopback: analysis comes back as reasoning,
final as the answer and a commentary call as a tool call, whole and streamed; a call's
reasoning goes back through the template on the next turn; and each dialect's effort
reaches the template as its `reasoning_effort`.

The server is `create_app` under uvicorn in this process, holding a scripted gpt-oss
(tests/engine/harmony_model.py): the embedded model's tokenizer with harmony's markers as
single special tokens, gpt-oss's real template, and replies scripted by the prompt they
answer. The backend keeps every prompt it answered, so a test reads what the template made.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator

import anthropic
import ollama
import openai
import pytest
import uvicorn

from localinfer.engine.engine import Engine
from localinfer.engine.loader import LoadOptions
from localinfer.server.app import create_app
from localinfer.server.host import ModelHost

from ..engine.harmony_model import MODEL, MarkedTokenizer, Replay
from ..engine.test_harmony import ANSWER, ARGUMENTS, THOUGHT, WEATHER, call, reply

QUESTION, WEATHER_QUESTION = "What is the capital of France?", "What is the weather in Paris?"
CALL_THOUGHT, RESULT = "The user wants the weather; call get_weather.", "18 C, clear"
RESULT_THOUGHT, RESULT_ANSWER = "Report the tool's answer.", "It is 18 C and clear in Paris."
SCRIPTS = {  # the end of the prompt each reply answers (a tool's result as the template writes it: JSON)
    f"{QUESTION}<|end|><|start|>assistant": reply(THOUGHT, ANSWER),
    f"{WEATHER_QUESTION}<|end|><|start|>assistant": call(CALL_THOUGHT, WEATHER.name, ARGUMENTS),
    f"{json.dumps(RESULT)}<|end|><|start|>assistant": reply(RESULT_THOUGHT, RESULT_ANSWER),
}
OPENAI_TOOL = WEATHER.openai()
MARKS = ("<|channel|>", "<|message|>", "<|start|>", "<|constrain|>", "to=functions")


class ScriptedHost(ModelHost):
    """serve's model host, holding the scripted gpt-oss instead of loading a file."""

    def __init__(self, backend: Replay) -> None:
        super().__init__(MODEL, LoadOptions())
        self.backend = backend

    def _load(self, ref: str | None) -> Engine:
        engine = Engine(self.backend, slots=2, name=MODEL)
        engine.start()
        return engine


class Api:
    def __init__(self, url: str, backend: Replay) -> None:
        self.url, self.backend = url, backend
        self.openai = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0, timeout=60)
        self.anthropic = anthropic.Anthropic(base_url=url, api_key="none", max_retries=0, timeout=60)
        self.ollama = ollama.Client(host=url, timeout=60)

    def prompt_of(self, ask) -> str:  # type: ignore[no-untyped-def]
        """The prompt the template made for one request, `ask()`."""
        seen = len(self.backend.prompts)
        ask()
        prompts = self.backend.prompts[seen:]
        assert len(prompts) == 1, prompts
        return prompts[0]


@pytest.fixture(scope="module")
def api(backend) -> Iterator[Api]:  # type: ignore[no-untyped-def]
    scripted = Replay(MarkedTokenizer(backend), SCRIPTS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(ScriptedHost(scripted), parallel=2), host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.time() + 60
    while not server.started:
        assert thread.is_alive() and time.time() < deadline
        time.sleep(0.05)
    yield Api(f"http://127.0.0.1:{port}", scripted)
    server.should_exit = True
    thread.join(timeout=30)


def clean(*texts: str) -> bool:
    return not any(mark in text for text in texts for mark in MARKS)


def test_analysis_is_reasoning_and_final_the_answer_in_every_dialect(api: Api) -> None:
    asked = [{"role": "user", "content": QUESTION}]
    whole = api.openai.chat.completions.create(model=MODEL, messages=asked)
    message = whole.choices[0].message
    assert (message.model_extra["reasoning_content"], message.content, whole.choices[0].finish_reason) == (THOUGHT, ANSWER, "stop")
    assert 0 < whole.usage.completion_tokens_details.reasoning_tokens < whole.usage.completion_tokens
    chunks = [c for c in api.openai.chat.completions.create(model=MODEL, messages=asked, stream=True) if c.choices]
    assert "".join(c.choices[0].delta.model_extra.get("reasoning_content") or "" for c in chunks) == THOUGHT
    assert "".join(c.choices[0].delta.content or "" for c in chunks) == ANSWER

    response = api.openai.responses.create(model=MODEL, input=QUESTION)
    assert [i.type for i in response.output] == ["reasoning", "message"] and response.output[0].content[0].text == THOUGHT and response.output_text == ANSWER
    events = list(api.openai.responses.create(model=MODEL, input=QUESTION, stream=True))
    assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == THOUGHT
    assert "".join(e.delta for e in events if e.type == "response.output_text.delta") == ANSWER

    reply_ = api.anthropic.messages.create(model=MODEL, max_tokens=256, messages=asked)
    assert [(b.type, getattr(b, "thinking", None) or getattr(b, "text", None)) for b in reply_.content] == [("thinking", THOUGHT), ("text", ANSWER)]
    with api.anthropic.messages.stream(model=MODEL, max_tokens=256, messages=asked) as stream:
        list(stream)
        streamed = stream.get_final_message()
    assert [b.model_dump(exclude={"signature"}) for b in streamed.content] == [b.model_dump(exclude={"signature"}) for b in reply_.content]

    chat = api.ollama.chat(model=MODEL, messages=asked)
    assert (chat.message.thinking, chat.message.content) == (THOUGHT, ANSWER)
    parts = list(api.ollama.chat(model=MODEL, messages=asked, stream=True))
    assert ("".join(p.message.thinking or "" for p in parts), "".join(p.message.content for p in parts)) == (THOUGHT, ANSWER)
    generated = api.ollama.generate(model=MODEL, prompt=QUESTION)
    assert (generated.thinking, generated.response) == (THOUGHT, ANSWER)


def test_a_commentary_call_is_a_tool_call_in_every_dialect(api: Api) -> None:
    asked = [{"role": "user", "content": WEATHER_QUESTION}]
    whole = api.openai.chat.completions.create(model=MODEL, messages=asked, tools=[OPENAI_TOOL])
    choice = whole.choices[0]
    assert choice.finish_reason == "tool_calls" and choice.message.model_extra["reasoning_content"] == CALL_THOUGHT and not choice.message.content
    assert [(c.function.name, json.loads(c.function.arguments)) for c in choice.message.tool_calls] == [(WEATHER.name, ARGUMENTS)]
    chunks = [c for c in api.openai.chat.completions.create(model=MODEL, messages=asked, tools=[OPENAI_TOOL], stream=True) if c.choices]
    streamed = [(t.function.name, json.loads(t.function.arguments)) for c in chunks for t in c.choices[0].delta.tool_calls or []]
    assert streamed == [(WEATHER.name, ARGUMENTS)] and chunks[-1].choices[0].finish_reason == "tool_calls"
    assert clean(*(c.choices[0].delta.content or "" for c in chunks))

    tool = {"type": "function", **OPENAI_TOOL["function"]}
    response = api.openai.responses.create(model=MODEL, input=WEATHER_QUESTION, tools=[tool])
    assert [(i.name, json.loads(i.arguments)) for i in response.output if i.type == "function_call"] == [(WEATHER.name, ARGUMENTS)]
    assert response.output_text == "" and response.output[0].type == "reasoning"
    events = list(api.openai.responses.create(model=MODEL, input=WEATHER_QUESTION, tools=[tool], stream=True))
    assert [json.loads(e.arguments) for e in events if e.type == "response.function_call_arguments.done"] == [ARGUMENTS]

    anthropic_tool = {"name": WEATHER.name, "description": WEATHER.description, "input_schema": WEATHER.parameters}
    message = api.anthropic.messages.create(model=MODEL, max_tokens=256, messages=asked, tools=[anthropic_tool])
    assert message.stop_reason == "tool_use" and [(b.name, b.input) for b in message.content if b.type == "tool_use"] == [(WEATHER.name, ARGUMENTS)]
    assert [b.type for b in message.content] == ["thinking", "tool_use"]
    with api.anthropic.messages.stream(model=MODEL, max_tokens=256, messages=asked, tools=[anthropic_tool]) as stream:
        list(stream)
        assert [(b.name, b.input) for b in stream.get_final_message().content if b.type == "tool_use"] == [(WEATHER.name, ARGUMENTS)]

    chat = api.ollama.chat(model=MODEL, messages=asked, tools=[OPENAI_TOOL])
    assert [(c.function.name, dict(c.function.arguments)) for c in chat.message.tool_calls] == [(WEATHER.name, ARGUMENTS)] and chat.message.content == ""
    parts = list(api.ollama.chat(model=MODEL, messages=asked, tools=[OPENAI_TOOL], stream=True))
    assert [(c.function.name, dict(c.function.arguments)) for p in parts for c in p.message.tool_calls or []] == [(WEATHER.name, ARGUMENTS)]

    # Offered no tools, the model's call is dropped, never sent as text.
    bare = api.openai.chat.completions.create(model=MODEL, messages=asked).choices[0].message
    assert not bare.tool_calls and bare.content == "" and bare.model_extra["reasoning_content"] == CALL_THOUGHT


def test_a_calls_reasoning_goes_back_with_it(api: Api) -> None:
    """The next turn carries the call and its reasoning; the template shows the reasoning
    before the call (no later answer followed it yet), and the model answers the result."""
    arguments = json.dumps(ARGUMENTS)
    analysis = f"<|start|>assistant<|channel|>analysis<|message|>{CALL_THOUGHT}<|start|>assistant to=functions.{WEATHER.name}"  # <|end|> renders as nothing
    turns = [{"role": "user", "content": WEATHER_QUESTION},
             {"role": "assistant", "content": None, "reasoning_content": CALL_THOUGHT, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": WEATHER.name, "arguments": arguments}}]},
             {"role": "tool", "tool_call_id": "c1", "content": RESULT}]  # fmt: skip
    answer = {}
    prompt = api.prompt_of(lambda: answer.setdefault("chat", api.openai.chat.completions.create(model=MODEL, messages=turns, tools=[OPENAI_TOOL])))
    assert analysis in prompt and answer["chat"].choices[0].message.content == RESULT_ANSWER

    anthropic_turns = [turns[0], {"role": "assistant", "content": [{"type": "thinking", "thinking": CALL_THOUGHT, "signature": ""},
                                                                   {"type": "tool_use", "id": "c1", "name": WEATHER.name, "input": ARGUMENTS}]},
                       {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "c1", "content": RESULT}]}]  # fmt: skip
    anthropic_tool = {"name": WEATHER.name, "description": WEATHER.description, "input_schema": WEATHER.parameters}
    assert analysis in api.prompt_of(lambda: api.anthropic.messages.create(model=MODEL, max_tokens=256, messages=anthropic_turns, tools=[anthropic_tool]))

    ollama_turns = [turns[0], {"role": "assistant", "content": "", "thinking": CALL_THOUGHT, "tool_calls": [{"function": {"name": WEATHER.name, "arguments": ARGUMENTS}}]},
                    {"role": "tool", "content": RESULT}]  # fmt: skip
    assert analysis in api.prompt_of(lambda: api.ollama.chat(model=MODEL, messages=ollama_turns, tools=[OPENAI_TOOL]))

    tool = {"type": "function", **OPENAI_TOOL["function"]}
    first = api.openai.responses.create(model=MODEL, input=WEATHER_QUESTION, tools=[tool], store=True)
    called = next(i for i in first.output if i.type == "function_call")
    follow = [{"type": "function_call_output", "call_id": called.call_id, "output": RESULT}]
    assert analysis in api.prompt_of(lambda: api.openai.responses.create(model=MODEL, input=follow, tools=[tool], previous_response_id=first.id))
    sent_back = [{"role": "user", "content": WEATHER_QUESTION}, *(i.model_dump(exclude_none=True) for i in first.output), *follow]
    assert analysis in api.prompt_of(lambda: api.openai.responses.create(model=MODEL, input=sent_back, tools=[tool]))


def test_each_dialects_effort_reaches_the_template(api: Api) -> None:
    asked = [{"role": "user", "content": QUESTION}]
    chat = api.openai.chat.completions
    asks = [
        ("medium", lambda: chat.create(model=MODEL, messages=asked)),  # none asked: the template's default
        ("high", lambda: chat.create(model=MODEL, messages=asked, reasoning_effort="high")),
        ("low", lambda: chat.create(model=MODEL, messages=asked, reasoning_effort="minimal")),
        ("low", lambda: chat.create(model=MODEL, messages=asked, reasoning_effort="none")),  # gpt-oss cannot stop reasoning: its least
        ("high", lambda: chat.create(model=MODEL, messages=asked, extra_body={"chat_template_kwargs": {"reasoning_effort": "high"}})),
        ("medium", lambda: api.openai.responses.create(model=MODEL, input=QUESTION, reasoning={"effort": "medium"})),
        ("high", lambda: api.openai.responses.create(model=MODEL, input=QUESTION, reasoning={"effort": "high"})),
        ("low", lambda: api.anthropic.messages.create(model=MODEL, max_tokens=256, messages=asked, thinking={"type": "enabled", "budget_tokens": 1024})),
        ("medium", lambda: api.anthropic.messages.create(model=MODEL, max_tokens=256, messages=asked, thinking={"type": "enabled", "budget_tokens": 8000})),
        ("high", lambda: api.anthropic.messages.create(model=MODEL, max_tokens=256, messages=asked, thinking={"type": "enabled", "budget_tokens": 24576})),
        ("high", lambda: api.ollama.chat(model=MODEL, messages=asked, think="high")),
        ("low", lambda: api.ollama.chat(model=MODEL, messages=asked, think=False)),
    ]
    for effort, ask in asks:
        assert f"\nReasoning: {effort}\n" in api.prompt_of(ask), effort
