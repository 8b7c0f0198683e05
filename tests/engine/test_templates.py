"""Chat templates: our sandboxed Jinja rendering of the model's own template agrees with
what llama.cpp renders for the same messages."""

import ctypes
import sys

import llama_cpp
import pytest

from localinfer.engine.templates import render_chat
from localinfer.errors import TemplateError

CONVERSATIONS = [
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Hi!"}],
    [
        {"role": "system", "content": "Answer in French."},
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "Quatre."},
        {"role": "user", "content": "Et 3+3, café ☕ 日本?"},
    ],
]


def llama_cpp_render(template: str, messages: list[dict[str, str]]) -> str:
    """llama.cpp's own renderer (llama_chat_apply_template), the reference."""
    chat = (llama_cpp.llama_chat_message * len(messages))(
        *[llama_cpp.llama_chat_message(m["role"].encode(), m["content"].encode()) for m in messages]
    )
    buf = ctypes.create_string_buffer(8192)
    n = llama_cpp.llama_chat_apply_template(template.encode(), chat, len(messages), True, buf, len(buf))
    assert n > 0, "llama.cpp did not recognise the template"
    return buf.raw[:n].decode()


@pytest.mark.parametrize("messages", CONVERSATIONS)
def test_render_matches_llama_cpp(backend, messages) -> None:
    template = backend.facts.chat_template
    assert template, "the embedded model ships a chat template"
    ours = render_chat(template, messages, bos_token=backend.vocab.bos_text, eos_token=backend.vocab.eos_text)
    assert ours == llama_cpp_render(template, messages)


def test_failing_template_gives_a_clear_error() -> None:
    with pytest.raises(TemplateError, match="failed to render: roles must alternate"):
        render_chat("{{ raise_exception('roles must alternate') }}", [{"role": "user", "content": "x"}])


def test_template_syntax_error_is_reported() -> None:
    with pytest.raises(TemplateError, match="invalid"):
        render_chat("{% for %}", [])


@pytest.mark.parametrize(
    "hostile",
    [
        "{{ messages.__class__.__mro__[1].__subclasses__() }}",  # the classic escape to every class
        "{{ cycler.__init__.__globals__.os.popen('id').read() }}",  # a shell through a helper's globals
        "{% for i in range(10**9) %}x{% endfor %}",  # the sandbox's OverflowError was a traceback
        "{{ 'x' * 10**10 }}",  # ten gigabytes in one expression
        "{{ ['x'] * 10**9 }}",
        "{{ 10 ** (10 ** 8) }}",  # minutes of big-integer arithmetic
        "{{ 1 / 0 }}",
    ],
)
def test_a_hostile_template_fails_cleanly(hostile: str) -> None:
    with pytest.raises(TemplateError) as e:
        render_chat(hostile, [{"role": "user", "content": "hi"}])
    assert "\n" not in str(e.value)
    assert render_chat("{{ 'ab' * 3 }}{{ 2 ** 10 }}", []) == "ababab1024"  # ordinary arithmetic still works


def test_a_template_that_would_loop_for_hours_is_stopped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nested loops over a user's long message: 10^15 steps, each small; the render ends at its deadline."""
    import localinfer.engine.templates as templates

    if sys.gettrace() is not None:
        pytest.skip("a tracer (debugger, coverage) is active; the deadline stands aside for it")
    monkeypatch.setattr(templates, "RENDER_SECONDS", 0.3)
    loops = "{% for a in messages[0].content %}{% for b in messages[0].content %}{% for c in messages[0].content %}{% endfor %}{% endfor %}{% endfor %}"
    with pytest.raises(TemplateError, match="ran for over 0.3 s"):
        render_chat(loops, [{"role": "user", "content": "x" * 100_000}])
    recursion = "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}"
    with pytest.raises(TemplateError, match="RecursionError"):
        render_chat(recursion, [])
    assert sys.gettrace() is None  # the tracer is gone after a render
    assert render_chat(loops, [{"role": "user", "content": "xyz"}]) == ""
