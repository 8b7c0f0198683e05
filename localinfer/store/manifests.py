"""Pulled models on disk: one small JSON manifest per model, written only after the
file is complete and verified, so `list` never shows a half-downloaded model."""

from __future__ import annotations

import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from localinfer.errors import UserError
from localinfer.paths import ensure_dir, manifests_dir


@dataclass
class LocalModel:
    name: str  # the reference it was pulled as: "qwen2.5:0.5b", "owner/repo:Q4_K_M"
    path: str
    size: int
    sha256: str
    source: str  # "hf://owner/repo/file@revision" or "package://pkg/file"
    pulled_at: str
    verified: bool = True  # False: the hub published no sha256 to check the file against

    @property
    def exists(self) -> bool:
        return Path(self.path).is_file()


def _manifest_path(name: str) -> Path:
    return manifests_dir() / (re.sub(r"[^A-Za-z0-9._-]", "_", name) + ".json")


def write_atomic(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, then rename: readers see all or nothing."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def save(model: LocalModel) -> None:
    write_atomic(_manifest_path(model.name), json.dumps(asdict(model), indent=2).encode())


def find(name: str) -> LocalModel | None:
    path = _manifest_path(name)
    if not path.exists():
        return None
    return LocalModel(**json.loads(path.read_text()))


def all_models() -> list[LocalModel]:
    models = []
    for path in sorted(manifests_dir().glob("*.json")):
        try:
            models.append(LocalModel(**json.loads(path.read_text())))
        except (ValueError, TypeError):
            continue  # a foreign or damaged file; not ours to show
    return models


def remove(name: str) -> bool:
    path = _manifest_path(name)
    if not path.exists():
        return False
    path.unlink()
    return True
