"""Structured output on the real embedded model, both engines: seeded sampled answers under
a JSON schema, a GBNF grammar and a regex, each checked by a tool that is not the grammar
engine (jsonschema, Python's re); the mask with one legal token; speculation under a
grammar; and every bad constraint refused in one line."""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from localinfer.backends.base import LoadParams
from localinfer.engine.constraints import Constraint
from localinfer.engine.engine import Engine
from localinfer.engine.speculative import DraftConfig
from localinfer.engine.types import SamplingParams
from localinfer.errors import ConstraintError

from ..conftest import THREADS, complete_together
from .test_speculative import CHEAP_VERIFIES

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 24},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "height_m": {"type": "number", "minimum": 0.5, "maximum": 2.5},
        "role": {"enum": ["admin", "editor", "viewer"]},
        "address": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 20}, "zip": {"type": "string", "pattern": "^[0-9]{5}$"}},
            "required": ["city", "zip"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 10}, "minItems": 1, "maxItems": 3},
    },
    "required": ["name", "age", "height_m", "role", "address", "tags"],
    "additionalProperties": False,
}

# A date list in GBNF as llama.cpp writes grammars, and the same language as a Python regex
# (the independent check).
DATES_GBNF = r"""
root ::= "Dates: " date (", " date)? (", " date)? "."
date ::= year "-" month "-" day
year ::= "19" [0-9] [0-9] | "20" [0-2] [0-9]
month ::= "0" [1-9] | "1" [0-2]
day ::= "0" [1-9] | [12] [0-9] | "3" [01]
"""
DATE = r"(19[0-9][0-9]|20[0-2][0-9])-(0[1-9]|1[0-2])-(0[1-9]|[12][0-9]|3[01])"
DATES_RE = rf"Dates: {DATE}(, {DATE}){{0,2}}\."
PHONE_RE = r"\(\d{3}\) \d{3}-\d{4}"
SLOTS = 4
SAMPLED = SamplingParams(temperature=0.9, top_k=40, top_p=0.95, min_p=0.0, max_tokens=160)


@pytest.fixture(scope="module", params=["llama.cpp", "native"])
def engine(request, model_path: Path):
    if request.param == "native":
        from localinfer.backends.native import NativeBackend as cls
    else:
        from localinfer.backends.llamacpp import LlamaCppBackend as cls
    e = Engine(cls.load(model_path, LoadParams(n_ctx=1024, n_threads=THREADS, n_seq_max=SLOTS)), slots=SLOTS)
    yield e
    e.close()


def chat(engine: Engine, prompt: str) -> list[int]:
    return engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": prompt}]))


def answers(engine: Engine, prompt: str, constraint: Constraint, n: int = 20) -> list[str]:
    """n seeded answers, SLOTS of them decoding at once (each with its own constraint state)."""
    tokens = chat(engine, prompt)
    outs = complete_together(engine, [(tokens, SAMPLED.with_overrides(seed=seed, constraint=constraint)) for seed in range(n)])
    assert [o.finish_reason for o in outs] == ["stop"] * n, [o.text for o in outs if o.finish_reason != "stop"]
    return [o.text for o in outs]


def test_twenty_sampled_answers_under_a_nested_schema_all_validate(engine: Engine) -> None:
    texts = answers(engine, "Make up a user record for a web app, as JSON.", Constraint.json_schema(PERSON))
    for text in texts:
        jsonschema.validate(json.loads(text), PERSON)
    assert len(set(texts)) > 10  # sampled, not one answer twenty times


def test_twenty_sampled_answers_under_a_gbnf_grammar_all_match(engine: Engine) -> None:
    for text in answers(engine, "List some dates in ISO format.", Constraint("grammar", DATES_GBNF)):
        assert re.fullmatch(DATES_RE, text), text


def test_twenty_sampled_answers_under_a_regex_all_match(engine: Engine) -> None:
    for text in answers(engine, "What is the phone number of the office?", Constraint("regex", PHONE_RE)):
        assert re.fullmatch(PHONE_RE, text), text


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_the_mask_never_hides_the_only_legal_token(engine: Engine, temperature: float) -> None:
    """One string is allowed: the answer is exactly it, even where the model would never write it."""
    only = "Zebra crossings glow at 3:14 am, ÿes?"
    for schema in ({"const": only}, {"enum": [only]}):
        out = engine.complete(chat(engine, "Say hello."), SAMPLED.with_overrides(temperature=temperature, seed=1, constraint=Constraint.json_schema(schema)))
        assert (out.text, out.finish_reason) == (json.dumps(only, ensure_ascii=False), "stop")


def test_a_constraint_that_cannot_finish_in_time_ends_with_length(engine: Engine) -> None:
    out = engine.complete(chat(engine, "Write a long list."), SAMPLED.with_overrides(seed=3, max_tokens=6, constraint=Constraint.json_schema({"type": "array", "items": {"type": "string"}, "minItems": 50})))
    assert out.finish_reason == "length" and out.completion_tokens == 6
    with pytest.raises(json.JSONDecodeError):
        json.loads(out.text)


def test_speculation_under_a_grammar_equals_plain_constrained_decoding(engine: Engine) -> None:
    """Prompt lookup drafts the JSON the prompt holds; drafts the grammar refuses are cut,
    every verified row is masked, and greedy output is what plain constrained decoding gives."""
    record = {"name": "Ada Lovelace", "age": 36, "height_m": 1.65, "role": "admin", "address": {"city": "London", "zip": "12345"}, "tags": ["math", "poet"]}
    prompt = chat(engine, f"Copy this record exactly, as JSON:\n{json.dumps(record)}\n{json.dumps(record)}")
    params = SamplingParams(temperature=0, max_tokens=120, constraint=Constraint.json_schema(PERSON))
    spec = Engine(engine.backend, draft=DraftConfig(assumed_costs=CHEAP_VERIFIES))  # it always drafts
    plain_out, spec_out = engine.complete(prompt, params), spec.complete(prompt, params)
    assert spec_out.tokens == plain_out.tokens and spec_out.finish_reason == plain_out.finish_reason == "stop"
    assert spec_out.timings.drafted > 0 and spec_out.timings.accepted > 0
    jsonschema.validate(json.loads(spec_out.text), PERSON)


@pytest.mark.parametrize(
    "constraint, says",
    [
        (lambda: Constraint.json_schema('{"type": "objec"}'), "invalid JSON schema"),
        (lambda: Constraint.json_schema("{not json"), "not valid JSON"),
        (lambda: Constraint.json_schema("[1, 2]"), "must be a JSON object"),
        (lambda: Constraint.json_schema({"type": "string", "format": "no-such-format"}), "Unknown format"),
        (lambda: Constraint.json_schema({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]}}), "Unimplemented keys"),  # a feature llguidance lacks
        (lambda: Constraint.json_schema({"$ref": "http://example.com/schema.json"}), "does not fetch"),  # nothing is fetched
        (lambda: Constraint("regex", "(unclosed"), "invalid regex"),
        (lambda: Constraint("grammar", 'root ::= "a" missing_rule'), "grammar"),
        (lambda: Constraint("grammar", "root ::= ("), "grammar"),
    ],
)
def test_a_bad_constraint_is_one_line_and_never_reaches_the_engine(engine: Engine, constraint, says: str) -> None:
    with pytest.raises(ConstraintError) as e:
        engine.submit(chat(engine, "Hi"), SAMPLED.with_overrides(constraint=constraint()))
    assert says in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConstraintError):  # and the check before any model loads says the same
        constraint().check()
    assert engine.n_running == 0 and engine.n_waiting == 0
