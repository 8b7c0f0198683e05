"""Tool calls above the backends: which syntax a template teaches, how tools and tool
results reach the prompt, reading calls back (whole and streamed in any pieces), and a
required call on the real model under the grammar, in the generic and the Hermes syntax."""

from __future__ import annotations

import json

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from localinfer.engine.engine import Engine
from localinfer.engine.tools import CLOSE, OPEN, CallStream, Tool, call_prefix, parse_calls, plan_tools, prompt_messages, tool_format
from localinfer.engine.types import SamplingParams
from localinfer.errors import ConstraintError

WEATHER = Tool(
    "get_weather",
    {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]},
    "Current weather in a city",
)
TIME = Tool("get_time", {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 20}}, "required": ["zone"]})
# The shape of Qwen 2.5's and Hermes' templates: the tools rendered in the system turn, calls in <tool_call>.
HERMES_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nYou may call functions. <tools>\n{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools>\n"
    "Return calls as <tool_call>{\"name\": ..., \"arguments\": ...}</tool_call><|im_end|>\n{% endif %}"
    "{% for m in messages %}{% if m.role == 'tool' %}<|im_start|>user\n<tool_response>\n{{ m.content }}\n</tool_response><|im_end|>\n"
    "{% elif m.tool_calls %}<|im_start|>assistant\n{% for c in m.tool_calls %}<tool_call>\n{{ {'name': c.function.name, 'arguments': c.function.arguments} | tojson }}\n</tool_call>{% endfor %}<|im_end|>\n"
    "{% else %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
LLAMA3_TEMPLATE = "{% if tools %}Environment: ipython\n{{ tools | tojson }}{% endif %}{% for m in messages %}{{ m.content }}{% endfor %}<|python_tag|>"


def test_the_syntax_follows_the_template() -> None:
    assert tool_format(HERMES_TEMPLATE) == "hermes"
    assert tool_format(LLAMA3_TEMPLATE) == "llama3"
    assert tool_format("{% for m in messages %}{{ m.content }}{% endfor %}") == "generic"
    assert tool_format(None) == "generic"


def test_calls_are_read_back_from_text_in_each_syntax() -> None:
    calls = [{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}, {"name": "get_time", "arguments": {"zone": "CET"}}]
    text = "Let me check.\n" + "\n".join(f"{OPEN}{json.dumps(c)}{CLOSE}" for c in calls)
    content, found = parse_calls(text, "hermes")
    assert content == "Let me check." and [(c.name, json.loads(c.arguments)) for c in found] == [(c["name"], c["arguments"]) for c in calls]
    content, found = parse_calls(json.dumps({"name": "get_time", "parameters": {"zone": "UTC"}}), "llama3")
    assert content == "" and (found[0].name, json.loads(found[0].arguments)) == ("get_time", {"zone": "UTC"})
    broken = f"{OPEN}{{not json{CLOSE} and text"
    assert parse_calls(broken, "hermes") == (broken, [])  # not a call: it stays text
    assert parse_calls("plain answer", "llama3") == ("plain answer", [])


@settings(max_examples=60, deadline=None)
@given(
    before=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20),
    args=st.dictionaries(st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=8)), max_size=3),
    after=st.text(alphabet=st.characters(blacklist_characters="<"), max_size=20),
    cuts=st.lists(st.integers(min_value=0, max_value=400), max_size=12),
)
def test_a_streamed_answer_gives_the_calls_and_text_of_the_whole(before: str, args: dict, after: str, cuts: list[int]) -> None:
    text = f"{before}{OPEN}{json.dumps({'name': 'f', 'arguments': args})}{CLOSE}{after}"
    pieces, last = [], 0
    for cut in sorted(c for c in cuts if c < len(text)) + [len(text)]:
        pieces.append(text[last:cut])
        last = cut
    stream, content, calls = CallStream("hermes"), [], []
    for piece in pieces:
        out, found = stream.push(piece)
        content.append(out)
        calls += found
    out, found = stream.finish()
    content.append(out)
    calls += found
    assert "".join(content) == before + after
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [("f", args)]


def test_tools_and_tool_results_reach_the_prompt(engine: Engine) -> None:
    """The generic syntax (the embedded model's template knows no tools): the tools go into
    the system prompt, an earlier call and its result into the turns, as text the model reads."""
    messages = [
        {"role": "user", "content": "Weather in Oslo?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": '{"city": "Oslo", "unit": "celsius"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": '{"temperature": -3}'},
    ]
    plan = plan_tools(engine.backend.facts.chat_template, [WEATHER], "auto")
    assert plan is not None and plan.fmt == "generic" and not plan.required
    prompt = engine.render_chat(prompt_messages(messages, plan.tools, plan.fmt), tools=plan.template_tools())
    assert json.dumps(WEATHER.openai()["function"]) in prompt
    assert f'{OPEN}{{"name": "get_weather", "arguments": {{"city": "Oslo", "unit": "celsius"}}}}{CLOSE}' in prompt
    assert '<tool_response>\n{"temperature": -3}\n</tool_response>' in prompt
    engine.backend.facts.chat_template, saved = HERMES_TEMPLATE, engine.backend.facts.chat_template
    try:  # a template that renders tools itself gets them, and the calls as objects
        plan = plan_tools(engine.backend.facts.chat_template, [WEATHER], "auto")
        prompt = engine.render_chat(prompt_messages(messages, plan.tools, plan.fmt), tools=plan.template_tools())
        assert plan.fmt == "hermes" and json.dumps(WEATHER.openai()) in prompt
        assert '{"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}' in prompt and '{"temperature": -3}' in prompt
    finally:
        engine.backend.facts.chat_template = saved


@pytest.mark.parametrize("template", [None, HERMES_TEMPLATE, LLAMA3_TEMPLATE])
@pytest.mark.parametrize("choice", ["required", "get_time"])
def test_a_required_call_is_always_a_valid_call(engine: Engine, template: str | None, choice: str) -> None:
    saved = engine.backend.facts.chat_template
    if template is not None:
        engine.backend.facts.chat_template = template
    try:
        plan = plan_tools(engine.backend.facts.chat_template, [WEATHER, TIME], choice)
        assert plan is not None and plan.required
        text = engine.render_chat(prompt_messages([{"role": "user", "content": "Weather in Paris?"}], plan.tools, plan.fmt), tools=plan.template_tools()) + call_prefix(plan.fmt)
        tokens = engine.tokenize_prompt(text)
        for seed in range(8):
            out = engine.complete(tokens, SamplingParams(temperature=1.0, seed=seed, max_tokens=80, constraint=plan.constraint))
            content, calls = parse_calls(out.text, plan.fmt, required=True)
            assert out.finish_reason == "stop" and content == "" and len(calls) == 1, out.text
            tool = {"get_weather": WEATHER, "get_time": TIME}[calls[0].name]
            assert choice == "required" or tool.name == choice
            jsonschema.validate(json.loads(calls[0].arguments), tool.parameters)
    finally:
        engine.backend.facts.chat_template = saved


@pytest.mark.parametrize(
    "make, says",
    [
        (lambda: Tool("get weather"), "tool name"),
        (lambda: Tool("f", {"type": "string"}), "type object"),
        (lambda: Tool("f", ["not", "a", "schema"]), "type object"),  # type: ignore[arg-type]
        (lambda: plan_tools(None, [], "required"), "no tools"),
        (lambda: plan_tools(None, [WEATHER], "get_time"), "not one of the tools"),
    ],
)
def test_bad_tools_are_one_line_errors(make, says: str) -> None:
    with pytest.raises(ConstraintError, match=says):
        make()
