"""`localinfer chat [MODEL]`: the terminal chat app, plus `--list` and `--export` for scripts."""

from __future__ import annotations

import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Annotated, Optional

import typer

from localinfer.cli import options as opt


def _chat_id(value: tuple[int, Path] | None) -> tuple[int, Path] | None:
    """--export's ID: a chat's SQLite rowid, so a whole number from 1 to 2**63 - 1."""
    if value is not None:
        opt.between(1, 2**63 - 1)(value[0])
    return value


def chat(
    model: Annotated[Optional[str], typer.Argument(help="Catalog alias, path to a .gguf, or Hugging Face owner/repo[:QUANT]; with --url, the name the endpoint knows it by. Default: the embedded SmolLM2-135M (with --url: the endpoint's first model).", show_default=False)] = None,
    model_option: opt.ModelOption = None,
    url: Annotated[Optional[str], typer.Option("--url", help="Talk to an OpenAI-compatible endpoint (localinfer serve, Ollama, llama-server) instead of loading the model here, e.g. http://127.0.0.1:8080. Its key comes from OPENAI_API_KEY.", show_default=False)] = None,
    temperature: opt.Temperature = None,
    top_k: opt.TopK = None,
    top_p: opt.TopP = None,
    min_p: opt.MinP = None,
    repeat_penalty: opt.RepeatPenalty = None,
    seed: opt.Seed = None,
    max_tokens: opt.MaxTokens = None,
    engine_name: opt.Engine = opt.ENGINE_DEFAULT,
    ctx: opt.Ctx = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = "auto",
    cpu_moe: opt.CpuMoe = False,
    n_cpu_moe: opt.NCpuMoe = None,
    rpc: opt.Rpc = None,
    mmproj: opt.Mmproj = None,
    kernels: opt.Kernels = None,
    cache_type: opt.CacheType = None,
    cache_type_k: opt.CacheTypeK = None,
    cache_type_v: opt.CacheTypeV = None,
    cache_ram: opt.CacheRam = None,
    cache_disk: opt.CacheDisk = None,
    cache_dir: opt.CacheDir = None,
    no_prompt_cache: opt.NoPromptCache = False,
    draft: opt.Draft = "auto",
    draft_engine: opt.DraftEngine = None,
    draft_max: opt.DraftMax = 10,
    draft_ngram_min: opt.DraftNgramMin = 2,
    draft_ngram_max: opt.DraftNgramMax = 4,
    think: opt.Think = "on",
    think_budget: opt.ThinkBudget = None,
    list_chats: Annotated[bool, typer.Option("--list", help="Print the saved chats, newest first, and exit.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="With --list: print JSON.")] = False,
    export: Annotated[Optional[tuple[int, Path]], typer.Option("--export", metavar="ID FILE", help="Write chat ID to FILE (Markdown, or JSON for a .json name) and exit.", callback=_chat_id, show_default=False)] = None,
) -> None:
    """Chat in a terminal app: saved conversations, streamed Markdown, live TTFT, tokens/s and context use.

    The sampling options are where every chat starts (a saved chat keeps its own); Ctrl+S changes them.

    Keys: Enter sends, Shift+Enter (or Ctrl+J) breaks the line, Esc stops a reply, Ctrl+O (or /image PATH) attaches an image for a vision model; the footer lists the rest, and Ctrl+P finds any action. Chats are kept in chats.db in the data folder (LOCALINFER_HOME if set)."""
    from localinfer.tui.store import ChatStore

    model = opt.one_model(model, model_option)
    if json_out and not list_chats:
        raise typer.BadParameter("--json goes with --list", param_hint="--json")
    store = ChatStore.open()
    try:
        if list_chats:
            _print_chats(store, json_out)
            return
        if export is not None:
            from localinfer.tui.export import export_chat

            chat_id, path = export
            kind = export_chat(store, chat_id, path)
            print(f"Exported chat {chat_id} as {kind} to {path}", file=sys.stderr)
            return
        if not (sys.stdin.isatty() and sys.stdout.isatty()):
            raise typer.BadParameter("the chat app needs a terminal; for scripts use 'localinfer run' (one prompt) or 'localinfer serve' (an API)")
        from localinfer.engine.reasoning import think_of
        from localinfer.tui.app import ChatApp
        from localinfer.tui.threads import UI_NICE

        options = opt.load_options(engine_name, ctx, threads, kernels, (cache_type, cache_type_k, cache_type_v), (draft, draft_max, draft_ngram_min, draft_ngram_max), gpu_layers, draft_engine=draft_engine, cpu_moe=opt.cpu_moe_choice(cpu_moe, n_cpu_moe), prompt_cache=opt.prompt_cache(no_prompt_cache, cache_ram, cache_disk, cache_dir), rpc=rpc, mmproj=mmproj)
        sampling = {"temperature": temperature, "top_k": top_k, "top_p": top_p, "min_p": min_p, "repeat_penalty": repeat_penalty, "seed": seed, "max_tokens": max_tokens}
        ChatApp(store, model_loader(options, think_of(think, think_budget), think_budget), model=model, url=url, sampling=sampling, ui_nice=UI_NICE).run()
    finally:
        store.close()


def model_loader(options, think: bool | str = True, think_budget: int | None = None):  # (LoadOptions) -> Loader
    """How the app opens a chat's model: in-process with these options, or at its URL
    (`think`: a reasoning model thinks before it answers, or how hard: low, medium or high,
    at most `think_budget` tokens)."""

    def load(ref: str | None, url: str | None):
        from localinfer.tui.replies import LocalModel, RemoteModel

        if url:
            return RemoteModel(url, ref, think, think_budget)
        from localinfer.engine.loader import open_engine

        return LocalModel(open_engine(ref, options), think, think_budget)

    return load


def _print_chats(store, json_out: bool) -> None:
    counts = store.message_counts()
    rows = [
        {"id": c.id, "title": c.title, "model": c.model, "url": c.url, "messages": counts.get(c.id, 0), "updated": datetime.fromtimestamp(c.updated).isoformat(timespec="seconds")}
        for c in store.chats()
    ]
    if json_out:
        print(json.dumps(rows, indent=2, ensure_ascii=False))
        return
    if not rows:
        print("No saved chats yet: start one with 'localinfer chat'.", file=sys.stderr)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table(box=None, header_style="bold")
    for col in ("ID", "TITLE", "MODEL", "MESSAGES", "UPDATED"):
        table.add_column(col)
    for r in rows:
        table.add_row(str(r["id"]), str(r["title"]), str(r["model"] or (r["url"] or "default")), str(r["messages"]), str(r["updated"]).replace("T", " "))
    Console().print(table)


def register(app: typer.Typer) -> None:
    app.command(no_args_is_help=False)(chat)
