"""Deleting a pulled model: its files (every shard, and its projector unless another pull
still uses it), then its manifest, under the model folder's lock so that a pull of it cannot
run meanwhile. `rm` and the server's Ollama `DELETE /api/delete` both come here."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from localinfer.errors import ModelNotFound, UserError
from localinfer.store import manifests
from localinfer.store.catalog import load_catalog
from localinfer.store.lock import model_lock


def remove_model(name: str, notify: Callable[[str], None]) -> int:
    """Delete a pulled model; returns the bytes freed (0 for a damaged record, whose name is
    all there is to trust). ModelNotFound if there is no such pull; UserError if it cannot be deleted."""
    pulled = manifests.find(name)
    if pulled is None:
        if manifests.remove(name):
            return 0
        entry = load_catalog().get(name)
        if entry is not None and entry.package:
            raise UserError(f"{name} ships inside the Python package '{entry.package}'; remove it with pip")
        raise ModelNotFound(f"'{name}' is not a pulled model; see 'localinfer list'")
    path = Path(pulled.path)
    with model_lock(path.parent, notify):  # not under a pull of it
        pulled = manifests.find(name)
        if pulled is None:
            raise ModelNotFound(f"'{name}' was removed meanwhile")
        freed = pulled.size + _delete(_projector_of(pulled))
        for part in [path, *sorted(path.parent.glob(path.name.replace("-00001-of-", "-*-of-")))]:
            _delete(part)
        manifests.remove(name)
    return freed


def _projector_of(pulled: manifests.LocalModel) -> Path | None:
    """The model's projector, unless another pull shares it (two quantizations of one repo
    lie in one folder, beside one projector)."""
    if pulled.projector is None:
        return None
    others = [m for m in manifests.all_models() if m.name != pulled.name and m.projector == pulled.projector]
    return None if others else Path(pulled.projector)


def _delete(path: Path | None) -> int:
    """Delete a file; the bytes it held (0 for none, or one already gone)."""
    if path is None or not path.is_file():
        return 0
    size = path.stat().st_size
    try:
        path.unlink()
    except FileNotFoundError:
        return 0
    except OSError as e:
        raise UserError(f"cannot delete {path}: {e.strerror or e}") from None
    return size
