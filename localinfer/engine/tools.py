"""Tool calls (OpenAI's `tools`), written once above the backends: how the tools reach the
prompt, how the model's answer is read back into calls, and the grammar that makes a call
certain when one is required.

Models write calls in the syntax their chat template shows them:
- "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5 and 3);
- "llama3": a bare JSON object `{"name": ..., "parameters": {...}}` (Llama 3.1 to 3.3, whose
  template renders the tools into the prompt itself);
- "harmony": gpt-oss's commentary message addressed `to=functions.NAME` (harmony.py splits it
  from the reasoning and hands it on in the template's own form for a call, read here);
- "generic": a template that knows nothing of tools (the embedded SmolLM2). We describe the
  tools in the system prompt ourselves and ask for the Hermes syntax, as llama-server does
  for such templates.
"""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass, field
from typing import Literal

from localinfer.engine import harmony
from localinfer.engine.constraints import JSON_OPTIONS, Constraint
from localinfer.engine.stops import partial_suffix
from localinfer.errors import ConstraintError

ToolFormat = Literal["hermes", "llama3", "generic", "harmony"]
OPEN, CLOSE = "<tool_call>", "</tool_call>"
MARKS = {"harmony": (harmony.CALL_OPEN, harmony.CALL)}  # where a call starts and ends in the text; others: OPEN, CLOSE

GENERIC_PROMPT = """You can call these tools:
{tools}

To call a tool, answer with only this, one line per call:
<tool_call>{{"name": "<tool name>", "arguments": {{<the arguments, as JSON>}}}}</tool_call>
A tool's result comes back to you in <tool_response></tool_response>. Answer without a tool when none is needed."""


@dataclass(frozen=True)
class Tool:
    name: str
    parameters: dict = field(default_factory=lambda: {"type": "object", "properties": {}})
    description: str = ""

    def __post_init__(self) -> None:
        if not self.name or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", self.name):
            raise ConstraintError(f"tool name {self.name!r} must be 1-64 letters, digits, _, . or -")
        if not isinstance(self.parameters, dict) or self.parameters.get("type", "object") != "object":
            raise ConstraintError(f"the parameters of tool {self.name!r} must be a JSON schema of type object")

    def openai(self) -> dict:
        """The tool as chat templates receive it (OpenAI's shape)."""
        return {"type": "function", "function": {"name": self.name, "description": self.description, "parameters": self.parameters}}


@dataclass
class ToolCall:
    name: str
    arguments: str  # JSON text, as OpenAI sends it
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")


def tool_format(template: str | None) -> ToolFormat:
    """The syntax a model's own template teaches it; "generic" when it teaches none."""
    t = template or ""
    if "tools" not in t:
        return "generic"
    if harmony.CHANNEL in t and harmony.CALL in t:
        return "harmony"
    if OPEN in t:
        return "hermes"
    if "<|python_tag|>" in t or "ipython" in t:
        return "llama3"
    return "generic"


def prompt_messages(messages: list[dict], tools: list[Tool], fmt: ToolFormat) -> list[dict]:
    """The conversation as this format's template should see it: OpenAI's assistant
    tool_calls and role "tool" messages become what the model was shown in training."""
    out = []
    for m in messages:
        m = dict(m)
        if m.get("role") == "assistant" and m.get("tool_calls"):
            calls = [c["function"] for c in m["tool_calls"]]
            if fmt == "generic":
                m["content"] = (m.get("content") or "") + "\n".join(f"{OPEN}{json.dumps({'name': c['name'], 'arguments': _loads(c['arguments'])}, ensure_ascii=False)}{CLOSE}" for c in calls)
                del m["tool_calls"]
            else:  # Hugging Face templates take the arguments as an object
                m["tool_calls"] = [{"type": "function", "function": {"name": c["name"], "arguments": _loads(c["arguments"])}} for c in calls]
                m["content"] = m.get("content") or ""
        elif m.get("role") == "tool" and fmt == "generic":
            m = {"role": "user", "content": f"<tool_response>\n{m.get('content') or ''}\n</tool_response>"}
        out.append(m)
    if fmt == "generic" and tools:
        described = "\n".join(json.dumps(t.openai()["function"], ensure_ascii=False) for t in tools)
        system = GENERIC_PROMPT.format(tools=described)
        if out and out[0].get("role") == "system":
            out[0] = {**out[0], "content": f"{out[0]['content']}\n\n{system}"}
        else:
            out.insert(0, {"role": "system", "content": system})
    return out


def call_prefix(fmt: ToolFormat, chosen: list[Tool] | None = None) -> str:
    """Text the answer starts with when a call is required (it goes at the end of the
    prompt, so the grammar constrains only the call itself). Harmony's is the call's
    header, through its name when only one tool may be called."""
    if fmt == "harmony":
        head = harmony.CHANNEL + "commentary to=functions."
        return head + f"{chosen[0].name} {harmony.CONSTRAIN}json{harmony.MESSAGE}" if chosen and len(chosen) == 1 else head
    return "" if fmt == "llama3" else OPEN


def call_constraint(tools: list[Tool], fmt: ToolFormat) -> Constraint:
    """JSON that is a call of one of `tools`, its arguments valid for that tool's schema.
    Arguments the schema does not name are left out unless it allows them explicitly
    (as OpenAI's strict mode does): a small model would otherwise add its own until
    max_tokens, and a tool cannot take them."""
    if fmt == "harmony":
        return _harmony_constraint(tools)
    key = "parameters" if fmt == "llama3" else "arguments"
    options = [
        {"type": "object", "properties": {"name": {"const": t.name}, key: {"additionalProperties": False, **t.parameters}}, "required": ["name", key], "additionalProperties": False}
        for t in tools
    ]
    return Constraint.json_schema(options[0] if len(options) == 1 else {"anyOf": options})


def _harmony_constraint(tools: list[Tool]) -> Constraint:
    """After call_prefix: one tool's arguments; of several, a name, the rest of the header
    (harmony's special tokens, which a gpt-oss vocabulary holds) and that tool's arguments."""
    schemas = [{"additionalProperties": False, **t.parameters} for t in tools]
    if len(tools) == 1:
        return Constraint.json_schema(schemas[0])
    rules = [f"start: {' | '.join(f'c{i}' for i in range(len(tools)))}"]
    for i, (tool, schema) in enumerate(zip(tools, schemas)):
        rules.append(f'c{i}: "{tool.name}" " " {harmony.CONSTRAIN} "json" {harmony.MESSAGE} a{i}')
        rules.append(f"a{i}: %json {json.dumps({**schema, 'x-guidance': JSON_OPTIONS})}")
    return Constraint("grammar", "\n".join(rules))


def parse_calls(text: str, fmt: ToolFormat, required: bool = False, keep: bool = True) -> tuple[str, list[ToolCall]]:
    """(content, calls) from a finished answer, read as a stream read in one piece, so a
    streamed answer and a whole one always agree. With `required`, the answer is the
    call's JSON alone (the prefix was in the prompt, the grammar shaped the rest; harmony's
    splitter writes the whole call whatever the prompt held). Without `keep`, calls are
    taken out of the text and dropped (a format whose calls never belong in the answer)."""
    stream = CallStream(fmt, required, keep)
    head, calls = stream.push(text)
    tail, more = stream.finish()
    calls += more
    content = head + tail
    return (content.strip() if calls else content if fmt == "harmony" else text), calls


def _call(text: str, fmt: ToolFormat = "hermes") -> ToolCall | None:
    """The call written between a call's marks; None if it is not one."""
    if fmt == "harmony":
        return _harmony_call(text)
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(value, dict) or not isinstance(value.get("name"), str):
        return None
    args = value.get("arguments", value.get("parameters", {}))
    if isinstance(args, str):
        args = _loads(args)
    return ToolCall(value["name"], json.dumps(args, ensure_ascii=False))


def _harmony_call(text: str) -> ToolCall | None:
    """`NAME<|channel|>commentary json<|message|>ARGUMENTS` (harmony.call_text's middle)."""
    name, _, arguments = text.partition(harmony.CALL_HEAD)
    try:
        value = json.loads(arguments)
    except json.JSONDecodeError:
        return None
    return ToolCall(name, json.dumps(value, ensure_ascii=False)) if name and isinstance(value, dict) else None


def _loads(arguments: str | dict) -> object:
    if isinstance(arguments, dict):
        return arguments
    try:
        return json.loads(arguments)
    except (json.JSONDecodeError, TypeError):
        return arguments


class CallStream:
    """Streamed text with the calls held back: text outside calls goes out as it comes
    (except what might be the start of a call), each call goes out once it is whole."""

    def __init__(self, fmt: ToolFormat, required: bool = False, keep: bool = True) -> None:
        self.fmt, self.required, self.keep = fmt, required, keep
        self.open, self.close = MARKS.get(fmt, (OPEN, CLOSE))
        self._buffer = ""
        self._whole = required and fmt != "harmony"  # everything is one call: hold it all
        self._started = False

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
        content, calls = self._push(text)
        return content, calls if self.keep else []

    def finish(self) -> tuple[str, list[ToolCall]]:
        content, calls = self._finish()
        return content, calls if self.keep else []

    def _push(self, text: str) -> tuple[str, list[ToolCall]]:
        self._buffer += text
        if self._whole:
            return "", []
        if self.fmt == "llama3" and not self._started:
            stripped = self._buffer.lstrip()
            if not stripped:
                return "", []
            self._started = True
            if stripped.startswith("{"):
                self._whole = True
                return "", []
        if self.fmt == "llama3":
            out, self._buffer = self._buffer, ""
            return out, []
        return self._drain(final=False)

    def _finish(self) -> tuple[str, list[ToolCall]]:
        if self._whole:
            text, self._buffer = self._buffer, ""
            call = _call(text.strip())
            return ("", [call]) if call else (text, [])
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, list[ToolCall]]:
        out, calls = [], []
        while True:
            start = self._buffer.find(self.open)
            if start < 0:
                keep = 0 if final else partial_suffix(self._buffer, self.open)
                out.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            end = self._buffer.find(self.close, start)
            if end < 0 and not final:
                out.append(self._buffer[:start])
                self._buffer = self._buffer[start:]
                break
            stop = len(self._buffer) if end < 0 else end + len(self.close)
            call = _call(self._buffer[start + len(self.open) : end if end >= 0 else None].strip(), self.fmt)
            # a harmony call that is not one (cut short) is dropped: its marks are no answer
            out.append(self._buffer[:start] if call or self.fmt == "harmony" else self._buffer[:stop])
            if call:
                calls.append(call)
            self._buffer = self._buffer[stop:]
        return "".join(out), calls


@dataclass
class ToolPlan:
    """How one request uses its tools: the syntax, the tools the prompt shows, and, when a
    call is required, the grammar that makes it a valid one."""

    fmt: ToolFormat
    tools: list[Tool]
    required: bool
    constraint: Constraint | None
    prefix: str = ""  # the answer's start, written into the prompt (a required call's opening)

    def template_tools(self) -> list[dict] | None:
        return [t.openai() for t in self.tools] if self.fmt != "generic" else None


def plan_tools(template: str | None, tools: list[Tool], choice: str) -> ToolPlan | None:
    """`choice`: OpenAI's tool_choice, "auto", "none", "required", or a tool's name. None
    when the answer is plain text."""
    if not tools:
        if choice not in ("auto", "none"):
            raise ConstraintError("tool_choice asks for a tool call, but no tools were given")
        return None
    if choice == "none":
        return None
    fmt = tool_format(template)
    if choice in ("auto", "required"):
        chosen = tools
    else:
        chosen = [t for t in tools if t.name == choice]
        if not chosen:
            raise ConstraintError(f"tool_choice names {choice!r}, which is not one of the tools")
    required = choice != "auto"
    if not required:
        return ToolPlan(fmt, tools, False, None)
    return ToolPlan(fmt, tools, True, call_constraint(chosen, fmt), call_prefix(fmt, chosen))
