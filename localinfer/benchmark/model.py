"""`localinfer bench model`: prompt processing (ppN) and token generation (tgN) in tokens/s,
as llama-bench reports them, for every combination of engine, kernels, threads, KV types and
speculation, through our own Engine (so the figures are what `run` and `serve` get), from an
empty cache or after a prefix of D tokens already in it (llama-bench's depth: "pp512 @ d4096").

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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from localinfer.devices import cpu_name
from localinfer.errors import UserError

if TYPE_CHECKING:
    from localinfer.engine.engine import Engine
    from localinfer.engine.loader import LoadOptions
    from localinfer.engine.types import Timings
    from localinfer.modelfile import GGUFInfo

VERIFY_ROWS = 8  # the verify cost reported: a forward of this many rows of one sequence, over one row
TG_LEAD = 4  # a tg test's prompt (after its depth): this many random tokens, then n_gen decoded


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
    test: str  # "pp512" | "tg128", and at a depth "pp512 @ d4096" | "tg128 @ d4096"
    n_prompt: int
    n_gen: int
    samples: list[float]
    n_depth: int = 0  # tokens already in the cache when the test's tokens are computed
    bytes_per_token: int | None = None  # tg: weights + KV cache one decoded token reads, on average
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


def run(setups: list[Setup], prompts: list[int], gens: list[int], reps: int, on_result: Callable[[Result], None] | None = None, timeout: float = 1800,
        depths: list[int] | None = None) -> list[Result]:  # fmt: skip
    """Every test of every setup at every depth (default: 0 alone), each setup in a worker
    process. Ctrl-C stops the worker and returns what was measured (the caller writes it)."""
    results: list[Result] = []
    for setup in setups:
        job = json.dumps({"setup": asdict(setup), "prompts": prompts, "gens": gens, "reps": reps, "depths": depths or [0]})
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


def llama_bench_name(kind: str, n: int, depth: int) -> str:
    """As llama-bench prints it: "pp512", "tg128", and at a depth "pp512 @ d4096"."""
    return f"{kind}{n}" + (f" @ d{depth}" if depth else "")


def check_context(name: str, trained: int | None, depths: Sequence[int], prompts: Sequence[int], gens: Sequence[int]) -> None:
    """Refuse, in one line, tests whose deepest prefix, longest prompt and longest answer
    together pass the context the model was trained on (nothing to check where the file
    does not say it)."""
    need = max(depths, default=0) + max(prompts, default=0) + max(gens, default=0)
    if trained and need > trained:
        terms = " + ".join(f"{flag} {max(values)}" for flag, values in (("-d", depths), ("-p", prompts), ("-n", gens)) if max(values, default=0))
        raise UserError(f"{terms} = {need} tokens, more than the {trained} that {name} was trained on: ask for less")


def weights_read(info: GGUFInfo) -> int:
    """The weight bytes one decoded token reads: the active ones (a mixture of experts' chosen
    share), less the token embedding table where the output has a matrix of its own (a token
    then reads one row of the table; tied, the table is the output matrix and read whole)."""
    nbytes = {t.name: t.nbytes for t in info.tensors}
    return info.active_tensor_bytes - (nbytes.get("token_embd.weight", 0) if "output.weight" in nbytes else 0)


def decode_bytes(weights: int, kv_bytes: Callable[[int], int], depth: int, n_gen: int) -> int:
    """What a tg test's decoded token reads on average: the weights, and the KV cache of every
    position it attends to. The first decoded token attends to the depth, the TG_LEAD-token
    prompt and itself; each later one to one more; `kv_bytes(n)` is n positions' cache."""
    first = depth + TG_LEAD + 1
    return weights + round(statistics.fmean(kv_bytes(n) for n in range(first, first + n_gen)))


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
def timed_run(engine: Engine, tokens: Callable[[int], list[int]], kind: str, n: int, depth: int) -> Timings:
    """One repetition of a test: `n` prompt tokens (pp) or `n` decoded ones (tg) after
    `depth` tokens already in the slot's cache.

    The prefix is computed first, untimed, as a request of its own; the timed request's
    prompt starts with it, so the slot's prefix reuse leaves only the new tokens to compute
    (its timings count only those: prompt tokens/s is the tokens prefilled, not the cached
    ones, over the prefill's time; decode tokens/s the answer's tokens after the first).
    Each repetition draws a new random prefix: it shares nothing with what the slot holds
    from the last one, so the slot is emptied and the prefix computed afresh, and the timed
    request finds exactly the cache a D-token prompt leaves, not a past repetition's answer
    left behind beyond it. Reusing the cache is checked, so a depth is never measured as a
    prefill of the whole sequence."""
    from localinfer.engine.types import SamplingParams

    def greedy(max_tokens: int) -> SamplingParams:
        return SamplingParams(temperature=0, max_tokens=max_tokens, ignore_eos=True)

    prefix = tokens(depth) if depth else []
    if prefix:
        engine.complete(prefix, greedy(1))
    out = engine.complete(prefix + tokens(n if kind == "pp" else TG_LEAD), greedy(1 if kind == "pp" else n + 1))
    if depth and out.cached_tokens != depth:
        raise UserError(f"the {depth}-token prefix was not reused from the cache ({out.cached_tokens} tokens were): {llama_bench_name(kind, n, depth)} cannot be measured")
    return out.timings


def measure(setup: Setup, prompts: list[int], gens: list[int], reps: int, depths: Sequence[int] = (0,)) -> Iterator[Result]:
    """The tests of one setup, in this process: at each depth, the pp tests then the tg ones
    (llama-bench's order)."""
    import psutil

    from localinfer.backends import get_backend
    from localinfer.engine.loader import LoadOptions, open_engine
    from localinfer.engine.prompt_cache import CacheOptions
    from localinfer.engine.speculative import DraftConfig
    from localinfer.engine.types import SamplingParams
    from localinfer.modelfile import inspect
    from localinfer.store.pull import ensure_local
    from localinfer.store.refs import resolve

    info = inspect(ensure_local(resolve(setup.model)))
    check_context(setup.model, info.context_length, depths, prompts, gens)  # the CLI checked a local file; a pulled one is checked here
    ctx = max(depths) + max([*prompts, 1]) + max([*gens, 1]) + 16
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
        weights, kv_class = weights_read(info), get_backend(setup.engine)
        kv_bytes = lambda n: kv_class.kv_cache_bytes(info, n, 1, (setup.type_k, setup.type_v))  # noqa: E731  (this engine's cache: a sliding window's layers hold less)
        tests = [test for d in depths for test in [(d, "pp", n, 0) for n in prompts] + [(d, "tg", 0, n) for n in gens]]
        measured = []
        for depth, kind, n_prompt, n_gen in tests:
            samples, drafts = [], np.zeros(4, dtype=int)
            for _ in range(reps):
                t = timed_run(engine, tokens, kind, n_prompt or n_gen, depth)
                samples.append(t.prompt_tokens_per_s if kind == "pp" else t.tokens_per_s)  # tg: the n_gen tokens after the first, decode alone
                if kind == "tg":
                    drafts += (t.model_drafted, t.model_accepted, t.lookup_drafted, t.lookup_accepted)
            read = decode_bytes(weights, kv_bytes, depth, n_gen) if kind == "tg" else None
            measured.append(Result(setup, llama_bench_name(kind, n_prompt or n_gen, depth), n_prompt, n_gen, samples, depth, read, **facts, **dict(zip(DRAFT_FIELDS, map(int, drafts)))))
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
        for result in measure(Setup(**job["setup"]), job["prompts"], job["gens"], job["reps"], job.get("depths", [0])):
            print(json.dumps(result.as_dict()), flush=True)
    except UserError as e:
        print(json.dumps({"error": str(e)}), flush=True)


if __name__ == "__main__":
    _worker()
