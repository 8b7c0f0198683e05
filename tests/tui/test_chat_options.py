"""`localinfer chat` takes the sampling options `run` takes: through the real command line
they become where a chat starts, the Settings screen (^s) shows and changes them, and they
reach the engine's requests. The app is driven by Textual's Pilot in place of a terminal."""

from __future__ import annotations

import asyncio
import io
import sys
from pathlib import Path

import pytest
from textual.widgets import Input, Label

from localinfer.cli.app import main
from localinfer.engine.engine import Engine
from localinfer.engine.types import SamplingParams
from localinfer.tui.app import ChatApp
from localinfer.tui.screens import SETTINGS, SettingsScreen
from localinfer.tui.store import ChatStore

from ..conftest import THREADS
from .test_app import SIZE, reference, send, until

OPTIONS = {"temperature": 0.0, "top_k": 3, "top_p": 0.9, "min_p": 0.1, "repeat_penalty": 1.1, "seed": 9, "max_tokens": 5}
ARGV = ["chat", "-t", str(THREADS), "-c", "1024", "--temp", "0", "--top-k", "3", "--top-p", "0.9", "--min-p", "0.1", "--repeat-penalty", "1.1", "-s", "9", "-n", "5"]


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_chat_options_are_where_a_chat_starts_and_settings_show_and_change_them(isolated_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    submitted: list[SamplingParams] = []
    original_submit = Engine.submit

    def submit(self, tokens, params=None, media=None):  # type: ignore[no-untyped-def]
        submitted.append(params)
        return original_submit(self, tokens, params, media)

    shown: dict[str, str] = {}

    refused: list[str] = []

    def drive(app: ChatApp) -> None:  # in place of ChatApp.run: the same app, under a Pilot
        async def test() -> None:
            async with app.run_test(size=SIZE) as pilot:
                await until(pilot, lambda: app.model is not None)
                await pilot.press("ctrl+s")
                await until(pilot, lambda: isinstance(app.screen, SettingsScreen), timeout=10)
                shown.update({name: app.screen.query_one(f"#{name}", Input).value for name in SETTINGS})
                await pilot.press("escape")
                await send(pilot, app, "Hi")
                await pilot.press("ctrl+s")  # change one in Settings: the rest stay the command line's
                await until(pilot, lambda: isinstance(app.screen, SettingsScreen), timeout=10)
                app.screen.query_one("#temperature", Input).value = "1e999"  # refused as the options refuse it
                await pilot.press("ctrl+s")
                await pilot.pause()
                refused.append(str(app.screen.query_one("#problem", Label).render()))
                app.screen.query_one("#temperature", Input).value = "0.0"
                app.screen.query_one("#max_tokens", Input).value = "3"
                await pilot.press("ctrl+s")
                await until(pilot, lambda: not isinstance(app.screen, SettingsScreen), timeout=10)
                await send(pilot, app, "Hi again")

        asyncio.run(test())

    monkeypatch.setattr(Engine, "submit", submit)
    monkeypatch.setattr(ChatApp, "run", drive)
    monkeypatch.setattr(sys, "stdin", Terminal())
    monkeypatch.setattr(sys, "stdout", Terminal())
    with pytest.raises(SystemExit) as done:
        main(ARGV)
    assert done.value.code == 0

    assert shown == {name: str(OPTIONS[name]) for name in SETTINGS}
    assert refused == ["temperature must be a finite number, not inf"]
    first, second = submitted
    assert {name: getattr(first, name) for name in OPTIONS} == OPTIONS
    assert {name: getattr(second, name) for name in OPTIONS} == {**OPTIONS, "max_tokens": 3}
    store = ChatStore.open(isolated_home / "chats.db")
    try:
        [chat] = store.chats()
        messages = store.messages(chat.id)
        assert store.settings(chat.id) == {**OPTIONS, "max_tokens": 3}  # the chat keeps them
    finally:
        store.close()
    expected = reference([{"role": "user", "content": "Hi"}], **OPTIONS)
    assert messages[1].content == expected.text and expected.completion_tokens == 5
