"""The chat app driven by Textual's Pilot, on the real embedded model in-process (and on a
real `localinfer serve` for --url). Replies are checked against what the same greedy
request gives through the Engine itself."""

from __future__ import annotations

import asyncio
import gc
import json
import shutil
import socket
import threading
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import openai
import pytest
from textual.widgets import Input

from localinfer.cli.chat import model_loader
from localinfer.engine import stream as stream_module
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.engine.types import CompletionOutput
import localinfer.tui.app as app_module
from localinfer.tui.app import ChatApp
from localinfer.tui.screens import SettingsScreen
from localinfer.tui.store import ChatStore
from localinfer.tui.widgets import MessageView, PromptInput

from ..conftest import THREADS, read_gguf

SIZE = (120, 36)
OPTIONS = LoadOptions(threads=THREADS, ctx=1024)
GREEDY = {"temperature": 0.0, "max_tokens": 24}


@pytest.fixture(autouse=True)
def lasting_notifications(monkeypatch: pytest.MonkeyPatch) -> None:
    """Notifications stay until a test reads them: Textual's 5 s toast can expire before a
    slow machine has finished the reply that a test checks it after."""
    monkeypatch.setattr(ChatApp, "NOTIFICATION_TIMEOUT", 3600)


def run(test: Callable[[], Awaitable[None]]) -> None:
    asyncio.run(test())


async def until(pilot, condition: Callable[[], bool], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)


def ready(app: ChatApp) -> Callable[[], bool]:
    return lambda: app.model is not None and app.reply is None


async def send(pilot, app: ChatApp, text: str) -> None:
    await until(pilot, ready(app))
    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")
    await until(pilot, lambda: app.reply is not None or not prompt.text)
    await until(pilot, ready(app))
    await pilot.pause()


def new_app(store: ChatStore, **kw) -> ChatApp:
    return ChatApp(store, model_loader(OPTIONS), **kw)


def greedy_store(tmp_path: Path, settings: dict | None = None) -> tuple[ChatStore, int]:
    """A store whose one chat (not yet with messages) is greedy and short."""
    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.new_chat("Test chat", None)
    store.save_settings(chat.id, {**GREEDY, **(settings or {})})
    return store, chat.id


def reference(messages: list[dict], **params: object) -> CompletionOutput:
    """The same request through a fresh Engine: what the app must show."""
    engine = open_engine(None, OPTIONS)
    try:
        return engine.complete(engine.tokenize_prompt(engine.render_chat(messages)), engine.defaults.with_overrides(**{**GREEDY, **params}))
    finally:
        engine.close()


@pytest.fixture()
def finished(monkeypatch: pytest.MonkeyPatch) -> list[CompletionOutput]:
    """Every CompletionOutput an engine hands to a reader: the engine's own figures."""
    seen: list[CompletionOutput] = []
    original = stream_module.RequestStream.get

    def get(self, timeout=None):
        event = original(self, timeout)
        if isinstance(event, CompletionOutput):
            seen.append(event)
        return event

    monkeypatch.setattr(stream_module.RequestStream, "get", get)
    return seen


def test_a_reply_is_the_engines_greedy_answer_with_the_engines_figures(tmp_path: Path, finished: list[CompletionOutput]) -> None:
    store, chat_id = greedy_store(tmp_path)
    question = "Why is the sky blue?"

    async def test() -> None:
        app = new_app(store, chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, question)
            views = list(app.query(MessageView))
            assert [v.role for v in views] == ["user", "assistant"]
            status = str(app.query_one("#status").render())
            assert "smollm2:135m · native" in status and "TTFT" in status and "tok/s" in status and "ctx" in status and "KV" in status
            assert app.query_one("#status").tooltip == "native: it runs llama and every tensor type in this file"  # and why

    run(test)
    want = reference([{"role": "user", "content": question}])
    user, reply = store.messages(chat_id)
    assert user.content == question
    assert reply.content == want.text and reply.tokens == want.completion_tokens
    assert (reply.prompt_tokens, reply.n_ctx, reply.finish_reason, reply.model, reply.engine) == (want.prompt_tokens, 1024, "length", "smollm2:135m", "native")
    [engine_done] = [e for e in finished if e.text == reply.content]  # the app's request, as the engine ended it
    assert (reply.ttft_ms, reply.tokens_per_s) == (engine_done.timings.ttft_ms, engine_done.timings.tokens_per_s)
    assert reply.kv_cells_total == 1024 and reply.kv_cells == want.prompt_tokens + want.completion_tokens - 1  # the last token is sampled, never fed


def test_esc_stops_the_reply_keeps_it_and_frees_the_slot(tmp_path: Path) -> None:
    store, chat_id = greedy_store(tmp_path, {"max_tokens": 2000})

    async def test() -> None:
        app = new_app(store, chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            prompt = app.query_one(PromptInput)
            prompt.text = "Tell me a very long story about a dragon and a knight."
            # Sent as Enter sends it, without Pilot.press: press waits for the app to be idle,
            # which a streaming reply is not, so it could return only once the reply had ended.
            prompt.post_message(PromptInput.Submitted(prompt.text))
            await until(pilot, lambda: app.reply is not None and app.reply.figures.tokens >= 5)
            engine = app.model.engine
            assert engine.n_running == 1
            await pilot.press("escape")
            await until(pilot, ready(app))
            assert engine.n_running == 0 and engine.free_slots == 1
            view = list(app.query(MessageView))[-1]
            assert "stopped" in str(view.query_one(".title").render())

    run(test)
    reply = store.messages(chat_id)[-1]
    assert reply.role == "assistant" and reply.finish_reason == "abort"
    assert 5 <= reply.tokens < 2000 and reply.content


def test_regenerate_keeps_the_earlier_reply_reachable(tmp_path: Path) -> None:
    store, chat_id = greedy_store(tmp_path, {"temperature": 1.5, "seed": 7, "max_tokens": 12})

    async def test() -> None:
        app = new_app(store, chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "Name a colour.")
            first = store.messages(chat_id)[-1]
            store.save_settings(chat_id, {"temperature": 1.5, "seed": 8, "max_tokens": 12})
            await pilot.press("ctrl+r")
            await until(pilot, lambda: app.reply is not None or len(store.alternatives(chat_id, first.position)) == 2)
            await until(pilot, ready(app))
            second = store.messages(chat_id)[-1]
            assert second.id != first.id and second.position == first.position
            assert [m.id for m in store.alternatives(chat_id, first.position)] == [first.id, second.id]
            assert len(list(app.query(MessageView))) == 2
            assert "version 2 of 2" in str(list(app.query(MessageView))[-1].query_one(".title").render())
            await pilot.press("ctrl+b")  # back to the first
            await pilot.pause()
            assert store.messages(chat_id)[-1].id == first.id
            assert list(app.query(MessageView))[-1].message.content == first.content

    run(test)


def test_edit_resends_from_the_edited_message(tmp_path: Path) -> None:
    store, chat_id = greedy_store(tmp_path)

    async def test() -> None:
        app = new_app(store, chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "What is the capital of France?")
            await send(pilot, app, "And of Spain?")
            assert len(store.messages(chat_id)) == 4
            list(app.query(MessageView))[0].focus()  # the first question
            await pilot.press("ctrl+t")
            prompt = app.query_one(PromptInput)
            assert prompt.text == "What is the capital of France?"
            prompt.text = "What is the capital of Italy?"
            await pilot.press("enter")
            await until(pilot, lambda: app.reply is not None or len(store.messages(chat_id)) == 2)
            await until(pilot, ready(app))

    run(test)
    messages = store.messages(chat_id)
    assert [m.role for m in messages] == ["user", "assistant"]
    assert messages[0].content == "What is the capital of Italy?"
    assert messages[1].content == reference([{"role": "user", "content": "What is the capital of Italy?"}]).text


def test_rename_search_delete_and_export_in_the_app(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    keep = store.new_chat("About dragons", "smollm2:135m", now=1.0)
    store.add(keep.id, "user", "Tell me about wyverns", now=2.0)
    store.add(keep.id, "assistant", "Wyverns have two legs.", now=3.0, finish_reason="stop")
    gone = store.new_chat("Cooking", "smollm2:135m", now=4.0)

    async def test() -> None:
        app = new_app(store, chat_id=keep.id)
        async with app.run_test(size=SIZE) as pilot:
            await pilot.press("f2")
            await pilot.pause()
            app.screen.query_one("#answer").value = "Wyverns"
            await pilot.press("enter")
            await pilot.pause()
            assert store.chat(keep.id).title == "Wyverns"

            await pilot.press("f4")
            await pilot.pause()
            app.screen.query_one("#answer").value = str(tmp_path / "wyverns.json")
            await pilot.press("enter")
            await pilot.pause()

            await pilot.press("ctrl+f")
            await pilot.press(*"two legs")
            await pilot.pause()
            items = app.query_one("#chats").children
            assert [item.chat.title for item in items] == ["Wyverns"]
            app.query_one("#search").value = ""
            await pilot.pause()
            assert {item.chat.title for item in app.query_one("#chats").children} == {"Wyverns", "Cooking"}

            app.open_chat(store.chat(gone.id))
            await pilot.press("f8")
            await pilot.pause()
            await pilot.click("#yes")
            await pilot.pause()
            assert [c.title for c in store.chats()] == ["Wyverns"]
            assert app.chat is None  # back to a new, unsaved chat

    run(test)
    exported = json.loads((tmp_path / "wyverns.json").read_text())
    assert exported["title"] == "Wyverns"
    assert [m["content"] for m in exported["messages"]] == ["Tell me about wyverns", "Wyverns have two legs."]


def test_chats_survive_a_restart(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"

    async def first() -> None:
        store = ChatStore.open(path)
        app = new_app(store)
        async with app.run_test(size=SIZE) as pilot:
            app.pending_settings = dict(GREEDY)
            await send(pilot, app, "Hello there")
        store.close()

    async def second() -> None:
        store = ChatStore.open(path)
        app = new_app(store)
        async with app.run_test(size=SIZE) as pilot:
            [item] = app.query_one("#chats").children
            assert item.chat.title == "Hello there"
            app.query_one("#chats").focus()
            await pilot.press("down", "enter")
            await pilot.pause()
            assert [v.role for v in app.query(MessageView)] == ["user", "assistant"]
            assert list(app.query(MessageView))[0].message.content == "Hello there"
        store.close()

    run(first)
    run(second)


def test_a_model_that_fails_to_load_is_a_notification_and_the_app_stays_usable(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")

    async def test() -> None:
        app = new_app(store, model=str(tmp_path / "missing.gguf"))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: bool(app._notifications))
            [note] = list(app._notifications)
            assert note.severity == "error" and "missing.gguf" in note.message
            app.query_one(PromptInput).text = "Hello?"
            await pilot.press("enter")  # refused with a notification, nothing saved
            await pilot.pause()
            assert store.chats() == []
            await pilot.press("ctrl+s")  # the app still works: settings open and close
            await pilot.pause()
            assert type(app.screen).__name__ == "SettingsScreen"
            await pilot.press("escape")

    run(test)


def test_an_unreachable_url_is_a_notification(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed once the block ends: nothing listens there
    store = ChatStore.open(tmp_path / "chats.db")

    async def test() -> None:
        app = new_app(store, url=f"http://127.0.0.1:{port}")
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: bool(app._notifications))
            [note] = list(app._notifications)
            assert note.severity == "error" and f"cannot reach http://127.0.0.1:{port}" in note.message

    run(test)


def test_a_message_too_long_for_the_context_is_a_notification(tmp_path: Path) -> None:
    store, chat_id = greedy_store(tmp_path)

    async def test() -> None:
        app = ChatApp(store, model_loader(LoadOptions(threads=THREADS, ctx=64)), chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            app.query_one(PromptInput).text = "tell me " * 400
            await pilot.press("enter")
            await until(pilot, lambda: bool(app._notifications))
            assert any(f"context holds {app.model.n_ctx}" in n.message for n in app._notifications)
            assert app.reply is None

    run(test)


def test_a_long_conversation_drops_its_oldest_turns_and_says_so(tmp_path: Path) -> None:
    store, chat_id = greedy_store(tmp_path, {"system": "Be brief.", "max_tokens": 8})
    for i in range(6):
        store.add(chat_id, "user", f"Question {i}: " + "words " * 30)
        store.add(chat_id, "assistant", "An answer " * 10)

    async def test() -> None:
        app = ChatApp(store, model_loader(LoadOptions(threads=THREADS, ctx=256)), chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "And now?")
            assert any("oldest messages were left out" in n.message for n in app._notifications)

    run(test)
    reply = store.messages(chat_id)[-1]
    assert reply.role == "assistant" and reply.prompt_tokens + 8 <= 256


def test_the_url_mode_talks_to_a_real_localinfer_serve(tmp_path: Path) -> None:
    from ..server.test_serve import Server

    server = Server("--parallel", "1")
    try:
        store, chat_id = greedy_store(tmp_path)
        store.set_model(chat_id, "smollm2:135m", server.url)
        question = "Name three colours."

        async def test() -> None:
            app = new_app(store, chat_id=chat_id)
            async with app.run_test(size=SIZE) as pilot:
                await send(pilot, app, question)
                assert "smollm2:135m · remote" in str(app.query_one("#status").render())

        run(test)
        want = server.client().chat.completions.create(model="smollm2:135m", messages=[{"role": "user", "content": question}], temperature=0, max_tokens=24)
        reply = store.messages(chat_id)[-1]
        assert reply.content == want.choices[0].message.content
        assert (reply.tokens, reply.prompt_tokens, reply.finish_reason) == (want.usage.completion_tokens, want.usage.prompt_tokens, "length")
        assert store.chat(chat_id).url == server.url
    finally:
        assert server.stop()[0] == 0


def test_settings_open_and_save_with_no_model_downloaded(tmp_path: Path) -> None:
    """A fresh install has no downloaded models: the model picker is empty, not a crash."""
    store = ChatStore.open(tmp_path / "chats.db")

    async def test() -> None:
        app = new_app(store)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            await pilot.press("ctrl+s")
            await until(pilot, lambda: isinstance(app.screen, SettingsScreen), timeout=10)
            app.screen.query_one("#temperature", Input).value = "0.3"
            await pilot.press("ctrl+s")
            await until(pilot, lambda: not isinstance(app.screen, SettingsScreen), timeout=10)
            assert {k: v for k, v in app.pending_settings.items() if v is not None} == {"temperature": 0.3} and app.model_ref is None

    run(test)


def test_json_mode_makes_every_reply_a_json_object_locally_and_remotely(tmp_path: Path) -> None:
    """F9 turns the chat's JSON mode on; the in-process engine and a real `localinfer serve`
    (through response_format) then both answer with a JSON object."""
    from ..server.test_serve import Server

    store, chat_id = greedy_store(tmp_path, {"max_tokens": 120})
    question = "Describe a cat."

    async def test() -> None:
        app = new_app(store, chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            await pilot.press("f9")
            assert store.settings(chat_id)["json_mode"] is True
            await send(pilot, app, question)

    run(test)
    reply = store.messages(chat_id)[-1]
    assert reply.finish_reason == "stop" and isinstance(json.loads(reply.content), dict)
    server = Server("--parallel", "1")
    try:
        remote = store.new_chat("Remote", "smollm2:135m", server.url)
        store.save_settings(remote.id, {**GREEDY, "max_tokens": 120, "json_mode": True})

        async def test_remote() -> None:
            app = new_app(store, chat_id=remote.id)
            async with app.run_test(size=SIZE) as pilot:
                await send(pilot, app, question)

        run(test_remote)
        reply = store.messages(remote.id)[-1]
        assert reply.finish_reason == "stop" and isinstance(json.loads(reply.content), dict)
    finally:
        assert server.stop()[0] == 0


def test_a_long_remote_conversation_drops_its_oldest_turns_and_says_so(tmp_path: Path) -> None:
    """An endpoint does not say its context: the app trims when the server refuses (a real
    `localinfer serve` with a 256-token context), keeps the system prompt, and says so."""
    from ..server.test_serve import Server

    server = Server("--parallel", "1", "--ctx", "256")
    try:
        store, chat_id = greedy_store(tmp_path, {"system": "Be brief.", "max_tokens": 8})
        store.set_model(chat_id, "smollm2:135m", server.url)
        for i in range(6):
            store.add(chat_id, "user", f"Question {i}: " + "words " * 30)
            store.add(chat_id, "assistant", "An answer " * 10)
        client = server.client()
        whole = [{"role": "system", "content": "Be brief."}] + [{"role": m.role, "content": m.content} for m in store.messages(chat_id)]
        with pytest.raises(openai.BadRequestError):  # what the app meets first
            client.chat.completions.create(model="smollm2:135m", messages=whole + [{"role": "user", "content": "And now?"}], max_tokens=8)

        async def test() -> None:
            app = new_app(store, chat_id=chat_id)
            async with app.run_test(size=SIZE) as pilot:
                await send(pilot, app, "And now?")
                assert any("oldest messages were left out" in n.message for n in app._notifications)

        run(test)
        reply = store.messages(chat_id)[-1]
        assert reply.role == "assistant" and reply.finish_reason in ("length", "stop") and reply.content
        assert reply.prompt_tokens + 8 <= 256
    finally:
        assert server.stop()[0] == 0


def test_the_status_line_shows_the_cache_type_its_bytes_and_what_speculation_did(tmp_path: Path) -> None:
    """Issue 11's figures on the chat's status line: a q8_0 cache, and prompt lookup on a
    reply that copies from its prompt (so drafts are made)."""
    from localinfer.engine.speculative import DraftConfig

    store, chat_id = greedy_store(tmp_path, {"max_tokens": 40})
    code = "def add(a, b):\n    retrun a + b\n\ndef sub(a, b):\n    return a - b"

    async def test() -> None:
        load = LoadOptions(threads=THREADS, ctx=1024, cache=("q8_0", "q8_0"), draft=DraftConfig())
        app = ChatApp(store, model_loader(load), chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, f"Fix the typo in this code and show the whole code: {code}")
            f = app._last_figures
            assert f.cache_types == ("q8_0", "q8_0") and f.kv_bytes > 0 and f.drafted > 0
            status = str(app.query_one("#status").render())
            assert "q8_0/q8_0" in status and ("MB" in status or "kB" in status)
            assert f"draft lookup {f.accepted / f.drafted:.0%} ({f.tokens_per_forward:.2f} tok/fwd)" in status

    run(test)


def test_the_model_picker_switches_a_chat_to_a_model_that_loads(tmp_path: Path) -> None:
    """A chat whose model is gone: the load fails, the settings screen lists the downloaded
    models, and picking one saves it with the chat and loads it."""
    from textual.widgets import Select

    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.new_chat("Moved model", str(tmp_path / "deleted.gguf"))

    async def test() -> None:
        app = new_app(store, chat_id=chat.id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, lambda: bool(app._notifications))
            assert app.model is None
            await pilot.press("ctrl+s")
            await pilot.pause()
            picker = app.screen.query_one("#model", Select)
            assert "smollm2:135m" in [value for _, value in picker._options]
            picker.value = "smollm2:135m"
            await pilot.click("#save")
            await until(pilot, ready(app))
            assert app.model.name == "smollm2:135m"

    run(test)
    assert store.chat(chat.id).model == "smollm2:135m"


def test_keys_newlines_copy_and_the_command_palette(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.new_chat("Copy me", "smollm2:135m")
    store.add(chat.id, "user", "Hi")
    store.add(chat.id, "assistant", "Hello! **How** can I help?")

    async def test() -> None:
        app = new_app(store, chat_id=chat.id)
        async with app.run_test(size=SIZE) as pilot:
            prompt = app.query_one(PromptInput)
            prompt.focus()
            await pilot.press("a", "shift+enter", "b", "ctrl+j", "c")
            assert prompt.text == "a\nb\nc" and len(store.messages(chat.id)) == 2  # not sent
            await pilot.press("f3")
            assert app.clipboard == "Hello! **How** can I help?"
            titles = {command.title for command in app.get_system_commands(app.screen)}
            assert {title for title, _, _ in ChatApp.ACTIONS} <= titles
            assert {action for _, _, action in ChatApp.ACTIONS} == {b.action for b in ChatApp.BINDINGS}  # one binding per palette entry

    run(test)


@pytest.mark.parametrize("downloads", [True, False])
def test_the_palettes_screenshot_saves_a_file_with_or_without_a_downloads_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, downloads: bool) -> None:
    folder = tmp_path / "Downloads"
    if downloads:
        folder.mkdir()
    monkeypatch.setattr(app_module, "user_downloads_path", lambda: folder)
    monkeypatch.chdir(tmp_path)
    store = ChatStore.open(tmp_path / "chats.db")

    async def test() -> None:
        app = new_app(store)
        async with app.run_test(size=SIZE) as pilot:
            (screenshot,) = [c for c in app.get_system_commands(app.screen) if c.title == "Screenshot"]
            screenshot.callback()
            await until(pilot, lambda: any((folder if downloads else tmp_path).glob("*.svg")), timeout=20)

    run(test)
    (svg,) = (folder if downloads else tmp_path).glob("*.svg")
    assert svg.read_text().lstrip().startswith("<svg")


def test_a_model_given_by_path_is_named_by_its_gguf_name(tmp_path: Path, model_path: Path) -> None:
    """A file given by path is named on the status line and over its replies as it names
    itself (GGUF general.name, read here by gguf-py), not by the path, which says little."""
    copy = tmp_path / "renamed-copy.gguf"
    shutil.copyfile(model_path, copy)
    name = read_gguf(copy).fields["general.name"].contents()
    store = ChatStore.open(tmp_path / "chats.db")

    async def test() -> None:
        app = new_app(store, model=str(copy))
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            status = str(app.query_one("#status").render())
            assert status == f"{name} · native" and "renamed-copy" not in status
            app.pending_settings = dict(GREEDY)
            await send(pilot, app, "Hi")
            assert f"Assistant · {name}" in str(list(app.query(MessageView))[-1].query_one(".title").render())

    run(test)
    [chat] = store.chats()
    assert chat.model == str(copy)  # the chat still opens the file by its path


def test_the_model_loads_on_a_thread_that_ends_and_the_heap_is_frozen_after(tmp_path: Path) -> None:
    """The load's OpenMP team lives as long as the thread that started it: that thread must be
    gone before the engine decodes (else libgomp cuts every spin-wait of the engine's team).
    And the heap as loaded is frozen, so a full garbage collection mid-reply walks only what
    came after."""
    store, chat_id = greedy_store(tmp_path)
    loaded_on: list[threading.Thread] = []
    load = model_loader(OPTIONS)

    def loader(ref: str | None, url: str | None):
        loaded_on.append(threading.current_thread())
        return load(ref, url)

    async def test() -> None:
        app = ChatApp(store, loader, chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, "Hi")
            [thread] = loaded_on
            assert not thread.is_alive() and thread is not threading.main_thread()
            assert app.model.engine.n_running == 0 and gc.get_freeze_count() > 0

    try:
        run(test)
    finally:
        gc.unfreeze()  # the next tests' own objects are theirs to collect


def test_opening_a_chat_on_another_model_closes_the_one_loaded(tmp_path: Path, model_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    first = store.new_chat("By name", "smollm2:135m")
    second = store.new_chat("By path", str(model_path))

    async def test() -> None:
        app = new_app(store, chat_id=first.id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            engine = app.model.engine
            app.open_chat(store.chat(second.id))
            await until(pilot, ready(app))
            assert app.model.engine is not engine and engine._closed

    run(test)


def test_a_reasoning_models_thinking_is_a_collapsed_block_saved_and_exported(tmp_path: Path, r1_model_path: Path) -> None:
    """DeepSeek-R1's template opens a think block; 16 tokens end the reply inside it."""
    from textual.widgets import Collapsible

    from localinfer.tui.export import as_markdown

    store, chat_id = greedy_store(tmp_path, {"max_tokens": 16})
    store.set_model(chat_id, str(r1_model_path), None)
    question = "What is the capital of France?"

    async def test() -> None:
        app = new_app(store, chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, question)
            reply = list(app.query(MessageView))[-1]
            block = reply.query_one(Collapsible)
            assert block.collapsed and block.title.startswith("Thinking · ") and "16 tokens" in block.title
            await pilot.press("f5")
            assert not block.collapsed

    run(test)
    engine = open_engine(str(r1_model_path), OPTIONS)
    try:
        want = engine.complete(engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": question}])), engine.defaults.with_overrides(**{**GREEDY, "max_tokens": 16}))
    finally:
        engine.close()
    _, reply = store.messages(chat_id)
    assert want.reasoning and want.text == "" and want.reasoning_tokens == 16
    assert (reply.content, reply.reasoning, reply.reasoning_tokens, reply.finish_reason) == ("", want.reasoning, 16, "length")
    assert f"<details><summary>Thinking</summary>\n\n{want.reasoning.strip()}\n\n</details>" in as_markdown(store, chat_id)


def test_a_thinking_budget_closes_the_think_block_and_the_model_answers(tmp_path: Path, r1_model_path: Path) -> None:
    """`chat --think-budget 4`: the engine closes the think block after 4 tokens of thinking,
    as `run` does; the saved reply is what the engine gives for the same request."""
    store, chat_id = greedy_store(tmp_path, {"max_tokens": 24})
    store.set_model(chat_id, str(r1_model_path), None)
    question = "What is the capital of France?"

    async def test() -> None:
        app = ChatApp(store, model_loader(OPTIONS, think=True, think_budget=4), chat_id=chat_id)
        async with app.run_test(size=SIZE) as pilot:
            await send(pilot, app, question)

    run(test)
    engine = open_engine(str(r1_model_path), OPTIONS)
    try:
        params = engine.defaults.with_overrides(**{**GREEDY, "max_tokens": 24}, think_budget=4)
        want = engine.complete(engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": question}])), params)
    finally:
        engine.close()
    _, reply = store.messages(chat_id)
    assert want.reasoning and want.text and want.reasoning_tokens < 24
    assert (reply.reasoning, reply.content, reply.reasoning_tokens) == (want.reasoning, want.text, want.reasoning_tokens)
