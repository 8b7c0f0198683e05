"""An image attached to a chat message: its file's bytes, checked as `run --image` checks
them, with the name and size the transcript shows. The bytes, not the path, are what a chat
keeps: a saved chat must replay what the model saw after the file has moved or changed."""

from __future__ import annotations

import base64
import hashlib
import os
import shlex
from dataclasses import dataclass
from pathlib import Path

from localinfer.images import image_size, read_image


@dataclass(frozen=True)
class Attachment:
    name: str  # the file's name when attached
    format: str  # PNG, JPEG, WebP, GIF or BMP
    width: int
    height: int
    data: bytes

    @classmethod
    def from_file(cls, path: Path) -> Attachment:
        """The image at `path`; a UserError in one line for anything that is not one."""
        data = read_image(path)
        kind, width, height = image_size(data)
        return cls(path.name, kind, width, height, data)

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.data).hexdigest()

    def describe(self) -> str:
        """The transcript's line for it: name, pixels, format and size."""
        size = len(self.data)
        shown = f"{size / 1e6:.1f} MB" if size >= 1e6 else f"{max(1, round(size / 1e3))} kB"
        return f"{self.name} · {self.width}×{self.height} {self.format} · {shown}"


def typed_path(text: str) -> Path:
    """A path as a person types or drops it into a terminal: quoted ('/a b.png', as GNOME's
    terminal pastes a dropped file), with escaped spaces (/a\\ b.png, as macOS's do), or bare
    (/a b.png), ~ expanded."""
    if os.name == "nt":  # a backslash there is the path's own
        return Path(text.strip().strip('"')).expanduser()
    try:
        words = shlex.split(text)
    except ValueError:  # an unbalanced quote: the text as typed
        words = []
    return Path(words[0] if len(words) == 1 else text).expanduser()


def data_url(image: bytes) -> str:
    """An image file's bytes as an OpenAI image_url part carries them."""
    kind = image_size(image)[0]
    return f"data:image/{kind.lower()};base64,{base64.b64encode(image).decode('ascii')}"
