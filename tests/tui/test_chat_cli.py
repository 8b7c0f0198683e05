"""`localinfer chat --list`, `--export` and the start-up errors, through the real command line."""

from __future__ import annotations

import json
from pathlib import Path

from localinfer.tui.store import ChatStore

from ..conftest import run_cli


def saved(home: Path) -> int:
    store = ChatStore.open(home / "chats.db")
    chat = store.new_chat("Sky colour", "smollm2:135m")
    store.add(chat.id, "user", "Why is the sky blue?")
    store.add(chat.id, "assistant", "Rayleigh scattering.", finish_reason="abort")
    store.save_settings(chat.id, {"system": "Be terse."})
    store.close()
    return chat.id


def test_list_with_no_chats_says_so() -> None:
    r = run_cli("chat", "--list")
    assert r.returncode == 0 and r.stdout == "" and "No saved chats" in r.stderr
    r = run_cli("chat", "--list", "--json")
    assert r.returncode == 0 and json.loads(r.stdout) == []


def test_list_prints_the_saved_chats(isolated_home: Path) -> None:
    chat_id = saved(isolated_home)
    [row] = json.loads(run_cli("chat", "--list", "--json").stdout)
    assert (row["id"], row["title"], row["model"], row["messages"]) == (chat_id, "Sky colour", "smollm2:135m", 2)
    table = run_cli("chat", "--list").stdout
    assert "Sky colour" in table and "smollm2:135m" in table


def test_export_writes_markdown_or_json(isolated_home: Path, tmp_path: Path) -> None:
    chat_id = saved(isolated_home)
    r = run_cli("chat", "--export", str(chat_id), str(tmp_path / "sky.md"))
    assert r.returncode == 0, r.stderr
    text = (tmp_path / "sky.md").read_text()
    assert text.startswith("# Sky colour\n")
    assert "## System\n\nBe terse." in text and "## You\n\nWhy is the sky blue?" in text and "## Assistant (stopped)\n\nRayleigh scattering." in text
    assert run_cli("chat", "--export", str(chat_id), str(tmp_path / "sky.json")).returncode == 0
    data = json.loads((tmp_path / "sky.json").read_text())
    assert data["settings"] == {"system": "Be terse."}
    assert [(m["role"], m["content"], m["finish_reason"]) for m in data["messages"]] == [("user", "Why is the sky blue?", None), ("assistant", "Rayleigh scattering.", "abort")]


def test_export_errors_are_one_line_and_leave_no_file(isolated_home: Path, tmp_path: Path) -> None:
    saved(isolated_home)
    r = run_cli("chat", "--export", "99", str(tmp_path / "x.md"))
    assert r.returncode == 1 and r.stderr.strip() == "error: there is no chat 99 (see 'localinfer chat --list')"
    r = run_cli("chat", "--export", "1", str(tmp_path / "no-such-folder" / "x.md"))
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "does not exist" in r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["home"]


def test_a_damaged_database_is_one_line_at_start_and_untouched(isolated_home: Path) -> None:
    isolated_home.mkdir(parents=True)
    db = isolated_home / "chats.db"
    db.write_bytes(b"\x00garbage" * 1000)
    for args in (["chat", "--list"], ["chat"]):
        r = run_cli(*args)
        assert r.returncode == 1 and r.stderr.count("\n") == 1 and r.stderr.startswith(f"error: the chat database {db} is damaged"), r.stderr
    assert db.read_bytes() == b"\x00garbage" * 1000 and sorted(p.name for p in isolated_home.iterdir()) == ["chats.db"]


def test_without_a_terminal_the_app_says_what_to_use_instead() -> None:
    r = run_cli("chat")
    assert r.returncode == 2 and "needs a terminal" in r.stderr and "Traceback" not in r.stderr
