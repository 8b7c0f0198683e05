"""Issue 31's benchmark: TTFT of a 2,000-token prompt cold, put back from RAM, and put back
from disk by a new process (a restart), on each engine; decode speed with the cache on and
off (asked in turn in one process); and `bench serve`'s shared-prefix workload (one long system prompt) across a restart
of `serve`.

    .venv/bin/python bench/prompt_cache.py [--model GGUF] [--threads 2] [--repeats 3] [--json FILE]

Each phase runs in a process of its own, as a user's would: cold (--no-prompt-cache),
RAM (the cache on; the prompt asked once to fill it), disk (a new process, --cache-ram 0,
so that every block comes from the files the RAM phase wrote). Between two timed asks an
unrelated short prompt takes the one slot, so the slot never holds the prompt and only the
prompt cache can spare its prefill. TTFT is the engine's (queue, put-back, prefill of the
rest, first sample); figures are medians of --repeats. The files are read back from the
OS's page cache, as after a quick restart; a cold disk adds its read time (about 6 MB a
block on the embedded model).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PROMPT_TOKENS = 2000
ANSWER_TOKENS = 64
SYSTEM_WORDS = 182  # bench serve's shared-prefix --input-len: a system prompt of about 1,500 tokens
WORDS = "the keeper climbed to the lamp each evening and wrote the weather the ships and the tides in a book".split()


def phase(model: str, engine: str, threads: int, name: str, folder: str, repeats: int) -> dict[str, object]:
    """One phase, in this process: the TTFTs, decode rates and cached sources of `repeats` asks."""
    from localinfer.engine.loader import LoadOptions, open_engine
    from localinfer.engine.prompt_cache import CacheOptions
    from localinfer.engine.types import SamplingParams

    cache = {"cold": CacheOptions(enabled=False), "ram": CacheOptions(folder=Path(folder)), "disk": CacheOptions(ram_bytes=0, folder=Path(folder))}[name]
    e = open_engine(model, LoadOptions(engine=engine, ctx=PROMPT_TOKENS + ANSWER_TOKENS + 64, threads=threads, gpu_layers=0, prompt_cache=cache))
    try:
        text = " ".join(WORDS[i % len(WORDS)] + ("." if i % 13 == 12 else "") for i in range(3 * PROMPT_TOKENS))
        prompt = e.tokenize_prompt(text)[:PROMPT_TOKENS]
        other = e.tokenize_prompt("A short question about something else.")
        params = SamplingParams(temperature=0, max_tokens=ANSWER_TOKENS, ignore_eos=True)
        if name == "ram":
            e.complete(prompt, params)  # fills the cache
        runs = []
        for _ in range(repeats):
            e.complete(other, SamplingParams(temperature=0, max_tokens=2))
            out = e.complete(prompt, params)
            runs.append({"ttft_ms": out.timings.ttft_ms, "tokens_per_s": out.timings.tokens_per_s, "cached_from": out.cached_from, "text": out.text})
        return {"engine": e.backend.name, "phase": name, "runs": runs}
    finally:
        e.close()


def decode_pairs(model: str, engine: str, threads: int, folder: str, pairs: int) -> dict[str, object]:
    """Decode speed with the cache off and on, in one process, asked in turn (off, on, off,
    on...), so that the machine's drift falls on both alike: tokens/s of 128-token answers
    to the 2,000-token prompt, the cache on having put it back, the cache off computed it."""
    from localinfer.engine.loader import LoadOptions, open_engine
    from localinfer.engine.prompt_cache import CacheOptions
    from localinfer.engine.types import SamplingParams

    opened = {name: open_engine(model, LoadOptions(engine=engine, ctx=PROMPT_TOKENS + 256, threads=threads, gpu_layers=0, prompt_cache=cache))
              for name, cache in (("off", CacheOptions(enabled=False)), ("on", CacheOptions(folder=Path(folder))))}  # fmt: skip
    try:
        text = " ".join(WORDS[i % len(WORDS)] + ("." if i % 13 == 12 else "") for i in range(3 * PROMPT_TOKENS))
        prompt = opened["on"].tokenize_prompt(text)[:PROMPT_TOKENS]
        params = SamplingParams(temperature=0, max_tokens=128, ignore_eos=True)
        opened["on"].complete(prompt, params)  # fills the cache
        rates: dict[str, list[float]] = {"off": [], "on": []}
        for _ in range(pairs):
            for name, e in opened.items():
                e.complete(e.tokenize_prompt("A short question about something else."), SamplingParams(temperature=0, max_tokens=2))
                rates[name].append(e.complete(prompt, params).timings.tokens_per_s)
        return {"rates": rates, "change": statistics.median(on / off for on, off in zip(rates["on"], rates["off"])) - 1}
    finally:
        for e in opened.values():
            e.close()


def run_phase(model: str, engine: str, threads: int, name: str, folder: str, repeats: int) -> dict[str, object]:
    cmd = [sys.executable, __file__, "--worker", name, "--model", model, "--engine", engine, "--threads", str(threads), "--folder", folder, "--repeats", str(repeats)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=1800, cwd=ROOT)
    if r.returncode != 0:
        raise SystemExit(f"the {engine} {name} phase failed:\n{r.stderr[-2000:]}")
    return json.loads(r.stdout.strip().splitlines()[-1])


def engine_rows(model: str, engine: str, threads: int, repeats: int) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="localinfer-prompt-cache-") as folder:
        phases = {name: run_phase(model, engine, threads, name, folder, repeats) for name in ("cold", "ram", "disk")}
    with tempfile.TemporaryDirectory(prefix="localinfer-prompt-cache-") as folder:
        decode = run_phase(model, engine, threads, "decode", folder, 5)
    med = {name: statistics.median(r["ttft_ms"] for r in p["runs"]) for name, p in phases.items()}  # type: ignore[union-attr]
    texts = {r["text"] for p in phases.values() for r in p["runs"]}  # type: ignore[union-attr]
    return {
        "engine": engine, "ttft_ms": med, "ram_share": med["ram"] / med["cold"], "disk_share": med["disk"] / med["cold"],
        "decode_change_with_cache": decode["change"], "decode_tokens_per_s": decode["rates"], "same_text": len(texts) == 1,
        "cached_from": {name: p["runs"][-1]["cached_from"] for name, p in phases.items()}, "phases": phases,  # type: ignore[index]
    }  # fmt: skip


def serve_across_restart(model: str, threads: int) -> dict[str, object]:
    """bench serve's shared-prefix workload (one system prompt of about 1,500 tokens) against
    a fresh server with an empty cache folder, then against a restarted one on that folder.
    The workload's first request is timed by hand, since `bench serve` warms the server up
    with it: that first request is the one a restart used to make cold."""
    from localinfer.benchmark.serve import workload
    from tests.server.test_serve import Server

    first = workload("shared-prefix", 1, 0, SYSTEM_WORDS, 32)[0]
    runs = {}
    with tempfile.TemporaryDirectory(prefix="localinfer-prompt-cache-") as folder, tempfile.TemporaryDirectory() as out:
        for label in ("empty cache", "after a restart"):
            server = Server(model, "--cache-dir", folder, "--parallel", "1", "--draft", "none", "--threads", str(threads))
            try:
                runs[label] = timed_first(server, first.messages)
                path = Path(out) / f"{label}.json"
                subprocess.run([sys.executable, "-m", "localinfer.cli.app", "bench", "serve", "--url", server.url, "-c", "1", "-n", "6", "--workload", "shared-prefix",
                                "--input-len", str(SYSTEM_WORDS), "--output-len", "32", "-o", str(path)], check=True, capture_output=True, timeout=1800, cwd=ROOT)  # fmt: skip
                records = [r for level in json.loads(path.read_text())["levels"] for r in level["records"] if r.get("ttft") is not None]
                runs[label]["workload_median_ttft_ms"] = statistics.median(r["ttft"] * 1e3 for r in records)
            finally:
                server.stop()
    return runs


def timed_first(server, messages: list[dict]) -> dict[str, object]:  # type: ignore[no-untyped-def, type-arg]
    """TTFT of one streamed request, and the cached tokens its usage reports."""
    import time

    start, ttft, usage = time.perf_counter(), None, None
    stream = server.client().chat.completions.create(model=server.model, messages=messages, max_tokens=32, temperature=0, stream=True, stream_options={"include_usage": True})
    for chunk in stream:
        if ttft is None and chunk.choices and chunk.choices[0].delta.content:
            ttft = (time.perf_counter() - start) * 1e3
        usage = chunk.usage or usage
    return {"first_ttft_ms": ttft, "prompt_tokens": usage.prompt_tokens, "cached_tokens": usage.prompt_tokens_details.cached_tokens}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default=None, help="a GGUF (default: the embedded model)")
    ap.add_argument("--engines", default="native,llama.cpp")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--engine", help=argparse.SUPPRESS)
    ap.add_argument("--folder", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.model is None:
        from localinfer_quant.source import embedded_model_path

        args.model = str(embedded_model_path())
    if args.worker == "decode":
        print(json.dumps(decode_pairs(args.model, args.engine, args.threads, args.folder, args.repeats)))
        return
    if args.worker:
        print(json.dumps(phase(args.model, args.engine, args.threads, args.worker, args.folder, args.repeats)))
        return
    from localinfer.devices import cpu_name

    results: dict[str, object] = {"cpu": cpu_name(), "model": Path(args.model).name, "threads": args.threads, "prompt_tokens": PROMPT_TOKENS, "engines": []}
    for engine in args.engines.split(","):
        row = engine_rows(args.model, engine, args.threads, args.repeats)
        results["engines"].append(row)  # type: ignore[union-attr]
        t = row["ttft_ms"]
        print(f"{engine}: TTFT cold {t['cold']:.0f} ms, RAM {t['ram']:.0f} ms ({row['ram_share']:.1%}), disk {t['disk']:.0f} ms ({row['disk_share']:.1%}); "
              f"decode {row['decode_change_with_cache']:+.1%} with the cache; same text: {row['same_text']}", flush=True)  # fmt: skip
    results["serve"] = serve_across_restart(args.model, args.threads)
    print(json.dumps(results["serve"]), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
