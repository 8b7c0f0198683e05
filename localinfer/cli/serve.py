"""`localinfer serve [MODEL]`: an OpenAI-compatible endpoint on this machine."""

from __future__ import annotations

import logging
from typing import Annotated, Optional

import typer
from rich.console import Console

from localinfer.cli import options as opt

err = Console(stderr=True, highlight=False)
LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def duration(value: str) -> float:
    """Seconds from '300', '30s', '5m', '1h'; a negative number means forever (as Ollama's keep_alive)."""
    from localinfer.server.host import seconds

    try:
        return seconds(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from None


def serve(
    model: Annotated[Optional[str], typer.Argument(help="The model to load at start: catalog alias, .gguf path, or owner/repo[:QUANT]. Default: the embedded SmolLM2-135M.", show_default=False)] = None,
    model_option: opt.ModelOption = None,
    host: Annotated[str, typer.Option(help="Address to listen on. Anything but loopback exposes the models to your network.")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.", callback=opt.between(1, 65535))] = 8080,
    parallel: Annotated[int, typer.Option("--parallel", "-np", help="Requests decoded at once (KV-cache slots per model).", callback=opt.between(1, 256))] = 4,
    max_queue: Annotated[int, typer.Option(help="Requests that may wait for a slot; past that, 503 with Retry-After.", callback=opt.between(0, opt.MAX_CTX))] = 32,
    ctx: opt.Ctx = None,
    pooling: Annotated[Optional[str], typer.Option("--pooling", help="The model's pooling instead of its file's: mean, cls or last for an embedding model; rank serves a yes/no reranker (Qwen3-Reranker as a plain causal LM) on /v1/rerank. Models loaded on demand keep their file's.", callback=opt.pooling_choice, show_default=False)] = None,
    engine_name: opt.Engine = opt.ENGINE_DEFAULT,
    kernels: opt.Kernels = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = "auto",
    cpu_moe: opt.CpuMoe = False,
    n_cpu_moe: opt.NCpuMoe = None,
    rpc: opt.Rpc = None,
    mmproj: opt.Mmproj = None,
    api_key: Annotated[Optional[str], typer.Option("--api-key", envvar="LOCALINFER_API_KEY", help="Require 'Authorization: Bearer KEY' on every route but /health.", show_default=False)] = None,
    keep_alive: Annotated[str, typer.Option(help="Unload a model idle this long (300, 30s, 5m, 1h; -1: never).", callback=duration)] = "5m",
    max_loaded: Annotated[int, typer.Option(help="Models kept loaded at once; the least recently used is swapped out.", callback=opt.between(1, 1024))] = 1,
    prefill_chunk: Annotated[int, typer.Option(help="Most prompt tokens prefilled per step, so a long prompt does not stall running streams.", callback=opt.between(16, opt.MAX_CTX))] = 512,
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
    allow_paths: Annotated[bool, typer.Option("--allow-paths", help="Let a request's 'model' name any .gguf file on this machine (by default only the models given here, the catalog's and the downloaded ones).")] = False,
    allow_fetch: Annotated[bool, typer.Option("--allow-fetch", help="Fetch the http(s) image URLs that requests name (bounded in time, bytes and redirects); off by default, such a link is a 400 and requests cannot make the server reach other addresses.")] = False,
    allow_pull: Annotated[bool, typer.Option("--allow-pull", help="Let Ollama clients download and delete models (POST /api/pull, DELETE /api/delete); off, a client cannot fill the disk.")] = False,
    decode_slowdown: Annotated[float, typer.Option(help="While others decode, a step that prefills may take this many times a decode step (fewer prompt tokens per step); 0: no limit.", callback=opt.at_least(0))] = 2.0,
) -> None:
    """Serve models over HTTP in four dialects: OpenAI's (/v1/chat/completions, /v1/completions, /v1/embeddings, /v1/models), OpenAI's Responses (/v1/responses), Anthropic's Messages (/v1/messages) and Ollama's (/api/chat, /api/generate, /api/tags...; use --port 11434 for Ollama's clients); plus /health and /metrics."""
    from localinfer.server.app import create_app
    from localinfer.server.fetch import FetchLimits
    from localinfer.server.host import ModelHost
    from localinfer.server.run import serve_app

    model = opt.one_model(model, model_option)
    if host not in LOOPBACK and not api_key:
        err.print(f"[yellow]warning:[/yellow] listening on {host} without --api-key: anyone who can reach this port can use your models")
    options = opt.load_options(engine_name, ctx, threads, kernels, (cache_type, cache_type_k, cache_type_v), (draft, draft_max, draft_ngram_min, draft_ngram_max), gpu_layers, cpu_moe=opt.cpu_moe_choice(cpu_moe, n_cpu_moe),
                               n_seq_max=parallel, prefill_chunk=prefill_chunk, decode_slowdown=decode_slowdown, draft_engine=draft_engine, prompt_cache=opt.prompt_cache(no_prompt_cache, cache_ram, cache_disk, cache_dir), rpc=rpc,
                               pooling=pooling, mmproj=mmproj)  # fmt: skip
    # keep_alive is in seconds already: duration() is its callback
    models = ModelHost(model, options, max_loaded=max_loaded, keep_alive=keep_alive, allow_paths=allow_paths)  # type: ignore[arg-type]
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S")
    app = create_app(models, api_key=api_key, parallel=parallel, max_queue=max_queue, allow_pull=allow_pull, fetch=FetchLimits() if allow_fetch else None)
    serve_app(app, host, port)


def register(app: typer.Typer) -> None:
    app.command()(serve)
