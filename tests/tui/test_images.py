"""Images in the chat app (issue 50): attached by path (/image PATH, or Ctrl+O), shown in the
transcript as a line with their name and size, saved with the chat as their bytes, exported,
resent by regenerate and edit, and read by the model: the reply starts from llama.cpp's own
logits after the image (tests/vision_models.py, in the same test), in-process and through a
real `localinfer serve` (--url). A bad file, or an image for a model that reads none, is a
notification, and nothing is attached."""

from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest

from localinfer.backends.base import MEDIA_MARKER
from localinfer.cli.chat import model_loader
from localinfer.engine.loader import LoadOptions
from localinfer.tui.app import ChatApp
from localinfer.tui.attachments import Attachment
from localinfer.tui.export import as_json, as_markdown
from localinfer.tui.store import Chat, ChatStore
from localinfer.tui.widgets import MessageView, PromptInput

from ..conftest import THREADS
from ..server.test_serve import Server
from ..server.test_vision_api import llamacpps_first_token
from ..vision_models import png_bytes, sample_image, write_pair
from .test_app import SIZE, ready, run, send, until

QUESTION = "What is in this picture?"
ONE_TOKEN = {"temperature": 0.0, "max_tokens": 1}


@pytest.fixture(scope="module")
def llava(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return write_pair(tmp_path_factory.mktemp("chat-vision"), "llava")


def picture(folder: Path, seed: int, name: str = "picture.png"):
    image = sample_image(60, 80, seed=seed)
    path = folder / name
    path.write_bytes(png_bytes(image))
    return image, path


def one_token_chat(folder: Path, model: str, url: str | None = None) -> tuple[ChatStore, Chat]:
    """A store with one greedy chat on `model` whose replies are one token long."""
    store = ChatStore.open(folder / "chats.db")
    chat = store.new_chat("Vision", model, url)
    store.save_settings(chat.id, ONE_TOKEN)
    return store, chat


def vision_app(store: ChatStore, model: Path, **kw) -> ChatApp:
    return ChatApp(store, model_loader(LoadOptions(threads=THREADS, ctx=512)), model=str(model), **kw)


async def command(pilot, app: ChatApp, text: str) -> None:
    prompt = app.query_one(PromptInput)
    prompt.focus()
    prompt.text = text
    await pilot.press("enter")
    await pilot.pause()


def test_an_attached_image_is_shown_saved_and_read_by_the_model(tmp_path: Path, llava: tuple[Path, Path]) -> None:
    image, path = picture(tmp_path, seed=31)
    store, chat = one_token_chat(tmp_path, str(llava[0]))

    async def test() -> None:
        app = vision_app(store, llava[0], chat_id=chat.id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            await command(pilot, app, f"/image {path}")
            assert [a.name for a in app.attached] == ["picture.png"]
            assert "picture.png · 80×60 PNG" in str(app.query_one("#mode").render())
            await send(pilot, app, QUESTION)
            assert app.attached == [] and str(app.query_one("#mode").render()).strip() == ""
            user = list(app.query(MessageView))[0]
            assert [str(label.render()) for label in user.query(".attachment")] == [f"Image: {Attachment.from_file(path).describe()}"]

    run(test)
    user, reply = store.messages(chat.id)
    assert [a.data for a in store.images(chat.id)[user.id]] == [path.read_bytes()]
    assert reply.content == llamacpps_first_token(llava, MEDIA_MARKER + "\n" + QUESTION, image)

    async def again() -> None:  # restarted: the transcript shows the image, and regenerate resends it
        app = vision_app(store, llava[0], chat_id=chat.id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            assert len(list(app.query(MessageView))[0].query(".attachment")) == 1
            await pilot.press("ctrl+r")
            await until(pilot, lambda: len(store.alternatives(chat.id, reply.position)) == 2)
            await until(pilot, ready(app))

    run(again)
    assert store.messages(chat.id)[-1].content == reply.content


def test_edit_resends_a_messages_images_unless_dropped(tmp_path: Path, llava: tuple[Path, Path]) -> None:
    image, path = picture(tmp_path, seed=32)
    store, chat = one_token_chat(tmp_path, str(llava[0]))

    async def test() -> None:
        app = vision_app(store, llava[0], chat_id=chat.id)
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            await command(pilot, app, f"/image {path}")
            await send(pilot, app, "Describe it.")
            list(app.query(MessageView))[0].focus()
            await pilot.press("ctrl+t")
            assert [a.name for a in app.attached] == ["picture.png"]  # the edit starts with the message's image
            app.query_one(PromptInput).text = QUESTION
            await pilot.press("enter")
            await until(pilot, lambda: store.messages(chat.id)[0].content == QUESTION)
            await until(pilot, ready(app))
            list(app.query(MessageView))[0].focus()
            await pilot.press("ctrl+t")
            await command(pilot, app, "/image none")
            assert app.attached == []
            await pilot.press("escape")  # the edit is cancelled: nothing attached either

    run(test)
    user, reply = store.messages(chat.id)
    assert user.content == QUESTION and len(store.images(chat.id)[user.id]) == 1
    assert reply.content == llamacpps_first_token(llava, MEDIA_MARKER + "\n" + QUESTION, image)


def test_bad_files_and_text_models_are_notifications_and_nothing_is_attached(tmp_path: Path, llava: tuple[Path, Path]) -> None:
    _, good = picture(tmp_path, seed=33)
    cut = tmp_path / "cut.png"
    cut.write_bytes(good.read_bytes()[:60])  # its header whole, its pixels cut: only a decoder finds out
    bomb = tmp_path / "bomb.png"
    bomb.write_bytes(good.read_bytes()[:16] + (30000).to_bytes(4, "big") * 2 + good.read_bytes()[24:])
    store = ChatStore.open(tmp_path / "chats.db")

    async def attempts(app: ChatApp, paths: list[Path]) -> list[str]:
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            for path in paths:
                await command(pilot, app, f"/image {path}")
            await until(pilot, lambda: len(app._notifications) == len(paths))
            assert app.attached == [] and store.chats() == []
            return [note.message for note in app._notifications]

    notes: list[list[str]] = []
    run(lambda: _collect(notes, attempts(vision_app(store, llava[0]), [tmp_path / "missing.png", cut, bomb])))
    missing, damaged, huge = notes[0]
    assert "cannot read the image" in missing and "missing.png" in missing
    assert damaged.startswith("cut.png: ") and "could not be decoded" in damaged
    assert "30000 x 30000" in huge
    text_model = ChatApp(store, model_loader(LoadOptions(threads=THREADS, ctx=512)))  # the embedded default reads no images
    run(lambda: _collect(notes, attempts(text_model, [good])))
    assert "reads no images" in notes[1][0]


async def _collect(into: list, awaitable) -> None:
    into.append(await awaitable)


def test_the_url_mode_sends_images_to_a_real_localinfer_serve(tmp_path: Path, llava: tuple[Path, Path]) -> None:
    image, path = picture(tmp_path, seed=34)
    server = Server(str(llava[0]), "--allow-paths")
    try:
        store, chat = one_token_chat(tmp_path, str(llava[0]), server.url)

        async def test() -> None:
            app = ChatApp(store, model_loader(LoadOptions(threads=THREADS)), chat_id=chat.id)
            async with app.run_test(size=SIZE) as pilot:
                await until(pilot, ready(app))
                await command(pilot, app, f"/image {path}")
                await send(pilot, app, QUESTION)

        run(test)
        assert store.messages(chat.id)[-1].content == llamacpps_first_token(llava, MEDIA_MARKER + "\n" + QUESTION, image)
    finally:
        assert server.stop()[0] == 0


def test_an_export_names_each_image_in_markdown_and_carries_its_bytes_in_json(tmp_path: Path) -> None:
    _, path = picture(tmp_path, seed=35, name="whiteboard.png")
    attachment = Attachment.from_file(path)
    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.new_chat("Export", "tiny")
    message = store.add(chat.id, "user", QUESTION, images=(attachment,))
    store.add(chat.id, "assistant", "A whiteboard.", finish_reason="stop")
    markdown = as_markdown(store, chat.id)
    assert f"*Image: whiteboard.png · 80×60 PNG · {attachment.describe().split(' · ')[-1]}, sha256 {hashlib.sha256(path.read_bytes()).hexdigest()}*" in markdown
    [user, _] = json.loads(as_json(store, chat.id))["messages"]
    [saved] = user["images"]
    assert base64.b64decode(saved["data"]) == path.read_bytes()
    assert (saved["name"], saved["format"], saved["width"], saved["height"], saved["bytes"]) == ("whiteboard.png", "PNG", 80, 60, path.stat().st_size)
    store.delete(chat.id)  # the images go with their chat
    assert store.db.execute("SELECT COUNT(*) FROM images WHERE message_id = ?", (message.id,)).fetchone()[0] == 0


def test_a_path_typed_or_dropped_into_the_terminal_is_attached(tmp_path: Path, llava: tuple[Path, Path]) -> None:
    """A dropped file arrives quoted (GNOME's terminal) or with its spaces escaped (macOS's);
    a typed one may be bare, spaces and all: each attaches the same file."""
    folder = tmp_path / "my pictures"
    folder.mkdir()
    _, path = picture(folder, seed=36, name="photo 1.png")
    store = ChatStore.open(tmp_path / "chats.db")

    async def test() -> None:
        app = vision_app(store, llava[0])
        async with app.run_test(size=SIZE) as pilot:
            await until(pilot, ready(app))
            for typed in (f"'{path}'", str(path).replace(" ", "\\ "), str(path)):
                await command(pilot, app, f"/image {typed}")
            assert [a.name for a in app.attached] == ["photo 1.png"] * 3 and not app._notifications
            assert all(a.data == path.read_bytes() for a in app.attached)

    run(test)
