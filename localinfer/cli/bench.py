"""`localinfer bench`: `model`, llama-bench-style tables of prompt processing and generation
speed for every combination of the options' lists; `serve`, a load generator for any
OpenAI-compatible endpoint; `compare`, two serve runs side by side."""

from __future__ import annotations

import itertools
import json
import math
import sys
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn

from localinfer.cli import options as opt

bench_app = typer.Typer(name="bench", rich_markup_mode=None, help="Measure models (llama-bench-style tables) and servers (a load generator).", no_args_is_help=True)
err = Console(stderr=True, highlight=False)


def _list(kind, check=None, hint: str | None = None):  # type: ignore[no-untyped-def]
    """A comma-separated option (`-p 128,512`), each item converted and checked; an error
    names the option (`hint`), since the list is read in the command, not by click."""

    def parse(value: str | None):  # type: ignore[no-untyped-def]
        if value is None:
            return None
        items = [item.strip() for item in value.split(",") if item.strip()]
        if not items:
            raise typer.BadParameter("is empty", param_hint=hint)
        out = []
        for item in items:
            try:
                converted = kind(item)
            except ValueError:
                raise typer.BadParameter(f"'{item}' is not {'a whole number' if kind is int else 'valid'}", param_hint=hint) from None
            try:
                out.append(check(converted) if check else converted)
            except typer.BadParameter as e:
                raise typer.BadParameter(e.message, param_hint=hint) from None
        return list(dict.fromkeys(out))

    return parse


def _draft(value: str) -> str:
    """none, prompt-lookup, or a draft model's reference (checked here, in one line)."""
    if value in ("on", "prompt-lookup"):
        return "prompt-lookup"
    if value in ("off", "none"):
        return "none"
    from localinfer.errors import UserError
    from localinfer.store.refs import resolve

    try:
        resolve(value)
    except UserError as e:
        raise typer.BadParameter(f"'{value}' is not on, off or a draft model: {e}") from None
    return value


@bench_app.command("model")
def model(
    models: Annotated[Optional[list[str]], typer.Argument(help="Models to measure (catalog alias, .gguf path, owner/repo[:QUANT]). Default: the embedded SmolLM2-135M.", show_default=False)] = None,
    prompts: Annotated[str, typer.Option("-p", "--n-prompt", help="Prompt lengths to measure (ppN), comma-separated; 0 for none.")] = "512",
    gens: Annotated[str, typer.Option("-n", "--n-gen", help="Generation lengths to measure (tgN), comma-separated; 0 for none.")] = "128",
    depths: Annotated[str, typer.Option("-d", "--n-depth", help="Depths, comma-separated: each pp and tg test runs after this many tokens already in the KV cache, as llama-bench's -d ('pp512 @ d4096'); 0: an empty cache.")] = "0",
    reps: Annotated[int, typer.Option("-r", "--repetitions", help="Runs of each test (mean ± stdev).", callback=opt.between(1, 100))] = 3,
    engines: Annotated[str, typer.Option("--engine", help="Engines, comma-separated: llama.cpp, native.")] = "llama.cpp",
    kernels: Annotated[Optional[str], typer.Option("--kernels", help="Native kernel sets, comma-separated: auto, c, numba.", show_default=False)] = None,
    threads: Annotated[str, typer.Option("-t", "--threads", help="Thread counts, comma-separated. [default: physical cores]", show_default=False)] = "",
    cache_k: Annotated[str, typer.Option("--cache-type-k", "-ctk", help="K cache types, comma-separated (f16, q8_0, q4_0; llama.cpp also q4_1, q5_0, q5_1, iq4_nl).")] = "f16",
    cache_v: Annotated[str, typer.Option("--cache-type-v", "-ctv", help="V cache types, comma-separated.")] = "f16",
    draft: Annotated[str, typer.Option("--draft", help="Speculation, comma-separated: off, on (prompt lookup), or a draft model (catalog alias, file or repo; beside prompt lookup). The table gives each source's acceptance.")] = "off",
    gpu_layers: Annotated[str, typer.Option("--gpu-layers", "-ngl", help="llama.cpp: layers on the GPU, comma-separated (numbers, all or auto).")] = "0",
    cpu_moe: Annotated[bool, typer.Option("--cpu-moe", help="llama.cpp, a mixture of experts beside a GPU: every layer's experts in RAM (--n-cpu-moe all).")] = False,
    n_cpu_moe: Annotated[str, typer.Option("--n-cpu-moe", "-ncmoe", metavar="N[,N...]", help="llama.cpp, a mixture of experts beside a GPU: the experts of the first N layers in RAM, comma-separated (numbers, all, or auto: planned with -ngl), as llama-bench's -ncmoe.")] = "auto",
    rpc: Annotated[Optional[list[str]], typer.Option("--rpc", metavar="none|HOST:PORT[,HOST:PORT...]", help="llama.cpp: RPC workers to split the layers with; repeat it to compare (--rpc none --rpc A --rpc A,B). Each row gives the round trips a decoded token waits on, counted in a separate pass: times a network's round-trip time, what the network adds to each token.", show_default=False)] = None,
    bandwidth: Annotated[Optional[float], typer.Option("--bandwidth", metavar="GBPS", help="This machine's read bandwidth in GB/s (bench/bandwidth.py): adds the 'of limit' column, each tg row's t/s times the bytes a token reads (weights, and the KV cache at its depth) over this.", callback=_bandwidth, show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the results as JSON (one record per test, fields as in docs/benchmarks.md).")] = False,
    csv_out: Annotated[bool, typer.Option("--csv", help="Print the results as CSV.")] = False,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Also write the results as JSON to this file.", show_default=False)] = None,
) -> None:
    """Prompt (ppN) and generation (tgN) speed, as llama-bench reports it.

    Every combination of the lists given runs in its own process; each test reports
    tokens/s as mean ± stdev, with the verify cost (an 8-row forward over a 1-row one)
    and the combination's resident memory. With -d, each test also runs after a prefix
    of that many tokens already in the cache (computed untimed)."""
    from localinfer.backends.llamacpp import default_threads
    from localinfer.benchmark import report
    from localinfer.benchmark.model import run

    if json_out and csv_out:
        raise typer.BadParameter("give --json or --csv, not both", param_hint="--csv")
    n_prompt = [n for n in _list(int, _nonnegative, "-p")(prompts) if n]
    n_gen = [n for n in _list(int, _nonnegative, "-n")(gens) if n]
    if not n_prompt and not n_gen:
        raise typer.BadParameter("nothing to measure: every -p and -n is 0", param_hint="-p/-n")
    n_depth = _list(int, _nonnegative, "-d")(depths)
    engine_list = _list(str, opt.backend_name, "--engine")(engines)
    kernel_list = _list(str, lambda k: opt.kernel_set(None if k == "auto" else k), "--kernels")(kernels) if kernels else [None]
    thread_list = _list(int, opt.threads, "-t")(threads) if threads else [default_threads()]
    k_list, v_list = _list(str, _cache, "-ctk")(cache_k), _list(str, _cache, "-ctv")(cache_v)
    draft_list = _list(str, _draft, "--draft")(draft)
    ngl_list = _list(str, opt.gpu_layers, "-ngl")(gpu_layers)  # numbers as ints, or "auto"
    if cpu_moe and n_cpu_moe != "auto":
        raise typer.BadParameter("give --cpu-moe or --n-cpu-moe, not both", param_hint="--n-cpu-moe")
    moe_list = ["all"] if cpu_moe else _list(str, opt.gpu_layers, "-ncmoe")(n_cpu_moe)  # a number of layers, all or auto, as -ngl
    refs = models or [None]
    _check_models(refs, n_depth, n_prompt, n_gen)
    rpc_list = [",".join(opt.rpc_endpoints(value)) if value != "none" else "" for value in rpc or ["none"]]
    setups = _setups(refs, engine_list, kernel_list, thread_list, k_list, v_list, draft_list, ngl_list, moe_list, rpc_list)

    total = len(setups) * len(n_depth) * (len(n_prompt) + len(n_gen))
    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True, disable=json_out or csv_out or not err.is_terminal)
    with bar:
        task = bar.add_task("benchmarking", total=total)
        results = run(setups, n_prompt, n_gen, reps, on_result=lambda r: bar.update(task, advance=1, description=f"{r.setup.engine} {r.test}"), depths=n_depth)
    if output is not None:
        from localinfer.paths import write_atomic

        write_atomic(output, report.as_json(results).encode())
    if json_out:
        print(report.as_json(results))
    elif csv_out:
        print(report.as_csv(results, bandwidth), end="")
    else:
        print(report.markdown(results, bandwidth))
    if len(results) < total:
        err.print(f"[yellow]stopped:[/yellow] {len(results)} of {total} tests measured" + (f", written to {output}" if output else ""))
        raise typer.Exit(130)


def _setups(refs: list, engine_list: list[str], *lists: list) -> list:
    """Every combination of the lists (kernels, threads, K and V cache types, drafts,
    GPU layers, experts in RAM, RPC workers) that an engine can run, one row each: an
    option the engine ignores does not make a second row, and what it cannot run is
    reported as skipped."""
    from localinfer.backends import get_backend
    from localinfer.benchmark.model import Setup

    setups, skipped = [], []
    caps = {engine: get_backend(engine).capabilities() for engine in engine_list}
    for ref, engine, kern, n_threads, k, v, spec, ngl, moe, workers in itertools.product(refs, engine_list, *lists):
        c = caps[engine]
        if not {k, v} <= set(c.kv_types):
            skipped.append(f"{engine} with a {k}/{v} cache (its cache is {', '.join(c.kv_types)})")
            continue
        if workers and not c.rpc:
            skipped.append(f"{engine} with --rpc (it runs on this machine alone)")
            continue
        offloads = c.gpu_offload and not workers
        setups.append(Setup(ref or "smollm2:135m", engine, kern if c.kernel_sets else None, n_threads, k, v, spec, ngl if offloads else 0, moe if offloads else "auto", workers))
    for note in dict.fromkeys(skipped):
        err.print(f"[dim]skipped: {note}[/dim]")
    return list(dict.fromkeys(setups))


def _check_models(refs: list, depths: list[int], prompts: list[int], gens: list[int]) -> None:
    """Each model's reference, and the tests against the context it was trained on, in one
    line before any run (a hub model not pulled yet is checked in its worker, once pulled)."""
    from localinfer.benchmark.model import check_context
    from localinfer.modelfile import inspect
    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    for ref in refs:
        src = resolve(ref)
        path = local_path(src)
        if path is not None:
            check_context(src.name, inspect(path).context_length, depths, prompts, gens)


def _bandwidth(value: float | None) -> float | None:
    return None if value is None else _positive_rate(value)


def _nonnegative(n: int) -> int:
    if not 0 <= n <= opt.MAX_CTX:
        raise typer.BadParameter(f"must be between 0 and {opt.MAX_CTX}, not {n}")
    return n


def _cache(value: str) -> str:
    if value == "auto":
        raise typer.BadParameter("'auto' is not a type to measure: name the types")
    return opt.cache_type(value)  # type: ignore[return-value]


def register(app: typer.Typer) -> None:
    app.add_typer(bench_app)


@bench_app.command("serve")
def serve(
    url: Annotated[str, typer.Option("--url", help="The endpoint's base URL (ours, llama-server, Ollama's /v1, vLLM).")] = "http://127.0.0.1:8080",
    model: Annotated[Optional[str], typer.Option("--model", help="The model to ask for. [default: the server's own]", show_default=False)] = None,
    concurrency: Annotated[Optional[str], typer.Option("--concurrency", "-c", help="Closed loop: requests in flight, comma-separated (a sweep). [default: 1,2,4,8]", show_default=False)] = None,
    rate: Annotated[Optional[str], typer.Option("--rate", help="Open loop instead: Poisson arrivals at these requests/s, comma-separated.", show_default=False)] = None,
    requests: Annotated[int, typer.Option("--requests", "-n", help="Requests per load level.", callback=opt.between(1, 100000))] = 32,
    workload: Annotated[str, typer.Option("--workload", help="synthetic, chat (shipped prompts), shared-prefix (one long system prompt), long-prompt (a long prompt every 8th request).")] = "synthetic",
    input_len: Annotated[int, typer.Option("--input-len", help="Prompt length in words (synthetic, long-prompt; x8 for shared-prefix's system prompt).", callback=opt.between(1, 100000))] = 64,
    output_len: Annotated[int, typer.Option("--output-len", help="Tokens asked for per answer.", callback=opt.between(1, 100000))] = 64,
    seed: Annotated[int, typer.Option("--seed", help="Fixes the prompts and arrival times, so runs compare.", callback=opt.between(0, 2**64 - 1))] = 0,
    timeout: Annotated[float, typer.Option("--timeout", help="Seconds a request may take before it counts as failed.", callback=opt.at_least(0.1))] = 120.0,
    slo_ttft_ms: Annotated[Optional[float], typer.Option("--slo-ttft-ms", help="Goodput counts requests whose TTFT is at most this.", callback=opt.at_least(0), show_default=False)] = None,
    slo_tpot_ms: Annotated[Optional[float], typer.Option("--slo-tpot-ms", help="... and whose TPOT is at most this.", callback=opt.at_least(0), show_default=False)] = None,
    ignore_eos: Annotated[bool, typer.Option("--ignore-eos/--no-ignore-eos", help="Ask for exactly --output-len tokens (llama-server, vLLM and ours take ignore_eos).")] = True,
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write the run (settings, every request, the summaries) to this JSON file. [default: bench-serve-<time>.json]", show_default=False)] = None,
    plot: Annotated[Optional[Path], typer.Option("--plot", help="Draw latency and throughput against load into this PNG.", show_default=False)] = None,
    label: Annotated[Optional[str], typer.Option("--label", help="A name for this run in its table, plot and comparisons. [default: the URL]", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print the run as JSON instead of the table.")] = False,
) -> None:
    """Load any OpenAI-compatible endpoint; TTFT, TPOT, ITL, goodput per load level.

    Streams every request and times each chunk as it arrives: TTFT, TPOT, ITL and
    end-to-end latency (p50/p90/p99), request and token throughput, and goodput under
    --slo-ttft-ms/--slo-tpot-ms. Writes one JSON file per run; Ctrl-C keeps what was measured."""
    import asyncio
    import time

    from localinfer.benchmark import serve as sv
    from localinfer.benchmark.report import serve_markdown

    if concurrency and rate:
        raise typer.BadParameter("give --concurrency or --rate, not both", param_hint="--rate")
    if workload not in sv.WORKLOADS:
        raise typer.BadParameter(f"'{workload}' is not one of: {', '.join(sv.WORKLOADS)}", param_hint="--workload")
    levels = [sv.Level(rate=r) for r in _list(float, _positive_rate, "--rate")(rate)] if rate else [sv.Level(concurrency=c) for c in _list(int, opt.between(1, 100000), "-c")(concurrency or "1,2,4,8")]
    url = url.rstrip("/").removesuffix("/v1")
    if not url.startswith(("http://", "https://")):
        raise typer.BadParameter(f"'{url}' is not an http(s) URL", param_hint="--url")
    sv.check_server(url, model)
    extra = {"ignore_eos": True} if ignore_eos else {}
    slo_ttft, slo_tpot = (slo_ttft_ms / 1e3 if slo_ttft_ms is not None else None), (slo_tpot_ms / 1e3 if slo_tpot_ms is not None else None)
    run: dict = {"label": label or url, "url": url, "model": model, "workload": workload, "requests_per_level": requests, "input_len": input_len, "output_len": output_len,
                 "seed": seed, "slo_ttft_ms": slo_ttft_ms, "slo_tpot_ms": slo_tpot_ms, "ignore_eos": ignore_eos, "started": time.time(), "levels": []}  # fmt: skip
    output = output or Path(f"bench-serve-{time.strftime('%Y%m%d-%H%M%S')}.json")
    bar = Progress("[progress.description]{task.description}", BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(), console=err, transient=True, disable=json_out or not err.is_terminal)
    stopped = False
    with bar:
        task = bar.add_task("warm-up", total=len(levels) * requests)
        try:
            for i, level in enumerate(levels):
                specs = sv.workload(workload, requests + 1, seed + i, input_len, output_len)
                asyncio.run(sv.run_level(url, model, sv.Level(concurrency=1), specs[:1], seed, timeout, extra))  # warm-up, not counted
                bar.update(task, description=level.label)
                records: list = []
                try:
                    _, wall = asyncio.run(sv.run_level(url, model, level, specs[1:], seed + i, timeout, extra, on_done=lambda r: (records.append(r), bar.update(task, advance=1))))
                except KeyboardInterrupt:
                    stopped, wall = True, max((r.sent + (r.e2e or 0) for r in records), default=0.0)
                run["levels"].append({"concurrency": level.concurrency, "rate": level.rate, "summary": sv.summarize(records, wall, slo_ttft, slo_tpot), "records": [sv.record_dict(r) for r in records]})
                if stopped:
                    break
        except KeyboardInterrupt:
            stopped = True
    from localinfer.paths import write_atomic

    write_atomic(output, json.dumps(run, indent=1).encode())
    if plot is not None and run["levels"]:
        from localinfer.benchmark.plot import png

        png(run, plot)
    if json_out:
        print(json.dumps(run))
    else:
        print(serve_markdown(run))
        if sys.stdout.isatty() and len(run["levels"]) > 1:
            from localinfer.benchmark.plot import terminal

            print(terminal(run))
    err.print(f"[dim]written to {output}" + (f" and {plot}" if plot else "") + "[/dim]")
    if stopped:
        err.print("[yellow]stopped:[/yellow] what was measured is in the file")
        raise typer.Exit(130)


@bench_app.command("compare")
def compare(
    a: Annotated[Path, typer.Argument(help="A `bench serve` JSON file: the baseline.", show_default=False)],
    b: Annotated[Path, typer.Argument(help="Another, compared with it (B/A ratios).", show_default=False)],
) -> None:
    """Two `bench serve` runs side by side, with B/A ratios."""
    from localinfer.benchmark.report import compare_markdown

    print(compare_markdown(_read_run(a), _read_run(b)))


def _read_run(path: Path) -> dict:
    try:
        run = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise typer.BadParameter(f"{path} is not a bench serve JSON file") from None
    except json.JSONDecodeError as e:
        raise typer.BadParameter(f"{path} is not valid JSON ({e.msg}, line {e.lineno})") from None
    if not isinstance(run, dict) or not isinstance(run.get("levels"), list):
        raise typer.BadParameter(f"{path} is not a bench serve result (no levels)")
    return run


def _positive_rate(x: float) -> float:
    if not 0 < x < math.inf:
        raise typer.BadParameter(f"must be a finite number more than 0, not {x:g}")
    return x
