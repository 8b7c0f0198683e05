"""Saved chats in SQLite: the chat app's only storage, and the only place it writes SQL.

Why these choices:
- WAL mode, so a second window (or `chat --list` while the app runs) reads while the first
  writes, and a crash mid-write leaves the last committed state.
- Every change is one transaction; a reply is written once, when it ends (or is stopped),
  so a crash or Ctrl-C mid-reply loses that reply and nothing else.
- The schema's version is `PRAGMA user_version`; MIGRATIONS[n] takes version n to n + 1 in
  one transaction, so a later release changes the schema without losing anyone's chats.
- A message's images are kept as their files' bytes (tui/attachments.py says why), in
  their own table, so listing and searching chats never reads them.
- Regenerate and edit never delete: the message they replace stays, marked inactive, at
  the same position, so earlier replies remain reachable (`alternatives`).
"""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path

from localinfer.errors import UserError
from localinfer.paths import data_dir, ensure_dir
from localinfer.tui.attachments import Attachment

# MIGRATIONS[n] takes a database at user_version n to n + 1.
MIGRATIONS = [
    """
    CREATE TABLE chats (
        id INTEGER PRIMARY KEY,
        title TEXT NOT NULL,
        model TEXT,               -- the model reference the chat talks to
        url TEXT,                 -- an OpenAI-compatible endpoint, or NULL: in-process
        created REAL NOT NULL,
        updated REAL NOT NULL
    );
    CREATE TABLE messages (
        id INTEGER PRIMARY KEY,
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        position INTEGER NOT NULL,  -- its place in the conversation; alternatives share one
        active INTEGER NOT NULL DEFAULT 1,  -- 1 shown, 0 an earlier version (regenerate), -1 left behind by an edit
        role TEXT NOT NULL,
        content TEXT NOT NULL,
        created REAL NOT NULL,
        model TEXT,
        engine TEXT,
        ttft_ms REAL,
        tokens_per_s REAL,
        tokens INTEGER,           -- tokens generated
        prompt_tokens INTEGER,    -- context used by the prompt it answered
        n_ctx INTEGER,            -- the context size it ran in
        kv_cells INTEGER,         -- KV-cache cells in use when it ended
        kv_cells_total INTEGER,
        finish_reason TEXT        -- stop, length, abort (stopped by the user), error
    );
    CREATE INDEX messages_by_chat ON messages(chat_id, position);
    CREATE TABLE settings (
        chat_id INTEGER NOT NULL REFERENCES chats(id) ON DELETE CASCADE,
        key TEXT NOT NULL,
        value TEXT NOT NULL,      -- JSON
        PRIMARY KEY (chat_id, key)
    );
    """,
    """
    ALTER TABLE messages ADD COLUMN reasoning TEXT;           -- a reasoning model's thinking, apart from its answer
    ALTER TABLE messages ADD COLUMN reasoning_tokens INTEGER;
    ALTER TABLE messages ADD COLUMN reasoning_ms REAL;        -- how long it thought
    """,
    """
    CREATE TABLE images (
        id INTEGER PRIMARY KEY,
        message_id INTEGER NOT NULL REFERENCES messages(id) ON DELETE CASCADE,
        name TEXT NOT NULL,       -- the file's name when attached
        format TEXT NOT NULL,
        width INTEGER NOT NULL,
        height INTEGER NOT NULL,
        data BLOB NOT NULL        -- the file's bytes
    );
    CREATE INDEX images_by_message ON images(message_id, id);
    """,
]
SCHEMA_VERSION = len(MIGRATIONS)


def database_path() -> Path:
    return data_dir() / "chats.db"


@dataclass
class Chat:
    id: int
    title: str
    model: str | None
    url: str | None
    created: float
    updated: float


@dataclass
class ChatMessage:
    id: int
    chat_id: int
    position: int
    active: int
    role: str
    content: str
    created: float
    model: str | None = None
    engine: str | None = None
    ttft_ms: float | None = None
    tokens_per_s: float | None = None
    tokens: int | None = None
    prompt_tokens: int | None = None
    n_ctx: int | None = None
    kv_cells: int | None = None
    kv_cells_total: int | None = None
    finish_reason: str | None = None
    reasoning: str | None = None
    reasoning_tokens: int | None = None
    reasoning_ms: float | None = None


FIGURES = tuple(f.name for f in fields(ChatMessage))[7:]  # what a reply stores beside its text


class ChatStore:
    def __init__(self, connection: sqlite3.Connection, path: Path) -> None:
        self.db = connection
        self.path = path

    @classmethod
    def open(cls, path: Path | None = None) -> ChatStore:
        """The database at `path` (default: chats.db in the data folder), created or migrated.
        A corrupt, locked or too-new database is a UserError, and is left as it was."""
        path = path or database_path()
        if not path.exists():
            ensure_dir(path.parent)
        try:
            db = sqlite3.connect(path, timeout=2.0, isolation_level=None, check_same_thread=False)
        except sqlite3.Error as e:
            raise UserError(f"cannot open the chat database {path}: {e}") from None
        try:
            # Read before any write: a file that is not a database, or a damaged one, fails
            # here and is never touched (a journal-mode change would write to it).
            if db.execute("PRAGMA quick_check").fetchone()[0] != "ok":
                raise sqlite3.DatabaseError("the integrity check failed")
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise UserError(f"the chat database {path} was written by a newer localinfer (schema {version}, this one knows {SCHEMA_VERSION}); upgrade localinfer")
            db.execute("PRAGMA journal_mode=WAL")
            db.execute("PRAGMA foreign_keys=ON")
            for n in range(version, SCHEMA_VERSION):
                db.executescript(f"BEGIN; {MIGRATIONS[n]}; PRAGMA user_version = {n + 1}; COMMIT;")
        except sqlite3.OperationalError as e:
            db.close()
            if "locked" in str(e) or "busy" in str(e):
                raise UserError(f"the chat database {path} is locked by another program; close it and try again") from None
            raise UserError(f"cannot use the chat database {path}: {e}") from None
        except sqlite3.DatabaseError as e:
            db.close()
            raise UserError(f"the chat database {path} is damaged ({e}); move it aside to start with no chats") from None
        except BaseException:
            db.close()
            raise
        return cls(db, path)

    def close(self) -> None:
        self.db.close()

    @contextmanager
    def _transaction(self) -> Iterator[sqlite3.Connection]:
        """All or nothing: a crash or an error inside leaves the database as it was."""
        self.db.execute("BEGIN IMMEDIATE")
        try:
            yield self.db
        except BaseException:
            self.db.execute("ROLLBACK")
            raise
        self.db.execute("COMMIT")

    def _tx(self, sql: str, args: tuple = ()) -> sqlite3.Cursor:
        with self._transaction() as db:
            return db.execute(sql, args)

    # --- chats -------------------------------------------------------------------------
    def new_chat(self, title: str = "New chat", model: str | None = None, url: str | None = None, now: float | None = None) -> Chat:
        now = time.time() if now is None else now
        cur = self._tx("INSERT INTO chats (title, model, url, created, updated) VALUES (?, ?, ?, ?, ?)", (title, model, url, now, now))
        return self.chat(cur.lastrowid)

    def chat(self, chat_id: int) -> Chat:
        row = self.db.execute("SELECT id, title, model, url, created, updated FROM chats WHERE id = ?", (chat_id,)).fetchone()
        if row is None:
            raise UserError(f"there is no chat {chat_id} (see 'localinfer chat --list')")
        return Chat(*row)

    def chats(self, search: str = "") -> list[Chat]:
        """Newest first; `search` matches the title or any message's text, case-insensitively."""
        sql = "SELECT id, title, model, url, created, updated FROM chats"
        args: tuple = ()
        if search:
            pattern = "%" + search.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
            sql += " WHERE title LIKE ? ESCAPE '\\' OR id IN (SELECT chat_id FROM messages WHERE content LIKE ? ESCAPE '\\')"
            args = (pattern, pattern)
        return [Chat(*row) for row in self.db.execute(sql + " ORDER BY updated DESC, id DESC", args)]

    def message_counts(self) -> dict[int, int]:
        """Each chat's number of messages as it stands, in one query (chats with none are absent)."""
        return dict(self.db.execute("SELECT chat_id, COUNT(*) FROM messages WHERE active = 1 GROUP BY chat_id"))

    def rename(self, chat_id: int, title: str) -> None:
        self._tx("UPDATE chats SET title = ? WHERE id = ?", (title, chat_id))

    def set_model(self, chat_id: int, model: str | None, url: str | None) -> None:
        self._tx("UPDATE chats SET model = ?, url = ? WHERE id = ?", (model, url, chat_id))

    def delete(self, chat_id: int) -> None:
        self._tx("DELETE FROM chats WHERE id = ?", (chat_id,))

    # --- messages ----------------------------------------------------------------------
    def messages(self, chat_id: int) -> list[ChatMessage]:
        """The conversation as it stands: the active message at each position."""
        return self._messages("WHERE chat_id = ? AND active = 1 ORDER BY position", (chat_id,))

    def alternatives(self, chat_id: int, position: int) -> list[ChatMessage]:
        """The versions of the message at `position` (a reply and its regenerations), oldest
        first; not what an edit of an earlier message left behind, which answered another question."""
        return self._messages("WHERE chat_id = ? AND position = ? AND active >= 0 ORDER BY id", (chat_id, position))

    def _messages(self, where: str, args: tuple) -> list[ChatMessage]:
        names = ", ".join(f.name for f in fields(ChatMessage))
        return [ChatMessage(*row) for row in self.db.execute(f"SELECT {names} FROM messages {where}", args)]

    def images(self, chat_id: int) -> dict[int, list[Attachment]]:
        """The images of the chat's messages, by message id, in the order they were attached."""
        found: dict[int, list[Attachment]] = {}
        rows = self.db.execute(
            "SELECT message_id, name, format, width, height, data FROM images WHERE message_id IN (SELECT id FROM messages WHERE chat_id = ?) ORDER BY id",
            (chat_id,),
        )
        for message_id, *image in rows:
            found.setdefault(message_id, []).append(Attachment(*image))
        return found

    def add(self, chat_id: int, role: str, content: str, position: int | None = None, now: float | None = None,
            images: tuple[Attachment, ...] = (), **figures: object) -> ChatMessage:  # fmt: skip
        """Append a message (with its `images`), or put it at `position`: a reply there becomes an
        earlier version of this one (regenerate); a message of the user's leaves everything from
        there behind (edit)."""
        unknown = set(figures) - set(FIGURES)
        if unknown:
            raise TypeError(f"unknown message fields: {sorted(unknown)}")
        now = time.time() if now is None else now
        with self._transaction():
            if position is None:
                position = self.db.execute("SELECT COALESCE(MAX(position) + 1, 0) FROM messages WHERE chat_id = ? AND active = 1", (chat_id,)).fetchone()[0]
            else:
                behind = position + 1 if role == "assistant" else position
                if role == "assistant":
                    self.db.execute("UPDATE messages SET active = 0 WHERE chat_id = ? AND position = ? AND active = 1", (chat_id, position))
                self.db.execute("UPDATE messages SET active = -1 WHERE chat_id = ? AND position >= ? AND active >= 0", (chat_id, behind))
            names = ", ".join(("chat_id", "position", "role", "content", "created", *figures))
            marks = ", ".join("?" * (5 + len(figures)))
            cur = self.db.execute(f"INSERT INTO messages ({names}) VALUES ({marks})", (chat_id, position, role, content, now, *figures.values()))
            self.db.executemany(
                "INSERT INTO images (message_id, name, format, width, height, data) VALUES (?, ?, ?, ?, ?, ?)",
                [(cur.lastrowid, a.name, a.format, a.width, a.height, a.data) for a in images],
            )
            self.db.execute("UPDATE chats SET updated = ? WHERE id = ?", (now, chat_id))
        return self._messages("WHERE id = ?", (cur.lastrowid,))[0]

    def activate(self, message_id: int) -> None:
        """Show this alternative at its position instead of the one shown now."""
        with self._transaction():
            chat_id, position = self.db.execute("SELECT chat_id, position FROM messages WHERE id = ?", (message_id,)).fetchone()
            self.db.execute("UPDATE messages SET active = (id = ?) WHERE chat_id = ? AND position = ? AND active >= 0", (message_id, chat_id, position))

    # --- settings ----------------------------------------------------------------------
    def settings(self, chat_id: int) -> dict[str, object]:
        return {k: json.loads(v) for k, v in self.db.execute("SELECT key, value FROM settings WHERE chat_id = ?", (chat_id,))}

    def save_settings(self, chat_id: int, values: dict[str, object]) -> None:
        """Replace the chat's settings with `values` (a None value is not stored: the default applies)."""
        with self._transaction():
            self.db.execute("DELETE FROM settings WHERE chat_id = ?", (chat_id,))
            self.db.executemany(
                "INSERT INTO settings (chat_id, key, value) VALUES (?, ?, ?)",
                [(chat_id, k, json.dumps(v)) for k, v in values.items() if v is not None],
            )
