"""What is on this machine, by the names `run` takes: `list` shows it, and the server's
/v1/models lists it."""

from __future__ import annotations

from pathlib import Path

from localinfer.errors import ModelNotFound
from localinfer.store import manifests
from localinfer.store.catalog import load_catalog
from localinfer.store.pull import local_path
from localinfer.store.refs import resolve


def catalog_paths() -> dict[str, Path | None]:
    """Each catalog alias and its file here: a package file or a pull; None if absent."""
    paths: dict[str, Path | None] = {}
    for alias in load_catalog().entries:
        try:
            paths[alias] = local_path(resolve(alias))
        except ModelNotFound:  # its package is not installed
            paths[alias] = None
    return paths


def pulled_outside_catalog() -> list[manifests.LocalModel]:
    """Models pulled by a hub or file reference, whose files are still here."""
    catalog = load_catalog()
    return [m for m in manifests.all_models() if catalog.get(m.name) is None and m.exists]


def local_names() -> list[str]:
    """Every model on this machine: catalog models present, then the other pulls."""
    return [alias for alias, path in catalog_paths().items() if path] + [m.name for m in pulled_outside_catalog()]
