"""`localinfer rm MODEL`: delete a pulled model."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from localinfer.errors import ModelNotFound, UserError
from localinfer.store import manifests
from localinfer.store.catalog import load_catalog
from localinfer.store.lock import model_lock


def rm(model: Annotated[str, typer.Argument(help="The name it was pulled as (see 'localinfer list').", show_default=False)]) -> None:
    """Delete a downloaded model and free its disk space."""
    pulled = manifests.find(model)
    if pulled is None:
        if manifests.remove(model):  # a damaged record: nothing to trust in it but its name
            Console(stderr=True).print(f"deleted the damaged record of {model}")
            return
        entry = load_catalog().get(model)
        if entry is not None and entry.package:
            raise UserError(f"{model} ships inside the Python package '{entry.package}'; remove it with pip")
        raise ModelNotFound(f"'{model}' is not a pulled model; see 'localinfer list'")
    path = Path(pulled.path)
    with model_lock(path.parent, lambda message: Console(stderr=True).print(message)):  # not under a pull of it
        pulled = manifests.find(model)
        if pulled is None:
            raise ModelNotFound(f"'{model}' was removed meanwhile")
        for part in [path, *sorted(path.parent.glob(path.name.replace("-00001-of-", "-*-of-")))]:
            try:
                part.unlink(missing_ok=True)
            except OSError as e:
                raise UserError(f"cannot delete {part}: {e.strerror or e}") from None
        manifests.remove(model)
    Console(stderr=True).print(f"deleted {model} ({pulled.size / 1e6:.0f} MB)")


def register(app: typer.Typer) -> None:
    app.command()(rm)
