"""What the Engine's decode loop costs per token, beside the model (issue 46, part 3).

On a GPU a token's forward takes 2 ms and our loop's own cost (the batch, sampling, the
detokenizer, stop strings, events, scheduling) becomes a visible share of it; on a CPU it
hides behind 8 ms. Here the real `Engine` runs over `InstantBackend` (instant_backend.py),
whose forward returns precomputed logits at once, so what is timed is the loop alone.

Cases: vocabularies of 151,936 (Qwen2) and 32,000 (Llama 2); greedy (temperature 0) and
top-p (temperature 0.7, top-p 0.9, and the defaults' top-k 40 and min-p 0.05); 1 and 8
sequences at once; with no stop strings and with 2 that never match. Each run generates
`--tokens` tokens a sequence from a 32-token prompt, through the public API as a client
does (`complete` for one sequence; `submit`, `step` and reading every stream for several);
µs/token is the run's wall time over (sequences × tokens), µs/step its wall time over
tokens (what each stream waits between two tokens). Medians over `--runs` runs, the cases
interleaved run by run so that the machine's noise hits them alike. The floor beside it:
numpy's argmax over one row, hot in a core's cache and read from the table.

    .venv/bin/python bench/loop_cost.py [--tokens 512] [--runs 5] [--json]
        [--vocab 151936,32000] [--sampling greedy,top-p] [--seqs 1,8] [--stops 0,2]
        [--rows 16] [--draft] [--profile 25]

`--rows 16` reads the logits from a 16-row buffer (9.7 MB at 152k) instead of one row per
sequence kept hot in cache: a GPU's logits arrive in memory, not in a core's cache.
`--draft` turns prompt-lookup speculation on, as `run` has it by default: its bookkeeping
(it finds nothing to draft in answers that never repeat). `--profile N` runs each case once under cProfile instead, and prints its N functions with
the most own time, in µs a token.
"""

from __future__ import annotations

import argparse
import cProfile
import itertools
import json
import os
import platform
import pstats
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field

import numpy as np

from instant_backend import STOPS, InstantBackend
from localinfer.backends.base import Batch
from localinfer.engine.engine import Engine
from localinfer.engine.speculative import DraftConfig
from localinfer.engine.stream import RequestStream
from localinfer.engine.types import CompletionOutput, SamplingParams

TARGET_US = 40.0  # issue 46: greedy, 151,936 tokens, one sequence
PROMPT_TOKENS = 32
SAMPLING = {"greedy": {"temperature": 0.0}, "top-p": {"temperature": 0.7, "top_p": 0.9}}


@dataclass(frozen=True)
class Case:
    vocab: int
    sampling: str  # a SAMPLING key
    seqs: int  # sequences decoded at once
    stops: int  # stop strings (that never match): 0 or len(STOPS)

    def params(self, tokens: int) -> SamplingParams:
        return SamplingParams(**SAMPLING[self.sampling], max_tokens=tokens, seed=0, stop=STOPS[: self.stops])  # type: ignore[arg-type]


@dataclass
class Measured:
    case: Case
    tokens: int  # a sequence's
    seconds: list[float] = field(default_factory=list)  # each run's wall time
    cpu_seconds: list[float] = field(default_factory=list)  # ... and the CPU time of the thread that ran it

    def row(self) -> dict[str, object]:
        per_token = [s * 1e6 / (self.tokens * self.case.seqs) for s in self.seconds]
        cpu = statistics.median(self.cpu_seconds) * 1e6 / (self.tokens * self.case.seqs)
        return {**asdict(self.case), "tokens": self.tokens, "us_per_token": round(statistics.median(per_token), 2), "best_us_per_token": round(min(per_token), 2), "cpu_us_per_token": round(cpu, 2),
                "us_per_step": round(statistics.median(self.seconds) * 1e6 / self.tokens, 2), "runs_us_per_token": [round(u, 2) for u in per_token]}  # fmt: skip


def cpu_name() -> str:
    """The CPU as /proc/cpuinfo names it, with its family and model (a cloud's "AMD EPYC"
    says little alone: family 25 model 17 is a Zen 4 Genoa)."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                if not line.strip():
                    break  # the first processor's block is enough
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        return platform.processor() or "unknown CPU"
    family = f" (family {fields['cpu family']}, model {fields['model']})" if "cpu family" in fields and "model" in fields else ""
    return f"{fields.get('model name', platform.processor() or 'unknown CPU')}{family}, {os.cpu_count()} logical CPUs"


def prompts(backend: InstantBackend, n: int) -> list[list[int]]:
    """n different prompts of text tokens (the same ones every run)."""
    rng = np.random.default_rng(1)
    return [rng.integers(256, backend.vocab.n_vocab - 3, PROMPT_TOKENS).tolist() for _ in range(n)]


def drive(engine: Engine, streams: list[RequestStream]) -> list[CompletionOutput]:
    """Step the engine and read every stream as its client would, until each has ended."""
    done: dict[int, CompletionOutput] = {}
    while len(done) < len(streams):
        engine.step()
        for stream in streams:
            while (event := stream.get_nowait()) is not None:
                if isinstance(event, CompletionOutput):
                    done[stream.request_id] = event
    return [done[s.request_id] for s in streams]


def run_once(engine: Engine, backend: InstantBackend, case: Case, tokens: int) -> tuple[float, float, list[CompletionOutput]]:
    """One timed generation of `tokens` tokens on each of the case's sequences: its wall
    time, the CPU time of this thread (nothing else runs the loop, and nothing in it
    waits, so on an idle machine the two agree; on a busy one the CPU time is the steadier)
    and the outputs."""
    asked, params = prompts(backend, case.seqs), case.params(tokens)
    backend.reset()
    t0, c0 = time.perf_counter(), time.thread_time()
    if case.seqs == 1:
        outs = [engine.complete(asked[0], params)]
    else:
        outs = drive(engine, [engine.submit(p, params) for p in asked])
    seconds, cpu = time.perf_counter() - t0, time.thread_time() - c0
    for out in outs:
        out.raise_error()
        if out.completion_tokens != tokens or out.finish_reason != "length":
            raise SystemExit(f"error: a sequence ended early ({out.completion_tokens} of {tokens} tokens, {out.finish_reason})")
    return seconds, cpu, outs


def greedy_answer(backend: InstantBackend, tokens: int) -> list[int]:
    """One sequence's greedy answer: each forward's first candidate (tests check that it
    is numpy's argmax of the rows the backend returned)."""
    return backend.candidates[:tokens, 0].tolist()


def per_call_us(fn: object, n: int = 2000, rounds: int = 7) -> float:
    """Median over rounds of a call's mean CPU time (this thread's), in µs."""
    times = []
    for _ in range(rounds):
        t0 = time.thread_time()
        for _ in range(n):
            fn()  # type: ignore[operator]
        times.append((time.thread_time() - t0) * 1e6 / n)
    return round(statistics.median(times), 2)


def floor(backend: InstantBackend) -> dict[str, float]:
    """What no loop can go below: numpy's argmax over one row, hot in a core's cache and
    cold (a 16-row table, 9.7 MB at 152k, read a row at a time, as logits a GPU copied
    back are read), and the instant backend's forward itself."""
    n_vocab = backend.vocab.n_vocab
    hot = np.random.default_rng(2).standard_normal(n_vocab, dtype=np.float32)
    rows = itertools.cycle(list(np.random.default_rng(3).standard_normal((16, n_vocab), dtype=np.float32)))
    one = Batch.for_sequence([300], 0)
    result = {
        "argmax_hot_us": per_call_us(lambda: np.argmax(hot)),
        "argmax_cold_us": per_call_us(lambda: np.argmax(next(rows))),
        "forward_us": per_call_us(lambda: backend.forward(one)),
    }
    backend.reset()
    return result


def setup(cases: list[Case], tokens: int, n_rows: int | None, draft: bool) -> tuple[dict[Case, Engine], dict[Case, InstantBackend]]:
    """An engine per case, over a backend per vocabulary and sequence count; `draft`:
    prompt-lookup speculation on, as `run` has it by default (over answers that never
    repeat it finds nothing to draft: what is timed is its bookkeeping)."""
    made = {(c.vocab, c.seqs): InstantBackend(n_vocab=c.vocab, n_seq=c.seqs, n_rows=n_rows) for c in cases}
    backends = {c: made[c.vocab, c.seqs] for c in cases}
    config = DraftConfig() if draft else None
    return {c: Engine(backends[c], slots=c.seqs, defaults=c.params(tokens), draft=config) for c in cases}, backends


def measure(cases: list[Case], tokens: int, runs: int, n_rows: int | None, draft: bool) -> tuple[list[Measured], dict[int, dict[str, float]]]:
    """Each case's runs, interleaved, after a warm-up run each; and each vocabulary's floor."""
    engines, backends = setup(cases, tokens, n_rows, draft)
    measured = {c: Measured(c, tokens) for c in cases}
    for c in cases:  # the warm-up, and greedy's answer checked (speculation spends rows on timing its verify)
        *_, outs = run_once(engines[c], backends[c], c, tokens)
        if c.sampling == "greedy" and c.seqs == 1 and not draft and outs[0].tokens != greedy_answer(backends[c], tokens):
            raise SystemExit(f"error: the engine's greedy answer is not each row's top candidate ({c})")
    for _ in range(runs):
        for c in cases:
            seconds, cpu, _ = run_once(engines[c], backends[c], c, tokens)
            measured[c].seconds.append(seconds)
            measured[c].cpu_seconds.append(cpu)
    floors = {c.vocab: floor(backends[c]) for c in reversed(cases)}  # the first case's backend of each vocabulary
    for engine in engines.values():
        engine.close()
    return list(measured.values()), floors


def profile(cases: list[Case], tokens: int, n_rows: int | None, draft: bool, top: int) -> str:
    """Each case's `top` functions by own time under cProfile, in µs a token (cProfile's
    overhead inflates them all, the Python ones most: read shares, not totals)."""
    engines, backends = setup(cases, tokens, n_rows, draft)
    out = []
    for c in cases:
        run_once(engines[c], backends[c], c, tokens)  # warm
        with cProfile.Profile() as prof:
            run_once(engines[c], backends[c], c, tokens)
        stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
        per = 1e6 / (tokens * c.seqs)
        out += [f"{c.vocab:,} {c.sampling}, {c.seqs} sequence(s), {c.stops} stops: µs/token own, cumulative, calls/token, function"]
        for (file, line, name), (_, calls, own, cum, _) in sorted(stats.items(), key=lambda kv: -kv[1][2])[:top]:
            out.append(f"  {own * per:9.2f} {cum * per:9.2f} {calls / (tokens * c.seqs):6.2f}  {file.split('site-packages/')[-1]}:{line} {name}")
        out.append("")
        engines[c].close()
    return "\n".join(out)


def table(rows: list[dict[str, object]], floors: dict[int, dict[str, float]], head: str) -> str:
    lines = [head, "", f"{'vocab':>8}  {'sampling':<8} {'seqs':>4} {'stops':>5}  {'µs/token':>9} {'best':>7} {'CPU µs':>8} {'µs/step':>9}  runs (µs/token)"]
    for r in rows:
        spread = ", ".join(f"{u:.1f}" for u in r["runs_us_per_token"])  # type: ignore[attr-defined]
        lines.append(f"{r['vocab']:>8,}  {r['sampling']:<8} {r['seqs']:>4} {r['stops']:>5}  {r['us_per_token']:>9.1f} {r['best_us_per_token']:>7.1f} {r['cpu_us_per_token']:>8.1f} {r['us_per_step']:>9.1f}  {spread}")
    lines.append("")
    for v, f in floors.items():
        lines.append(f"floor at {v:,} (CPU µs): numpy argmax {f['argmax_hot_us']:.1f} hot in cache, {f['argmax_cold_us']:.1f} cold; the instant forward {f['forward_us']:.1f}")
    target = next((r for r in rows if (r["vocab"], r["sampling"], r["seqs"], r["stops"]) == (151_936, "greedy", 1, 0)), None)
    if target is not None:
        verdict = "met" if target["us_per_token"] <= TARGET_US else "not met"  # type: ignore[operator]
        lines.append(f"target (greedy, 151,936, 1 sequence, no stops) ≤ {TARGET_US:.0f} µs/token: {target['us_per_token']:.1f}, {verdict}")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--tokens", type=int, default=512, help="tokens a sequence generates per run")
    ap.add_argument("--runs", type=int, default=5, help="timed runs per case (the median is reported)")
    ap.add_argument("--vocab", default="151936,32000", help="vocabulary sizes, comma-separated")
    ap.add_argument("--sampling", default="greedy,top-p", help="greedy and/or top-p")
    ap.add_argument("--seqs", default="1,8", help="sequences at once, comma-separated")
    ap.add_argument("--stops", default=f"0,{len(STOPS)}", help=f"stop strings per request: 0 and/or {len(STOPS)} (never matching)")
    ap.add_argument("--rows", type=int, default=None, help="rows in the logits buffer (default: one per sequence, hot in cache; 16: read from memory, as a GPU's)")
    ap.add_argument("--draft", action="store_true", help="prompt-lookup speculation on, as run's default (its bookkeeping: it never finds a draft)")
    ap.add_argument("--json", action="store_true", help="print the results as JSON")
    ap.add_argument("--profile", type=int, metavar="N", help="instead of timing, one cProfile'd run a case: its N costliest functions")
    a = ap.parse_args()
    try:
        ints = lambda s: [int(x) for x in s.split(",") if x]  # noqa: E731
        samplings = [s for s in a.sampling.split(",") if s]
        if unknown := [s for s in samplings if s not in SAMPLING]:
            raise ValueError(f"unknown sampling {unknown[0]!r} (greedy, top-p)")
        cases = [Case(v, s, n, k) for v in ints(a.vocab) for s in samplings for n in ints(a.seqs) for k in ints(a.stops)]
        if not cases or a.tokens < 1 or a.runs < 1 or any(c.vocab < 1024 or c.seqs < 1 or c.stops not in (0, len(STOPS)) for c in cases):
            raise ValueError(f"no cases, or a vocabulary under 1024, sequences under 1, stops not 0 or {len(STOPS)}, tokens or runs under 1")
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    if a.profile:
        print(profile(cases, a.tokens, a.rows, a.draft, a.profile))
        return
    load = os.getloadavg()[0]
    measured, floors = measure(cases, a.tokens, a.runs, a.rows, a.draft)
    rows, load = [m.row() for m in measured], (load, os.getloadavg()[0])  # other work on the machine, before and after
    if a.json:
        print(json.dumps({"cpu": cpu_name(), "numpy": np.__version__, "python": platform.python_version(), "tokens": a.tokens, "runs": a.runs, "rows": a.rows, "draft": a.draft,
                          "load_average": load, "target_us": TARGET_US, "cases": rows, "floor": {str(v): f for v, f in floors.items()}}, indent=1))  # fmt: skip
    else:
        head = f"CPU: {cpu_name()}; numpy {np.__version__}, Python {platform.python_version()}; load average {load[0]:.1f} before, {load[1]:.1f} after"
        head += f"\nlogits: {f'{a.rows} rows in turn' if a.rows else 'one row a sequence, hot'}; speculation: {'prompt lookup' if a.draft else 'none'}"
        print(table(rows, floors, f"{head}\n{a.tokens} tokens a sequence, median of {a.runs} runs; µs/token = wall time / (sequences × tokens), best: the fastest run's, CPU µs: the median in this thread's CPU time"))


if __name__ == "__main__":
    main()
