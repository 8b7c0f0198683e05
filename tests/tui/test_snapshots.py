"""Snapshots (pytest-textual-snapshot) of what a user sees, with content that is the same on
every run: a chat loaded from the database, never a live stream. Update them with
`pytest tests/tui/test_snapshots.py --snapshot-update` and look at the SVGs before committing."""

from __future__ import annotations

from pathlib import Path

from localinfer.cli.chat import model_loader
from localinfer.engine.loader import LoadOptions
from localinfer.tui.app import ChatApp
from localinfer.tui.attachments import Attachment
from localinfer.tui.store import ChatStore

from ..conftest import THREADS

SIZE = (124, 32)
REPLY = """Rayleigh scattering: air molecules scatter short (blue) wavelengths far more than long ones.

```python
def scattering(wavelength_nm: float) -> float:
    return 1 / wavelength_nm**4
```"""


def saved_chat(tmp_path: Path) -> tuple[ChatStore, int]:
    store = ChatStore.open(tmp_path / "chats.db")
    store.new_chat("Cooking pasta", "smollm2:135m", now=1.0)
    chat = store.new_chat("Why is the sky blue?", "smollm2:135m", now=2.0)
    sky = Attachment("sky.jpg", "JPEG", 1600, 1200, bytes(231_400))  # the snapshot shows its line, never its pixels
    store.add(chat.id, "user", "Why is the sky blue?", now=3.0, images=(sky,))
    store.add(chat.id, "assistant", REPLY, now=4.0, model="smollm2:135m", engine="llama.cpp", ttft_ms=41.0, tokens_per_s=152.3, tokens=48, prompt_tokens=36, n_ctx=1024, kv_cells=83, kv_cells_total=1024, finish_reason="stop")
    store.save_settings(chat.id, {"temperature": 0.2, "system": "Answer like a physicist."})
    return store, chat.id


async def steady_cursors(pilot) -> None:
    """A blinking cursor is drawn or not by when the screenshot falls (on a slow machine, often
    off): with blinking stopped, a focused field always shows its cursor."""
    for field in pilot.app.screen.query("Input, TextArea"):
        field.cursor_blink = False
        field.notify_style_update()  # TextArea caches lines drawn without the cursor: redraw them
        field.refresh()
    await pilot.pause()


async def loaded(pilot) -> None:
    app = pilot.app
    while app.model is None:
        await pilot.pause(0.05)
    await steady_cursors(pilot)


def test_the_main_screen(snap_compare, tmp_path: Path) -> None:
    store, chat_id = saved_chat(tmp_path)
    app = ChatApp(store, model_loader(LoadOptions(threads=THREADS, ctx=1024)), chat_id=chat_id)
    assert snap_compare(app, terminal_size=SIZE, run_before=loaded)


def test_the_settings_screen(snap_compare, tmp_path: Path) -> None:
    store, chat_id = saved_chat(tmp_path)
    app = ChatApp(store, model_loader(LoadOptions(threads=THREADS, ctx=1024)), chat_id=chat_id)

    async def open_settings(pilot) -> None:
        await loaded(pilot)
        await pilot.press("ctrl+s")
        await steady_cursors(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=open_settings)


def test_an_error_notification(snap_compare, tmp_path: Path) -> None:
    store, _ = saved_chat(tmp_path)
    app = ChatApp(store, model_loader(LoadOptions(threads=THREADS)), model="/nonexistent/model.gguf")

    async def failed(pilot) -> None:
        while not pilot.app._notifications:
            await pilot.pause(0.05)
        await steady_cursors(pilot)

    assert snap_compare(app, terminal_size=SIZE, run_before=failed)
