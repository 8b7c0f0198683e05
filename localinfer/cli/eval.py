"""`localinfer eval MODEL`: perplexity over a text and, with --ref, the KL divergence
from a reference model: what a quantization cost, measured like llama.cpp's perplexity."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Annotated, Optional

import typer
from localinfer.cli import options as opt
from localinfer.cli.progress import work_bar
from localinfer.errors import UserError


def read_text(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"no such text file: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path} as UTF-8 text ({e})") from None


def default_text() -> Path:
    """The public-domain text shipped with localinfer (tests/data/README.md says where from)."""
    from importlib.resources import files

    return Path(str(files("localinfer_quant") / "data" / "alice_in_wonderland.txt"))


def eval_command(
    model: Annotated[str, typer.Argument(help="The model to measure: catalog alias, .gguf path, or owner/repo[:QUANT].", show_default=False)],
    text: Annotated[Optional[Path], typer.Option("--text", help="UTF-8 text to score (at least one chunk of --ctx tokens). [default: Alice's Adventures in Wonderland, 39k tokens, public domain]", show_default=False)] = None,
    ref: Annotated[Optional[str], typer.Option("--ref", help="Reference model (e.g. the F16 source) for KL divergence and top-1 agreement.", show_default=False)] = None,
    ctx: Annotated[int, typer.Option("--ctx", "-c", help="Tokens per chunk; the second half of each chunk is scored.", callback=opt.between(8, opt.MAX_CTX))] = 512,
    max_chunks: Annotated[Optional[int], typer.Option("--chunks", help="Score at most this many chunks. [default: all]", callback=opt.between(1, opt.MAX_CTX), show_default=False)] = None,
    engine_name: opt.Engine = opt.ENGINE_DEFAULT,
    kernels: opt.Kernels = None,
    threads: opt.Threads = None,
    gpu_layers: opt.GpuLayers = "auto",
    cache_type: opt.CacheType = None,
    cache_type_k: opt.CacheTypeK = None,
    cache_type_v: opt.CacheTypeV = None,
    ref_cache: Annotated[Optional[str], typer.Option("--ref-cache", help="Score against the same weights (or --ref) with this KV-cache type for K and V: the cost of a quantized cache, e.g. --cache-type q8_0 --ref-cache f16.", callback=opt.cache_type, show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help='Print {"perplexity", "tokens", "kld": {"mean", "p99", "max"}, "top1_agreement"} (kld and top1_agreement with --ref).')] = False,
) -> None:
    """Measure perplexity over a text, and with --ref the KL divergence from a reference model."""
    from localinfer.engine.loader import open_engine
    from localinfer.quality.evaluate import evaluate

    content = read_text(text or default_text())
    if ref_cache == "auto":
        raise typer.BadParameter("give the reference a type (e.g. f16), not auto", param_hint="--ref-cache")
    from localinfer.engine.prompt_cache import CacheOptions

    load = opt.load_options(engine_name, ctx, threads, kernels, (cache_type, cache_type_k, cache_type_v), gpu_layers=gpu_layers, prompt_cache=CacheOptions(enabled=False))  # scoring needs every position's logits: nothing to put back
    subject = open_engine(model, load)
    reference = None
    if ref or ref_cache:
        reference = open_engine(ref or model, replace(load, cache=(ref_cache, ref_cache)) if ref_cache else load)
        ref = ref or f"{model or subject.name} with a {ref_cache} KV cache"
    try:
        tokens = subject.backend.tokenize(content, add_special=False)
        if reference is not None and reference.backend.tokenize(content, add_special=False) != tokens:
            raise UserError("the reference model tokenizes the text differently; KL divergence needs the same tokenizer")
        with work_bar("scoring", enabled=not json_out) as update:
            result = evaluate(
                subject.backend, tokens, ctx, reference.backend if reference else None, max_chunks,
                progress=lambda done, total, ppl: update(done, total, f"perplexity {ppl:.3f}"),
            )  # fmt: skip
    finally:
        subject.close()
        if reference is not None:
            reference.close()
    if json_out:
        print(json.dumps(result.as_dict()))
        return
    print(f"perplexity {result.perplexity:.4f} over {result.tokens} tokens ({result.chunks} chunks of {ctx})")
    if result.kld is not None:
        k = result.kld
        print(f"KL divergence from {ref}: mean {k['mean']:.6f}, p99 {k['p99']:.6f}, max {k['max']:.6f}")
        print(f"top-1 agreement with {ref}: {100 * result.top1_agreement:.2f} %")


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
