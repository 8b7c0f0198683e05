"""Pulled models on disk: one small JSON manifest per model, written only after the
file is complete and verified, so `list` never shows a half-downloaded model."""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path

from localinfer.errors import UserError
from localinfer.paths import ensure_dir, manifests_dir, write_atomic


@dataclass
class LocalModel:
    name: str  # the reference it was pulled as: "qwen2.5:0.5b", "owner/repo:Q4_K_M"
    path: str
    size: int
    sha256: str
    source: str  # "hf://owner/repo/file@revision" or "package://pkg/file"
    pulled_at: str
    verified: bool = True  # False: the hub published no sha256 to check a file (the projector's too) against
    projector: str | None = None  # a vision model's projector, pulled beside it (where the loader looks)
    projector_sha256: str | None = None

    @property
    def exists(self) -> bool:
        return Path(self.path).is_file()


def _manifest_path(name: str) -> Path:
    return manifests_dir() / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".json")


def save(model: LocalModel) -> None:
    path = _manifest_path(model.name)
    ensure_dir(path.parent)
    try:
        write_atomic(path, json.dumps(asdict(model), indent=2).encode())
    except OSError as e:
        raise UserError(f"cannot write {path}: {e.strerror or e}") from None


def _read(path: Path) -> LocalModel | None:
    """A manifest, or None for a damaged or foreign file (a hand edit, a disk that filled
    up): such a model is simply not there, a pull writes it anew, and `rm` removes it."""
    try:
        model = LocalModel(**json.loads(path.read_text(encoding="utf-8")))
    except (OSError, ValueError, TypeError):
        return None
    texts = (model.name, model.path, model.sha256, model.source, model.pulled_at)
    if not all(isinstance(t, str) for t in texts) or type(model.size) is not int or type(model.verified) is not bool:
        return None
    if not all(t is None or isinstance(t, str) for t in (model.projector, model.projector_sha256)):
        return None
    return model


def find(name: str) -> LocalModel | None:
    path = _manifest_path(name)
    return _read(path) if path.is_file() else None


def all_models() -> list[LocalModel]:
    folder = manifests_dir()
    if not folder.is_dir():
        return []
    return [m for path in sorted(folder.glob("*.json")) if (m := _read(path)) is not None]


def remove(name: str) -> bool:
    path = _manifest_path(name)
    if not path.exists():
        return False
    try:
        path.unlink()
    except OSError as e:
        raise UserError(f"cannot remove {path}: {e.strerror or e}") from None
    return True
