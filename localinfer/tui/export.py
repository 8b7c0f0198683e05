"""A saved chat as Markdown (to read) or JSON (to process), from the app or `chat --export`.
A message's images are a line each in Markdown (name, size and hash: the file stays one
readable text) and whole in JSON (base64), so the JSON is the chat entire."""

from __future__ import annotations

import base64
import json
from dataclasses import asdict
from datetime import datetime
from pathlib import Path

from localinfer.errors import UserError
from localinfer.paths import write_atomic
from localinfer.tui.attachments import Attachment
from localinfer.tui.store import ChatStore

ROLE_NAMES = {"system": "System", "user": "You", "assistant": "Assistant"}


def as_markdown(store: ChatStore, chat_id: int) -> str:
    chat = store.chat(chat_id)
    lines = [f"# {chat.title}", "", f"*{chat.model or 'default model'}{' at ' + chat.url if chat.url else ''}, {datetime.fromtimestamp(chat.created):%Y-%m-%d %H:%M}*", ""]
    system = store.settings(chat_id).get("system")
    if system:
        lines += ["## System", "", str(system), ""]
    images = store.images(chat_id)
    for m in store.messages(chat_id):
        note = " (stopped)" if m.finish_reason == "abort" else ""
        lines += [f"## {ROLE_NAMES.get(m.role, m.role)}{note}", ""]
        lines += [f"*Image: {a.describe()}, sha256 {a.sha256}*\n" for a in images.get(m.id, ())]
        if m.reasoning:
            lines += ["<details><summary>Thinking</summary>", "", m.reasoning.strip(), "", "</details>", ""]
        lines += [m.content, ""]
    return "\n".join(lines)


def as_json(store: ChatStore, chat_id: int) -> str:
    """The chat, its settings and its active messages with their figures."""
    chat = store.chat(chat_id)
    images = store.images(chat_id)
    messages = [
        {**{k: v for k, v in asdict(m).items() if k not in ("chat_id", "active")}, **({"images": [_image_json(a) for a in images[m.id]]} if m.id in images else {})}
        for m in store.messages(chat_id)
    ]
    return json.dumps({**asdict(chat), "settings": store.settings(chat_id), "messages": messages}, indent=2, ensure_ascii=False)


def _image_json(a: Attachment) -> dict[str, object]:
    return {"name": a.name, "format": a.format, "width": a.width, "height": a.height, "bytes": len(a.data), "sha256": a.sha256, "data": base64.b64encode(a.data).decode("ascii")}


def export_chat(store: ChatStore, chat_id: int, path: Path) -> str:
    """Write the chat to `path`: JSON for a .json name, else Markdown. The file appears whole
    or not at all. Returns the format written."""
    kind = "json" if path.suffix.lower() == ".json" else "markdown"
    text = as_json(store, chat_id) if kind == "json" else as_markdown(store, chat_id)
    if not path.parent.is_dir():  # a bare name's parent is "."
        raise UserError(f"cannot export to {path}: the folder {path.parent} does not exist")
    try:
        write_atomic(path, (text + "\n").encode("utf-8"))
    except OSError as e:
        raise UserError(f"cannot export to {path}: {e.strerror or e}") from None
    return kind
