"""The chat store on a real SQLite file: schema versions, transactions, and what a damaged,
locked or too-new database does (a one-line error, and the file left as it was)."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from localinfer.errors import UserError
from localinfer.tui.store import MIGRATIONS, SCHEMA_VERSION, ChatStore, database_path


def test_a_new_database_has_the_schema_version_and_wal(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert store.db.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    store.close()


def test_the_default_place_is_under_localinfer_home(isolated_home: Path) -> None:
    assert database_path() == isolated_home / "chats.db"
    ChatStore.open().close()
    assert (isolated_home / "chats.db").is_file()


def test_chats_and_messages_survive_a_reopen(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    store = ChatStore.open(path)
    chat = store.new_chat("Sky", "smollm2:135m")
    store.add(chat.id, "user", "Why is the sky blue?")
    store.add(chat.id, "assistant", "Rayleigh scattering.", model="smollm2:135m", engine="llama.cpp", ttft_ms=12.5, tokens_per_s=99.0, tokens=4, prompt_tokens=30, n_ctx=4096, finish_reason="stop")
    store.save_settings(chat.id, {"temperature": 0.0, "system": "Be terse.", "seed": None})
    store.close()

    again = ChatStore.open(path)
    [saved] = again.chats()
    assert (saved.title, saved.model) == ("Sky", "smollm2:135m")
    user, reply = again.messages(saved.id)
    assert (user.role, user.content, user.position) == ("user", "Why is the sky blue?", 0)
    assert (reply.content, reply.ttft_ms, reply.tokens_per_s, reply.tokens, reply.prompt_tokens, reply.finish_reason) == ("Rayleigh scattering.", 12.5, 99.0, 4, 30, "stop")
    assert again.settings(saved.id) == {"temperature": 0.0, "system": "Be terse."}  # None means "the default": not stored


def test_newest_first_and_search_by_title_or_content(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    a = store.new_chat("Dragons", now=1.0)
    b = store.new_chat("Cooking", now=2.0)
    store.add(a.id, "user", "Tell me about 100% wyverns", now=3.0)  # a newer message moves its chat up
    assert [c.title for c in store.chats()] == ["Dragons", "Cooking"]
    assert [c.title for c in store.chats("cook")] == ["Cooking"]
    assert [c.title for c in store.chats("WYVERN")] == ["Dragons"]
    assert [c.title for c in store.chats("100%")] == ["Dragons"]
    assert store.chats("0%w") == []  # % and _ are literal, not wildcards
    assert store.chats("nothing like this") == []
    store.rename(b.id, "Baking")
    assert store.chat(b.id).title == "Baking"


def test_delete_removes_the_chat_its_messages_and_settings(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.new_chat("Gone")
    store.add(chat.id, "user", "hi")
    store.save_settings(chat.id, {"temperature": 0.5})
    store.delete(chat.id)
    assert store.chats() == []
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 0
    assert store.db.execute("SELECT COUNT(*) FROM settings").fetchone()[0] == 0
    with pytest.raises(UserError, match="no chat"):
        store.chat(chat.id)


def test_regenerate_and_edit_keep_what_they_replace(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.new_chat("Branches")
    store.add(chat.id, "user", "first question")
    first = store.add(chat.id, "assistant", "first answer")
    second = store.add(chat.id, "assistant", "second answer", position=first.position)  # regenerate
    assert [m.content for m in store.messages(chat.id)] == ["first question", "second answer"]
    assert [m.content for m in store.alternatives(chat.id, first.position)] == ["first answer", "second answer"]
    store.activate(first.id)
    assert [m.content for m in store.messages(chat.id)] == ["first question", "first answer"]

    store.add(chat.id, "user", "edited question", position=0)  # edit: the replies after it go
    assert [m.content for m in store.messages(chat.id)] == ["edited question"]
    assert store.db.execute("SELECT COUNT(*) FROM messages").fetchone()[0] == 4  # nothing deleted
    new = store.add(chat.id, "assistant", "answer to the edit")
    assert store.alternatives(chat.id, new.position) == [new]  # the old branch's replies answered another question


def test_a_failed_write_leaves_nothing_behind(tmp_path: Path) -> None:
    store = ChatStore.open(tmp_path / "chats.db")
    chat = store.new_chat("Atomic")
    store.add(chat.id, "user", "kept")
    with pytest.raises(sqlite3.IntegrityError):
        store.add(chat.id, "assistant", None)  # type: ignore[arg-type]  # content is NOT NULL
    assert [m.content for m in store.messages(chat.id)] == ["kept"]
    store.save_settings(chat.id, {"temperature": 0.5})
    with pytest.raises(TypeError):
        store.save_settings(chat.id, {"temperature": 0.1, "unsavable": object()})  # fails after the old rows went
    assert store.settings(chat.id) == {"temperature": 0.5}


def test_an_old_schema_is_migrated_in_place(tmp_path: Path) -> None:
    """A database at version 0 (as a first release would have left an empty one) is brought
    up to date, and a version we do not know yet is refused before anything is touched."""
    path = tmp_path / "chats.db"
    sqlite3.connect(path).close()
    store = ChatStore.open(path)
    assert store.db.execute("PRAGMA user_version").fetchone()[0] == len(MIGRATIONS)
    store.close()

    with sqlite3.connect(path) as db:
        db.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = path.read_bytes()
    with pytest.raises(UserError, match="newer localinfer"):
        ChatStore.open(path)
    assert path.read_bytes() == before


def test_a_damaged_database_is_refused_and_left_alone(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    path.write_bytes(b"this is not a database, but a user's precious file" * 100)
    before = path.read_bytes()
    with pytest.raises(UserError, match="damaged.*move it aside"):
        ChatStore.open(path)
    assert path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["chats.db"]  # no -wal or -shm files made


def test_a_locked_database_is_a_one_line_error(tmp_path: Path) -> None:
    path = tmp_path / "chats.db"
    ChatStore.open(path).close()
    holder = sqlite3.connect(path, isolation_level=None)
    holder.execute("PRAGMA locking_mode = EXCLUSIVE")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        with pytest.raises(UserError, match="locked by another program"):
            ChatStore.open(path)
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_two_stores_on_one_file_see_each_others_writes(tmp_path: Path) -> None:
    """Two windows open at once: WAL lets each read while the other writes."""
    path = tmp_path / "chats.db"
    one, two = ChatStore.open(path), ChatStore.open(path)
    chat = one.new_chat("Shared")
    two.add(chat.id, "user", "from the second window")
    assert [m.content for m in one.messages(chat.id)] == ["from the second window"]
    one.close()
    two.close()
