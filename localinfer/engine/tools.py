"""Tool calls (OpenAI's `tools`), written once above the backends: how the tools reach the
prompt, how the model's answer is read back into calls, and the grammar that makes a call
certain when one is required.

Models write calls in the syntax their chat template shows them:
- "hermes": `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (Hermes, Qwen 2.5 and 3);
- "llama3": a bare JSON object `{"name": ..., "parameters": {...}}` (Llama 3.1 to 3.3, whose
  template renders the tools into the prompt itself);
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

from localinfer.engine.constraints import Constraint
from localinfer.engine.stops import partial_suffix
from localinfer.errors import ConstraintError

ToolFormat = Literal["hermes", "llama3", "generic"]
OPEN, CLOSE = "<tool_call>", "</tool_call>"

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


def call_prefix(fmt: ToolFormat) -> str:
    """Text the answer starts with when a call is required (it goes at the end of the
    prompt, so the grammar constrains only the call itself)."""
    return "" if fmt == "llama3" else OPEN


def call_constraint(tools: list[Tool], fmt: ToolFormat) -> Constraint:
    """JSON that is a call of one of `tools`, its arguments valid for that tool's schema.
    Arguments the schema does not name are left out unless it allows them explicitly
    (as OpenAI's strict mode does): a small model would otherwise add its own until
    max_tokens, and a tool cannot take them."""
    key = "parameters" if fmt == "llama3" else "arguments"
    options = [
        {"type": "object", "properties": {"name": {"const": t.name}, key: {"additionalProperties": False, **t.parameters}}, "required": ["name", key], "additionalProperties": False}
        for t in tools
    ]
    return Constraint.json_schema(options[0] if len(options) == 1 else {"anyOf": options})


def parse_calls(text: str, fmt: ToolFormat, required: bool = False) -> tuple[str, list[ToolCall]]:
    """(content, calls) from a finished answer, read as a stream read in one piece, so a
    streamed answer and a whole one always agree. With `required`, the answer is the
    call's JSON alone (the prefix was in the prompt, the grammar shaped the rest)."""
    stream = CallStream(fmt, required)
    head, calls = stream.push(text)
    tail, more = stream.finish()
    calls += more
    return ((head + tail).strip() if calls else text), calls


def _call(text: str) -> ToolCall | None:
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

    def __init__(self, fmt: ToolFormat, required: bool = False) -> None:
        self.fmt, self.required = fmt, required
        self._buffer = ""
        self._whole = required  # everything is one call: hold it all
        self._started = False

    def push(self, text: str) -> tuple[str, list[ToolCall]]:
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

    def finish(self) -> tuple[str, list[ToolCall]]:
        if self._whole:
            text, self._buffer = self._buffer, ""
            call = _call(text.strip())
            return ("", [call]) if call else (text, [])
        return self._drain(final=True)

    def _drain(self, final: bool) -> tuple[str, list[ToolCall]]:
        out, calls = [], []
        while True:
            start = self._buffer.find(OPEN)
            if start < 0:
                keep = 0 if final else partial_suffix(self._buffer, OPEN)
                out.append(self._buffer[: len(self._buffer) - keep])
                self._buffer = self._buffer[len(self._buffer) - keep :]
                break
            end = self._buffer.find(CLOSE, start)
            if end < 0 and not final:
                out.append(self._buffer[:start])
                self._buffer = self._buffer[start:]
                break
            stop = len(self._buffer) if end < 0 else end + len(CLOSE)
            call = _call(self._buffer[start + len(OPEN) : end if end >= 0 else None].strip())
            out.append(self._buffer[:start] if call else self._buffer[:stop])
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
    return ToolPlan(fmt, tools, required, call_constraint(chosen, fmt) if required else None)
