"""`localinfer pull MODEL`: download a model (resumable, verified) with a progress bar."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Iterator

import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TimeRemainingColumn, TransferSpeedColumn

from localinfer.store import manifests
from localinfer.store.pull import Progress as ProgressFn
from localinfer.store.pull import pull as pull_model
from localinfer.store.pull import sha256_of
from localinfer.store.refs import ModelSource, resolve

err = Console(stderr=True)


@contextmanager
def progress_bar(enabled: bool = True) -> Iterator[ProgressFn | None]:
    """A download bar on stderr, drawn only once bytes start to move."""
    if not enabled:
        yield None
        return
    bar = Progress(
        "[progress.description]{task.description}", BarColumn(), DownloadColumn(),
        TransferSpeedColumn(), TimeRemainingColumn(), console=err, transient=True,
    )
    task: list[int] = []

    def update(done: int, total: int) -> None:
        if not task:
            bar.start()
            task.append(bar.add_task("pulling", total=total or None))
        bar.update(task[0], completed=done, total=total or None)

    try:
        yield update
    finally:
        if task:
            bar.stop()


def pull(
    model: Annotated[str, typer.Argument(help="Catalog alias or Hugging Face owner/repo[:QUANT].", show_default=False)],
    with_draft: Annotated[bool, typer.Option("--with-draft", help="Also pull the catalog's draft model for it (a small model of the same tokenizer that --draft auto speculates with).")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="Print the pulled model as JSON.")] = False,
) -> None:
    """Download a model from the Hugging Face hub (a vision model with its projector). An interrupted pull resumes where it stopped."""
    src = resolve(model)
    if with_draft and src.draft is None:
        raise typer.BadParameter(f"the catalog names no draft model for {src.name}", param_hint="--with-draft")
    info = _pull_one(src, json_out)
    if with_draft:
        info["draft"] = _pull_one(resolve(src.draft), json_out)  # type: ignore[arg-type]
    if json_out:
        print(json.dumps(info))


def _pull_one(src: ModelSource, json_out: bool) -> dict[str, object]:
    with progress_bar(enabled=not json_out) as progress:
        path = pull_model(src, progress, warn=lambda w: err.print(f"[yellow]warning:[/yellow] {w}", soft_wrap=True))
    local = manifests.find(src.name)
    info: dict[str, object] = {
        "name": src.name,
        "path": str(path),
        "size": path.stat().st_size,
        "sha256": local.sha256 if local else (src.sha256 or sha256_of(path)),  # pull() verified src.sha256
        "verified": local.verified if local else True,
    }
    if local and local.projector:
        projector = Path(local.projector)
        info["projector"] = {"path": str(projector), "size": projector.stat().st_size, "sha256": local.projector_sha256}
    if not json_out:
        check = "" if info["verified"] else ", not verified"
        err.print(f"pulled [bold]{src.name}[/bold] ({info['size'] / 1e6:.1f} MB, sha256 {str(info['sha256'])[:12]}…{check}) → {path}")  # type: ignore[operator]
        if "projector" in info:
            p = info["projector"]
            err.print(f"  and its projector, for images ({p['size'] / 1e6:.1f} MB, sha256 {str(p['sha256'])[:12]}…) → {p['path']}")  # type: ignore[index]
    return info


def register(app: typer.Typer) -> None:
    app.command()(pull)
