"""Chat templates: the model's own Jinja template from GGUF metadata, rendered in a sandbox.

The template is code shipped inside a downloaded file, so it runs in jinja2's
ImmutableSandboxedEnvironment, with the few helpers Hugging Face templates expect.
"""

from __future__ import annotations

import json
import sys
import time
from datetime import datetime
from functools import lru_cache

import jinja2
from jinja2.exceptions import SecurityError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from localinfer.errors import TemplateError

# Used only when a model ships no template at all; ChatML is what most instruct models use.
CHATML = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

Message = dict[str, object]  # role, content; tool_calls and tool_call_id where tools are in use


def _raise(message: str) -> None:
    raise jinja2.TemplateError(message)


def _tojson(value: object, indent: int | None = None, **_: object) -> str:
    # Hugging Face renders tojson without ASCII escaping; match it so non-English text survives.
    return json.dumps(value, ensure_ascii=False, indent=indent)


MAX_PRODUCT = 1 << 20  # characters or items a template's `*` may make; a prompt is never near it
MAX_EXPONENT = 256  # a template's `**`: 10 ** 10 ** 8 would compute for minutes
RENDER_SECONDS = 2.0  # nested loops over a long message could run for hours; a real template takes ms


class _Deadline:
    """Ends a render that runs past its time: a trace function on the template's own frames
    (jinja2 compiles a template to Python code named '<template>'), which counts lines and
    looks at the clock every 1,024 of them. Other code runs untraced."""

    def __init__(self, seconds: float) -> None:
        self.end = time.monotonic() + seconds
        self.lines = 0

    def on_call(self, frame, event: str, arg: object):  # type: ignore[no-untyped-def]
        return self.on_line if frame.f_code.co_filename == "<template>" else None

    def on_line(self, frame, event: str, arg: object):  # type: ignore[no-untyped-def]
        self.lines += 1
        if not self.lines & 1023 and time.monotonic() > self.end:
            raise SecurityError(f"the template ran for over {RENDER_SECONDS:g} s")
        return self.on_line


class _Sandbox(ImmutableSandboxedEnvironment):
    """jinja2's immutable sandbox, which blocks attribute escapes, plus limits on the two
    operators that let a hostile template ask for gigabytes or minutes in one expression."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator: str, left: object, right: object) -> object:  # type: ignore[no-untyped-def]
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * n > MAX_PRODUCT:
                    raise SecurityError(f"the template repeats a sequence {n} times")
        if operator == "**" and isinstance(right, int) and abs(right) > MAX_EXPONENT:
            raise SecurityError(f"the template raises a number to the power {right}")
        return super().call_binop(context, operator, left, right)


@lru_cache(maxsize=8)
def _compile(source: str) -> jinja2.Template:
    env = _Sandbox(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = _raise
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    env.filters["tojson"] = _tojson
    try:
        return env.from_string(source)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"the model's chat template is invalid (line {e.lineno}: {e.message})") from e


def render_chat(
    template: str | None,
    messages: list[Message],
    *,
    add_generation_prompt: bool = True,
    bos_token: str = "",
    eos_token: str = "",
    tools: list[dict] | None = None,
    variables: dict[str, object] | None = None,
) -> str:
    """The prompt text for a conversation, exactly as the model was trained to see it
    (`tools`: OpenAI's tool list, for templates that render tools themselves; `variables`:
    more of the template's own, a reasoning model's `enable_thinking` or `reasoning_effort`)."""
    compiled = _compile(template or CHATML)
    tracing = sys.gettrace() is None  # a debugger's or coverage's tracer stays; ours would replace it
    if tracing:
        sys.settrace(_Deadline(RENDER_SECONDS).on_call)
    try:
        return compiled.render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=bos_token,
            eos_token=eos_token,
            tools=tools,
            **(variables or {}),
        )
    except Exception as e:  # the template is code from a downloaded file: whatever it raises is its failure, not ours
        raise TemplateError(f"the model's chat template failed to render: {type(e).__name__ + ': ' if not isinstance(e, jinja2.TemplateError) else ''}{e}") from e
    finally:
        if tracing:
            sys.settrace(None)
