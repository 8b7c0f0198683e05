"""Deleting a pulled model: its files (every shard), then its manifest, under the model
folder's lock so that a pull of it cannot run meanwhile. `rm` and the server's Ollama
`DELETE /api/delete` both come here."""

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
        for part in [path, *sorted(path.parent.glob(path.name.replace("-00001-of-", "-*-of-")))]:
            try:
                part.unlink(missing_ok=True)
            except OSError as e:
                raise UserError(f"cannot delete {part}: {e.strerror or e}") from None
        manifests.remove(name)
    return pulled.size
