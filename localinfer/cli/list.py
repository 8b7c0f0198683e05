"""`localinfer list`: the models on this machine (and, with --all, the catalog)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from localinfer.errors import UserError
from localinfer.projector import of_model
from localinfer.store.catalog import load_catalog
from localinfer.store.inventory import catalog_paths, pulled_outside_catalog


def _rows(show_all: bool) -> list[dict[str, object]]:
    rows: list[dict[str, object]] = []
    catalog = load_catalog()
    for alias, path in catalog_paths().items():
        if path is None and not show_all:
            continue
        entry = catalog.entries[alias]
        rows.append(
            {
                "name": entry.alias,
                "local": path is not None,
                "path": str(path) if path else None,
                "size": os.path.getsize(path) if path else None,
                "source": f"package {entry.package}" if entry.package else f"hf {entry.repo}",
                "description": entry.description,
                "checked": entry.checked,
                "vision": reads_images(path) if path else entry.mmproj_file is not None,
            }
        )
    for m in pulled_outside_catalog():
        rows.append({"name": m.name, "local": True, "path": m.path, "size": m.size, "source": m.source, "description": "", "checked": None,
                     "vision": reads_images(Path(m.path))})  # fmt: skip
    return rows


def reads_images(path: Path) -> bool:
    """Does `run` read images with this model: a projector that pairs with it lies beside it?
    (A catalog model not downloaded: does the catalog name one.) A damaged file reads none."""
    try:
        return of_model(path, []) is not None
    except UserError:
        return False


def list_models(
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Also list catalog models that are not downloaded.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List downloaded models (and the embedded default); VISION marks those that read images (a projector beside them)."""
    rows = _rows(show_all)
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "SIZE", "VISION", "SOURCE") + (("LOCAL", "DESCRIPTION") if show_all else ()):
        table.add_column(col)
    for r in rows:
        size = f"{r['size'] / 1e6:.0f} MB" if r["size"] else "-"
        extra = ("yes" if r["local"] else "", str(r["description"])) if show_all else ()
        table.add_row(str(r["name"]), size, "yes" if r["vision"] else "", str(r["source"]), *extra)
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("list")(list_models)
