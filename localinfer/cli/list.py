"""`localinfer list`: the models on this machine (and, with --all, the catalog)."""

from __future__ import annotations

import json
import os
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

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
            }
        )
    for m in pulled_outside_catalog():
        rows.append({"name": m.name, "local": True, "path": m.path, "size": m.size, "source": m.source, "description": "", "checked": None})
    return rows

def list_models(
    show_all: Annotated[bool, typer.Option("--all", "-a", help="Also list catalog models that are not downloaded.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List downloaded models (and the embedded default)."""
    rows = _rows(show_all)
    if json_out:
        print(json.dumps(rows, indent=2))
        return
    table = Table(box=None, header_style="bold")
    for col in ("NAME", "SIZE", "SOURCE") + (("LOCAL", "DESCRIPTION") if show_all else ()):
        table.add_column(col)
    for r in rows:
        size = f"{r['size'] / 1e6:.0f} MB" if r["size"] else "-"
        extra = ("yes" if r["local"] else "", str(r["description"])) if show_all else ()
        table.add_row(str(r["name"]), size, str(r["source"]), *extra)
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command("list")(list_models)
