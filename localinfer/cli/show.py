"""`localinfer show MODEL`: what a GGUF file holds, read from its metadata."""

from __future__ import annotations

import json
from typing import Annotated

import typer
from rich.console import Console
from rich.panel import Panel
from rich.table import Table

from localinfer.errors import ModelNotFound
from localinfer.modelfile import inspect
from localinfer.store.pull import local_path
from localinfer.store.refs import resolve


def show(
    model: Annotated[str, typer.Argument(help="Catalog alias, pulled name, or path to a .gguf.", show_default=False)],
    json_out: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
    template: Annotated[bool, typer.Option("--template", help="Print only the chat template.")] = False,
) -> None:
    """Show a model's architecture, size (a mixture of experts: its experts and active parameters), pooling (an embedding or reranking model), tensor types, context length, chat template and license."""
    src = resolve(model)
    path = local_path(src)
    if path is None:
        raise ModelNotFound(f"{src.name} is not downloaded; run 'localinfer pull {src.name}'")
    info = inspect(path)
    if template:
        print(info.chat_template or "")
        return
    if json_out:
        print(json.dumps({"name": src.name, **info.as_dict()}, indent=2, ensure_ascii=False))
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


def count_text(n: int) -> str:
    """A parameter count as model cards write it: 135.0M, 30.53B."""
    return f"{n / 1e6:.1f}M" if n < 1e9 else f"{n / 1e9:.2f}B"


def register(app: typer.Typer) -> None:
    app.command()(show)
