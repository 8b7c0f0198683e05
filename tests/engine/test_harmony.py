"""gpt-oss's harmony format above the backends: analysis split from final, a commentary call
read as a tool call, the reply ended at <|return|> or <|call|> (never at <|end|>), efforts
and earlier turns' reasoning through the real template, and markers split anywhere.

The model is scripted (harmony_model.py): the embedded model's tokenizer, as it is (every
marker several tokens of text) or with the markers as single special tokens rendered as
llama.cpp renders gpt-oss's; the template is gpt-oss's own, rendered by our sandbox.
"""

from __future__ import annotations

import json
import random
from dataclasses import replace

import pytest

from localinfer.engine import harmony
from localinfer.engine.constraints import Constraint
from localinfer.engine.engine import Engine
from localinfer.engine.harmony import HarmonySyntax
from localinfer.engine.reasoning import BUDGET_EFFORTS, budget_effort, effort_of, syntax_of, think_of
from localinfer.engine.tools import Tool, parse_calls, plan_tools, prompt_messages, tool_format
from localinfer.engine.types import EFFORTS, SamplingParams

from .harmony_model import TEMPLATE, MarkedTokenizer, Replay, strip_end
from .test_reasoning import QWEN3, R1, Scripted

GREEDY = SamplingParams(temperature=0, repeat_penalty=1.0)
QUESTION = "What is the capital of France?"
WEATHER = Tool("get_weather", {"type": "object", "properties": {"location": {"type": "string"}}, "required": ["location"]}, "Current weather in a city")
TIME = Tool("get_time", {"type": "object", "properties": {"zone": {"type": "string"}}, "required": ["zone"]}, "The time in a time zone")
THOUGHT, ANSWER = "The user asks for the capital of France. It is Paris.", "The capital of France is Paris."
ARGUMENTS = {"location": "Paris"}


def reply(thought: str, answer: str, end: str = harmony.RETURN) -> str:
    """A reply as gpt-oss writes it after the generation prompt: analysis, then final."""
    return f"<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant<|channel|>final<|message|>{answer}{end}"


def call(thought: str, name: str, arguments: dict, in_role: bool = False) -> str:
    """Analysis, then a call addressed in the channel (or, as the template writes earlier calls, in the role)."""
    head = f" to=functions.{name}<|channel|>commentary json" if in_role else f"<|channel|>commentary to=functions.{name} <|constrain|>json"
    return f"<|channel|>analysis<|message|>{thought}<|end|><|start|>assistant{head}<|message|>{json.dumps(arguments)}<|call|>"


@pytest.fixture(params=["text", "special"])
def tokenizer(request, backend):  # type: ignore[no-untyped-def]
    """The markers as text of several tokens, or as gpt-oss's single special tokens."""
    return backend if request.param == "text" else MarkedTokenizer(backend)


def ask(tokenizer, messages: list[dict], script: str, params: SamplingParams = GREEDY, tools: list[Tool] = (), choice: str = "auto", **render):  # type: ignore[no-untyped-def]
    """(the rendered prompt, the engine's result) for `messages`, answered by `script`."""
    plan = plan_tools(TEMPLATE, list(tools), choice)
    shown = prompt_messages(messages, plan.tools if plan else [], tool_format(TEMPLATE))
    prompt = Engine(Replay(tokenizer, {})).render_chat(shown, tools=plan.template_tools() if plan else None, **render) + (plan.prefix if plan else "")
    backend = Replay(tokenizer, {strip_end(prompt)[-80:]: script})
    engine = Engine(backend)
    out = engine.complete(engine.tokenize_prompt(prompt), replace(params, constraint=plan.constraint if plan else params.constraint))
    assert backend.prompts == [backend.text(engine.tokenize_prompt(prompt))]  # the script answered this prompt, once
    return prompt, out


def test_the_format_is_found_in_the_template(backend) -> None:
    tokenize = lambda text: backend.tokenize(text, add_special=False)  # noqa: E731
    assert syntax_of(TEMPLATE, tokenize) == HarmonySyntax() and tool_format(TEMPLATE) == "harmony"
    assert not isinstance(syntax_of(QWEN3, tokenize), HarmonySyntax) and not isinstance(syntax_of(R1, tokenize), HarmonySyntax)
    assert syntax_of(backend.facts.chat_template, tokenize) is None
    assert Engine(Replay(backend, {})).think == HarmonySyntax()


def test_analysis_is_reasoning_and_final_the_answer(tokenizer) -> None:
    script = reply(THOUGHT, ANSWER) + "never written"
    prompt, out = ask(tokenizer, [{"role": "user", "content": QUESTION}], script)
    assert prompt.endswith("<|start|>assistant")  # the model opens with a header
    assert (out.reasoning, out.text, out.finish_reason) == (THOUGHT, ANSWER, "stop")
    scripted = tokenizer.tokenize(script, add_special=False)
    rendered = [b"".join(map(tokenizer.token_bytes, scripted[:n])).decode(errors="replace") for n in range(len(scripted) + 1)]
    analysis_end = next(n for n, text in enumerate(rendered) if "<|end|>" in text or "<|start|>" in text)  # <|end|> unrendered: the <|start|> after it
    assert out.reasoning_tokens == analysis_end < out.completion_tokens
    # the reply ends at <|return|>: nothing after it is generated (an EOG token, or the text that spells it)
    after = next(n for n, text in enumerate(rendered) if "never" in text)  # the first token past <|return|>
    assert out.tokens == scripted[: len(out.tokens)] and after - 2 <= len(out.tokens) < after  # <|return|> itself: text, or an uncounted EOG


def test_end_ends_a_message_not_the_reply(backend) -> None:
    """The marked vocabulary lists <|end|> as end of generation, as a gpt-oss GGUF's raw list
    does; the engine reads the format and ends only at <|return|> and <|call|>."""
    marked = MarkedTokenizer(backend)
    assert marked.ids["<|end|>"] in marked.vocab.eog_ids
    eog = Engine(Replay(marked, {}))._context.eog_ids
    assert marked.ids["<|end|>"] not in eog and {marked.ids["<|return|>"], marked.ids["<|call|>"]} <= eog
    assert Engine(Replay(backend, {}))._context.eog_ids == backend.vocab.eog_ids  # no such tokens: the list as it was


@pytest.mark.parametrize("in_role", [False, True])
def test_a_commentary_call_is_a_tool_call(tokenizer, in_role: bool) -> None:
    script = call("I need the weather in Paris.", WEATHER.name, ARGUMENTS, in_role)
    prompt, out = ask(tokenizer, [{"role": "user", "content": "What is the weather in Paris?"}], script, tools=[WEATHER])
    assert f"type {WEATHER.name} = " in prompt and "Calls to these tools must go to the commentary channel" in prompt  # the template's own rendering
    assert out.reasoning == "I need the weather in Paris." and out.finish_reason == "stop"
    content, calls = parse_calls(out.text, "harmony")
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [(WEATHER.name, ARGUMENTS)]
    assert parse_calls(out.text, "harmony", keep=False) == ("", [])  # where no tools were offered, a call is dropped, its marks too


def test_a_constraint_shapes_the_final_answer_not_the_analysis(tokenizer) -> None:
    schema = {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}
    answer = json.dumps({"city": "Paris"})
    _, out = ask(tokenizer, [{"role": "user", "content": QUESTION}], reply(THOUGHT, answer), replace(GREEDY, constraint=Constraint.json_schema(schema)))
    assert (out.reasoning, out.text, out.finish_reason) == (THOUGHT, answer, "stop")


def test_a_model_that_writes_no_harmony_is_all_answer(tokenizer) -> None:
    _, out = ask(tokenizer, [{"role": "user", "content": QUESTION}], ANSWER)
    assert (out.reasoning, out.text, out.reasoning_tokens) == ("", ANSWER, 0)


@pytest.mark.parametrize(("think", "effort"), [(True, None), (False, "low"), *((e, e) for e in EFFORTS)])
def test_the_effort_reaches_the_template(backend, think, effort: str | None) -> None:
    engine = Engine(Replay(backend, {}))
    prompt = engine.render_chat([{"role": "user", "content": QUESTION}], think=think)
    default = "medium"  # the template's own, when it is given none
    assert f"\nReasoning: {effort or default}\n" in prompt
    assert engine.think.variables(think is not False, think if isinstance(think, str) else None) == ({"reasoning_effort": effort} if effort else {})


def test_what_clients_ask_becomes_an_effort() -> None:
    assert [effort_of(v) for v in (None, "none", "minimal", "low", "medium", "high")] == [True, False, "low", "low", "medium", "high"]
    assert [think_of(flag) for flag in ("on", "off", *EFFORTS)] == [True, False, *EFFORTS] and think_of("high", 0) is False
    for below, effort in BUDGET_EFFORTS:  # Anthropic's budget_tokens: each threshold's edges
        assert budget_effort(below - 1) == effort != budget_effort(below)
    assert [budget_effort(n) for n in (1024, 8000, 24576)] == list(EFFORTS)


def test_earlier_turns_reasoning_goes_back_as_the_template_takes_it(backend) -> None:
    engine = Engine(Replay(backend, {}))
    asked = {"role": "user", "content": "What is the weather in Paris?"}
    called = {"role": "assistant", "content": "", "reasoning_content": "I need the weather.",
              "tool_calls": [{"id": "c1", "type": "function", "function": {"name": WEATHER.name, "arguments": json.dumps(ARGUMENTS)}}]}  # fmt: skip
    result = {"role": "tool", "tool_call_id": "c1", "content": "18 C, clear"}
    shown = prompt_messages([asked, called, result], [WEATHER], "harmony")
    prompt = engine.render_chat(shown, tools=[WEATHER.openai()])
    analysis = "<|start|>assistant<|channel|>analysis<|message|>I need the weather.<|end|>"
    assert analysis + f"<|start|>assistant to=functions.{WEATHER.name}<|channel|>commentary json<|message|>" in prompt
    with_preamble = engine.render_chat(prompt_messages([asked, {**called, "content": "Let me look."}, result], [WEATHER], "harmony"), tools=[WEATHER.openai()])
    assert analysis in with_preamble and "Let me look." not in with_preamble  # the template takes one or the other: the reasoning
    answered = {"role": "assistant", "content": "It is 18 C and clear.", "reasoning_content": "Report it."}
    later = engine.render_chat(prompt_messages([asked, called, result, answered, {"role": "user", "content": "Thanks"}], [WEATHER], "harmony"), tools=[WEATHER.openai()])
    assert "I need the weather." not in later and "Report it." not in later  # once an answer followed, the template drops both
    assert "<|channel|>final<|message|>It is 18 C and clear.<|end|>" in later


def test_a_thinking_budget_ends_the_analysis(backend) -> None:
    marked = MarkedTokenizer(backend)
    plain = Engine(Scripted(marked, TEMPLATE, "", 0))
    tokens = plain.tokenize_prompt(plain.render_chat([{"role": "user", "content": QUESTION}]))
    script = "<|channel|>analysis<|message|>" + " ".join(f"word{i}" for i in range(30))
    out = Engine(Scripted(marked, TEMPLATE, script, len(tokens))).complete(tokens, replace(GREEDY, think_budget=6, max_tokens=40))
    forced = marked.tokenize(harmony.BUDGET_CLOSE, add_special=False)
    assert out.tokens[6 : 6 + len(forced)] == forced  # the engine wrote the close once 6 tokens were spent
    assert out.reasoning and out.text and "<|" not in out.reasoning + out.text  # the script's words after it are the answer
    assert script.split("<|message|>")[1].startswith(out.reasoning)


def test_a_required_call_is_shaped_from_its_header(tokenizer) -> None:
    """One tool: the prompt ends with the call's whole header and the grammar shapes its
    arguments; the splitter starts inside the call."""
    prompt, out = ask(tokenizer, [{"role": "user", "content": "Weather in Paris?"}], json.dumps(ARGUMENTS), tools=[WEATHER, TIME], choice=WEATHER.name)
    assert prompt.endswith(f"<|start|>assistant<|channel|>commentary to=functions.{WEATHER.name} <|constrain|>json<|message|>")
    content, calls = parse_calls(out.text, "harmony", required=True)
    assert content == "" and [(c.name, json.loads(c.arguments)) for c in calls] == [(WEATHER.name, ARGUMENTS)]


def test_a_required_call_among_tools_names_one(backend) -> None:
    """Several tools: the grammar writes the name, the rest of the header (gpt-oss's special
    tokens) and that tool's arguments."""
    script = f"{TIME.name} <|constrain|>json<|message|>" + json.dumps({"zone": "CET"})
    prompt, out = ask(MarkedTokenizer(backend), [{"role": "user", "content": "Time in Paris?"}], script, tools=[WEATHER, TIME], choice="required")
    assert prompt.endswith("<|start|>assistant<|channel|>commentary to=functions.")
    _, calls = parse_calls(out.text, "harmony", required=True)
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [(TIME.name, {"zone": "CET"})]


def pieces_of(text: str, cuts: list[int]) -> list[str]:
    return [text[a:b] for a, b in zip([0, *cuts], [*cuts, len(text)])]


def split(pieces: list[str], tail: str = "<|start|>assistant") -> tuple[str, str]:
    splitter, reasoning, answer = HarmonySyntax().splitter(tail), "", ""
    for piece in pieces:
        r, a = splitter.push(piece)
        reasoning, answer = reasoning + r, answer + a
    r, a = splitter.flush()
    return reasoning + r, answer + a


@pytest.mark.parametrize("rendered_end", [True, False])  # <|end|> as text, or as llama.cpp renders the token: nothing
def test_markers_split_anywhere_split_the_same(rendered_end: bool) -> None:
    texts = [reply(THOUGHT, ANSWER), call("Weather first.", WEATHER.name, ARGUMENTS), call("Weather first.", WEATHER.name, ARGUMENTS, in_role=True)]
    rng = random.Random(0)
    for text in texts:
        text = text if rendered_end else text.replace(harmony.END, "")
        whole = split([text])
        for cut in range(1, len(text)):
            assert split(pieces_of(text, [cut])) == whole, cut
        assert split(list(text)) == whole
        for _ in range(50):
            assert split(pieces_of(text, sorted(rng.sample(range(1, len(text)), 6)))) == whole
    assert split([reply(THOUGHT, ANSWER)]) == (THOUGHT, ANSWER)
    reasoning, answer = split([texts[1]])
    assert reasoning == "Weather first." and harmony.CALL_OPEN in answer and "<|channel|>analysis" not in answer
