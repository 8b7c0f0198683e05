"""`localinfer rm MODEL`: delete a pulled model."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.console import Console

from localinfer.store.remove import remove_model


def rm(model: Annotated[str, typer.Argument(help="The name it was pulled as (see 'localinfer list').", show_default=False)]) -> None:
    """Delete a downloaded model and free its disk space."""
    err = Console(stderr=True)
    freed = remove_model(model, err.print)
    err.print(f"deleted {model} ({freed / 1e6:.0f} MB)" if freed else f"deleted the damaged record of {model}")


def register(app: typer.Typer) -> None:
    app.command()(rm)
