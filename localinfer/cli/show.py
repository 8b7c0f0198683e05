"""`localinfer show MODEL`: what a GGUF file holds, read from its metadata (and a vision
model's projector's)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from localinfer.errors import ModelNotFound
from localinfer.modelfile import inspect
from localinfer.projector import Projector, of_model
from localinfer.store.pull import local_path
from localinfer.store.refs import ModelSource, resolve


def show(
    model: Annotated[str, typer.Argument(help="Catalog alias, pulled name, or path to a .gguf.", show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    template: Annotated[bool, typer.Option("--template", help="Print only the chat template.")] = False,
) -> None:
    """Show a model's architecture, size (a mixture of experts: its experts and active parameters), pooling (an embedding or reranking model), its projector (a vision model), tensor types, context length, chat template and license."""
    src = resolve(model)
    path = local_path(src)
    if path is None:
        raise ModelNotFound(f"{src.name} is not downloaded; run 'localinfer pull {src.name}'")
    info = inspect(path)
    if template:
        print(info.chat_template or "")
        return
    projector, notes = vision_of(src, path)
    if json_out:
        print(json.dumps({"name": src.name, **info.as_dict(), **vision_json(projector, notes)}, indent=2, ensure_ascii=False))
        return
    table = Table.grid(padding=(0, 2))
    table.add_column(style="bold")
    table.add_column()
    for key, value in [
        ("name", f"{src.name}" + (f" ({info.name})" if info.name else "")),
        ("architecture", info.architecture),
        ("parameters", count_text(info.n_params) + (f", {count_text(info.n_params_active)} active per token" if info.n_expert else "")),
        *([("experts", f"{info.n_expert}, {info.n_expert_used} used per token")] if info.n_expert else []),
        ("context length", str(info.context_length)),
        ("layers", str(info.n_layer)),
        ("embedding length", str(info.n_embd)),
        *([("pooling", f"{info.pooling} ({'reranking' if info.pooling == 'rank' else 'embedding'} model)")] if info.embeds else []),
        *([("vision", line)] if (line := vision_text(projector, notes)) else []),
        ("vocabulary", str(info.n_vocab)),
        ("file size", f"{info.file_size / 1e6:.1f} MB"),
        ("tensor types", ", ".join(f"{t} × {n}" for t, n in info.tensor_types.items())),
        ("license", info.license or "-"),
        ("path", str(info.path)),
    ]:
        table.add_row(key, value)
    console = Console()
    console.print(table)
    if info.chat_template:
        console.print(Panel(info.chat_template, title="chat template", title_align="left", expand=False), markup=False)


def vision_of(src: ModelSource, path: Path) -> tuple[Projector | None, list[str]]:
    """The projector `run` loads with this model, and why there is none where one was meant
    to be: one beside it that does not pair, or the catalog's not pulled yet."""
    notes: list[str] = []
    projector = of_model(path, notes)
    if projector is None and not notes and src.mmproj_file:
        notes.append(f"its projector {src.mmproj_file} is not downloaded; run 'localinfer pull {src.name}'")
    return projector, notes


def vision_text(projector: Projector | None, notes: list[str]) -> str | None:
    """'yes (projector mmproj-….gguf, gemma3, image tokens per image 256)', 'no (why)', or
    None for a text model."""
    if projector is not None:
        return f"yes ({projector.summary()})"
    return f"no ({'; '.join(notes)})" if notes else None


def vision_json(projector: Projector | None, notes: list[str]) -> dict[str, object]:
    """{"vision": the projector's facts, or false}, and why not where one was meant to be."""
    return {"vision": projector.as_dict() if projector else False, **({"vision_notes": notes} if notes else {})}


def count_text(n: int) -> str:
    """A parameter count as model cards write it: 135.0M, 30.53B."""
    return f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


def register(app: typer.Typer) -> None:
    app.command()(show)
