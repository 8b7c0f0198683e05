"""`localinfer bench model`: prompt processing (ppN) and token generation (tgN) in tokens/s,
as llama-bench reports them, for every combination of engine, kernels, threads, KV types and
speculation, through our own Engine (so the figures are what `run` and `serve` get).

Each combination runs in a process of its own (`python -m localinfer.benchmark.model`): its
resident memory is its own, its thread pools start clean, and a crash or Ctrl-C loses only
that combination. The worker prints one JSON line per result as it is measured.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from localinfer.devices import cpu_name
from localinfer.errors import UserError

if TYPE_CHECKING:
    from localinfer.engine.loader import LoadOptions

VERIFY_ROWS = 8  # the verify cost reported: a forward of this many rows of one sequence, over one row


@dataclass(frozen=True)
class Setup:
    """One combination: everything that decides how a model runs."""

    model: str
    engine: str = "llama.cpp"
    kernels: str | None = None  # native engine only: c | numba (None: auto)
    threads: int = 2
    type_k: str = "f16"
    type_v: str = "f16"
    draft: str = "none"  # speculation: none, prompt-lookup, or a draft model (beside prompt lookup)
    gpu_layers: int | str = 0  # llama.cpp: layers offloaded, or "auto" (all that fit)
    cpu_moe: int | str = "auto"  # llama.cpp, a mixture of experts: the first N layers' experts in RAM, "all", or "auto" (planned)
    rpc: str = ""  # RPC workers the layers are split with, HOST:PORT comma-separated ("" none)


DRAFT_FIELDS = ("model_drafted", "model_accepted", "lookup_drafted", "lookup_accepted")


@dataclass
class Result:
    """One test of one setup. `samples` are tokens/s, one per repetition."""

    setup: Setup
    test: str  # "pp512" | "tg128"
    n_prompt: int
    n_gen: int
    samples: list[float]
    model_file: str = ""
    model_bytes: int = 0
    n_params: int = 0
    kernels_used: str = ""  # what `auto` picked, for the native engine
    verify_cost: float | None = None  # a VERIFY_ROWS-row forward over a 1-row forward
    model_drafted: int = 0  # speculation over the tg runs: the draft model's drafted and accepted tokens ...
    model_accepted: int = 0
    lookup_drafted: int = 0  # ... and prompt lookup's
    lookup_accepted: int = 0
    rss_bytes: int = 0  # the worker's resident memory after its tests
    round_trips_per_token: float | None = None  # with --rpc: requests a decoded token waits on a worker for
    rpc_bytes_per_token: float | None = None  # ... and the bytes it sends and receives
    cpu: str = field(default_factory=lambda: cpu_name())

    @property
    def avg(self) -> float:
        return statistics.fmean(self.samples) if self.samples else 0.0

    @property
    def stdev(self) -> float:
        return statistics.stdev(self.samples) if len(self.samples) > 1 else 0.0

    def as_dict(self) -> dict[str, object]:
        d = asdict(self)
        d.update(d.pop("setup"))
        d.update(avg_ts=round(self.avg, 3), stddev_ts=round(self.stdev, 3))
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Result:
        d = dict(d)
        setup = Setup(**{k: d.pop(k) for k in Setup.__dataclass_fields__})
        d.pop("avg_ts", None), d.pop("stddev_ts", None)
        return cls(setup=setup, **d)


def run(setups: list[Setup], prompts: list[int], gens: list[int], reps: int, on_result: Callable[[Result], None] | None = None, timeout: float = 1800) -> list[Result]:
    """Every test of every setup, each setup in a worker process. Ctrl-C stops the worker
    and returns what was measured (the caller writes it)."""
    results: list[Result] = []
    for setup in setups:
        job = json.dumps({"setup": asdict(setup), "prompts": prompts, "gens": gens, "reps": reps})
        proc = subprocess.Popen([sys.executable, "-m", "localinfer.benchmark.model"], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            proc.stdin.write(job)  # type: ignore[union-attr]
            proc.stdin.close()  # type: ignore[union-attr]
            deadline = time.monotonic() + timeout
            for line in proc.stdout:  # type: ignore[union-attr]
                reply = json.loads(line)
                if "error" in reply:
                    raise UserError(f"{setup.engine} on {setup.model}: {reply['error']}")
                result = Result.from_dict(reply)
                results.append(result)
                if on_result:
                    on_result(result)
                if time.monotonic() > deadline:
                    raise UserError(f"{setup.engine} on {setup.model} took over {timeout:.0f} s; stopped")
            if proc.wait() != 0 and not any(r.setup == setup for r in results):
                raise UserError(f"{setup.engine} on {setup.model} failed: {_last_line(proc.stderr.read())}")  # type: ignore[union-attr]
        except KeyboardInterrupt:
            break
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    return results


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else "no output"


def verify_rows_cost(backend, slot: int, rows: int, repeats: int = 3) -> float:
    """An n-row forward of one sequence over a 1-row one, on `slot` (left empty): what a
    speculative verify of n - 1 drafted tokens costs. Each count's best of `repeats` rounds,
    each round trying both: memory speed drifts over seconds, and a slow spell then touches
    both alike. The first forward pays for first touches (pages, buffers), so it is untimed."""
    from localinfer.backends.base import Batch

    token = backend.vocab.bos_id if backend.vocab.bos_id is not None else 0
    backend.kv_clear(slot)
    backend.forward(Batch.for_sequence([token] * rows, 0, slot, all_logits=True))
    best = {1: float("inf"), rows: float("inf")}
    for _ in range(repeats):
        for n in best:
            backend.kv_clear(slot)
            t0 = time.perf_counter()
            backend.forward(Batch.for_sequence([token] * n, 0, slot, all_logits=True))
            best[n] = min(best[n], time.perf_counter() - t0)
    backend.kv_clear(slot)
    return max(best[rows] / best[1], 1.0)


# --- the worker ----------------------------------------------------------------------------
def measure(setup: Setup, prompts: list[int], gens: list[int], reps: int) -> Iterator[Result]:
    """The tests of one setup, in this process."""
    import psutil

    from localinfer.engine.loader import LoadOptions, open_engine
    from localinfer.engine.prompt_cache import CacheOptions
    from localinfer.engine.speculative import DraftConfig
    from localinfer.engine.types import SamplingParams

    ctx = max([*prompts, 1]) + max([*gens, 1]) + 16
    model = setup.draft if setup.draft not in ("none", "prompt-lookup") else None
    options = LoadOptions(engine=setup.engine, ctx=ctx, threads=setup.threads, kernels=setup.kernels, draft=DraftConfig() if setup.draft != "none" else None,
                          draft_model=model, cache=(setup.type_k, setup.type_v), gpu_layers=setup.gpu_layers, cpu_moe=setup.cpu_moe,
                          prompt_cache=CacheOptions(enabled=False), rpc=tuple(setup.rpc.split(",")) if setup.rpc else ())  # fmt: skip  # prefill is what is measured
    engine = open_engine(setup.model, options)
    results: list[Result] = []
    try:
        backend = engine.backend
        rng = np.random.default_rng(1234)
        banned = set(backend.vocab.special) | set(backend.vocab.eog_ids)
        ordinary = np.array([t for t in range(backend.vocab.n_vocab) if t not in banned])

        def tokens(n: int) -> list[int]:  # random tokens, as llama-bench uses: a new first token each time, so no prefix is reused
            return rng.choice(ordinary, size=n).tolist()

        # Warm-up at the largest prompt size, as llama-bench runs each test once untimed: on a
        # GPU the first large batch picks cuBLAS's kernels and was 10x slower (docs/benchmarks.md).
        engine.complete(tokens(max([*prompts, 8])), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
        facts = {"model_file": str(backend.facts.path), "model_bytes": os.path.getsize(backend.facts.path), "n_params": backend.facts.n_params,
                 "kernels_used": str(backend.runtime_report().get("kernels", ""))}  # fmt: skip
        tests = [("pp", n, 0) for n in prompts] + [("tg", 0, n) for n in gens]
        measured = []
        for kind, n_prompt, n_gen in tests:
            samples, drafts = [], np.zeros(4, dtype=int)
            for _ in range(reps):
                if kind == "pp":
                    out = engine.complete(tokens(n_prompt), SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
                    samples.append(out.timings.prompt_tokens_per_s)
                else:
                    out = engine.complete(tokens(4), SamplingParams(temperature=0, max_tokens=n_gen + 1, ignore_eos=True))
                    samples.append(out.timings.tokens_per_s)  # the n_gen tokens after the first: decode alone
                    t = out.timings
                    drafts += (t.model_drafted, t.model_accepted, t.lookup_drafted, t.lookup_accepted)
            measured.append(Result(setup, f"{kind}{n_prompt or n_gen}", n_prompt, n_gen, samples, **facts, **dict(zip(DRAFT_FIELDS, map(int, drafts)))))
        if measured:
            verify = verify_rows_cost(backend, 0, VERIFY_ROWS)
            me = psutil.Process()  # with the engine's own process, where it has one (--rpc)
            rss = me.memory_info().rss + sum(child.memory_info().rss for child in me.children(recursive=True))
            for result in measured:
                result.verify_cost, result.rss_bytes = verify, rss
                results.append(result)
    finally:
        engine.close()
    if options.rpc and results:
        trips, sent = network_per_token(setup.model, options)
        for result in results:
            result.round_trips_per_token, result.rpc_bytes_per_token = trips, sent
    yield from results


def network_per_token(model: str, options: LoadOptions) -> tuple[float, float]:
    """The round trips each decoded token waits on the workers for and the bytes it moves,
    counted through relays in a pass of its own (the relays' latency stays out of the timed
    runs): a 33-token answer's less a 1-token one's, over the 32 tokens between."""
    from dataclasses import replace

    from localinfer.benchmark.relay import CountingRelay
    from localinfer.engine.loader import open_engine
    from localinfer.engine.types import SamplingParams

    relays = [CountingRelay(endpoint) for endpoint in options.rpc]
    engine = open_engine(model, replace(options, rpc=tuple(r.endpoint for r in relays), draft=None))
    try:
        counts = []
        for n, first in ((1, 5), (1, 7), (33, 11)):  # different prompts: nothing reused from the slot; the first warms up (its graph's first run asks more)
            before = np.array([(r.round_trips, r.bytes) for r in relays]).sum(axis=0)
            engine.complete([first] * 8, SamplingParams(temperature=0, max_tokens=n, ignore_eos=True))
            counts.append(np.array([(r.round_trips, r.bytes) for r in relays]).sum(axis=0) - before)
        trips, sent = (counts[2] - counts[1]) / 32
        return float(trips), float(sent)
    finally:
        engine.close()
        for relay in relays:
            relay.close()


def _worker() -> None:
    job = json.loads(sys.stdin.read())
    try:
        for result in measure(Setup(**job["setup"]), job["prompts"], job["gens"], job["reps"]):
            print(json.dumps(result.as_dict()), flush=True)
    except UserError as e:
        print(json.dumps({"error": str(e)}), flush=True)


if __name__ == "__main__":
    _worker()
