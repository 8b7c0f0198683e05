"""`localinfer cache`: what the prompt cache keeps on disk, and clearing it."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from localinfer.cli import options as opt
from localinfer.paths import prompt_cache_dir
from localinfer.store.block_files import clear, folders

app = typer.Typer(rich_markup_mode=None, help="The prompt cache's disk tier: list it (the default) or clear it.", invoke_without_command=True, no_args_is_help=False)
Json = Annotated[bool, typer.Option("--json", help="Print JSON.")]


@app.callback()
def listing(ctx: typer.Context, cache_dir: opt.CacheDir = None, json_out: Json = False) -> None:
    """List the prompt cache on disk: one row per model and way it was loaded (engine, KV
    types), with its blocks, size and last use."""
    if ctx.invoked_subcommand is not None:
        return
    root = cache_dir or prompt_cache_dir()
    entries = folders(root)
    if json_out:
        rows = [{"folder": str(e.folder), "blocks": e.blocks, "bytes": e.bytes, "last_used": e.last_used, **{k: e.identity.get(k) for k in ("model", "engine", "kv_types", "block_tokens", "model_sha256")}}
                for e in entries]  # fmt: skip
        print(json.dumps({"folder": str(root), "bytes": sum(e.bytes for e in entries), "entries": rows}))
        return
    console = Console()
    if not entries:
        console.print(f"the prompt cache is empty ({root})")
        return
    table = Table("model", "engine", "KV", "blocks", "size", "last used", box=None)
    for e in entries:
        kv = "/".join(e.identity.get("kv_types", []) or ["?"])  # type: ignore[arg-type]
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(e.last_used)) if e.last_used else "never"
        table.add_row(str(e.identity.get("model", e.folder.name)), str(e.identity.get("engine", "?")), kv, str(e.blocks), f"{e.bytes / 1e6:.1f} MB", when)
    console.print(table)
    console.print(f"{sum(e.bytes for e in entries) / 1e6:.1f} MB in {root}")


@app.command("clear")
def clear_command(cache_dir: opt.CacheDir = None, json_out: Json = False) -> None:
    """Delete every block of the prompt cache on disk."""
    root: Path = cache_dir or prompt_cache_dir()
    files, size = clear(root)
    if json_out:
        print(json.dumps({"folder": str(root), "deleted_blocks": files, "freed_bytes": size}))
    else:
        Console(stderr=True).print(f"deleted {files} blocks ({size / 1e6:.1f} MB) from {root}")


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="cache")


