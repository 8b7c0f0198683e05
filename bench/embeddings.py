"""Embeddings per second on an encoder (issue 49): our Engine on llama.cpp against
llama-cpp-python's `Llama.embed` on the same file, the same texts and the same threads, for
inputs of exactly 128 and 512 tokens ([CLS] and [SEP] included) at 1, 8 and 32 inputs a
request. The issue's goal: at least as fast at 1, and 1.5x or more at 32.

Ours: `open_engine(path, LoadOptions(engine=ENGINE, threads=2))` (--engine: auto, native or
llama.cpp), then per request
`finish(engine.embed([engine.tokenize_input(t) for t in texts]))` (tokens, the forward,
pooling and L2, as `localinfer embed` and /v1/embeddings do). The Engine gives an encoder
32 sequences and forwards of 512 tokens of short inputs (embedding.GROUP_TOKENS): a request
of 32 128-token inputs is eight forwards, of 32 512-token inputs 32.

Theirs: `Llama(path, embedding=True, n_ctx=512, n_threads=2, n_threads_batch=2, verbose=False)`
with every other setting its default, then `llm.embed(texts)`, as a user calls it (verbose
off only spares stderr llama.cpp's log and a timing printout per call). What that gives:
n_batch 512 (its default, and Llama clamps it to n_ctx anyway), so `embed` packs inputs
into one llama_decode only while their tokens fit in 512 (four 128-token inputs; one
512-token input); its defaults normalize=False and truncate=True; flash attention off
(its flash_attn=False; ours is llama.cpp's "auto", on for a CPU); the pooling the file
names. n_threads_batch is set because llama.cpp runs a batch on those threads and Llama's
default for it is every core, not the 2 asked for. Both count the same tokens (checked:
its return_count against ours, on every request).

Every timing embeds --min-inputs inputs at least (a request of 1 is repeated 8 times), so
a measurement is tens of milliseconds or more. Each round times every (chunk, batch) on
both engines, the one that goes first alternating from round to round; an untimed warm-up
request of each (its first 4 inputs) comes first. Medians over --rounds. The warm-up's
vectors of the two are compared (max_diff: the largest difference of a unit vector's value;
their attention paths differ, so a few 1e-5 to 1e-4).

Out: one JSON line per (model, chunk, batch) on stdout with both rates (embeddings per
second), their ratio and every round's rate; the table on stderr. The text is English
prose, each input a different shuffle of its words, cut at word boundaries to exactly the
chunk's tokens.

    .venv/bin/python bench/synthetic.py bert-base --types F16,Q8_0
    .venv/bin/python bench/embeddings.py ~/.cache/localinfer/bench-models/bert-base-{Q8_0,F16}.gguf [--rounds 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from localinfer.devices import cpu_name
from localinfer.engine.embedding import finish
from localinfer.engine.engine import Engine
from localinfer.engine.loader import LoadOptions, open_engine
from localinfer.errors import UserError

LLAMA_N_CTX = 512
WARM_UP_INPUTS = 4  # a warm-up request's inputs at most: enough for each engine's first forward of that chunk
PROSE = """Retrieval starts with a question and a pile of documents. Each document is cut into
chunks of a few hundred words, and each chunk becomes a vector that places it among the
others by what it says. A search embeds the question the same way and returns the chunks
whose vectors lie closest to it. The best of those are read again by a reranker, which sees
the question and one chunk together, and the few that remain are handed to a chat model
that writes the answer. Most of the time goes into the first step, since every chunk of
every document must be embedded before the first search, and again whenever a document
changes. A library of ten thousand pages makes tens of thousands of chunks; at fifty chunks
a second that is a quarter of an hour on a laptop, at two hundred a few minutes. The model
that does it is small, an encoder of about a hundred million parameters that reads each
chunk in one pass, all of its words attending to each other, and pools what it read into
one vector of a few hundred numbers. Many chunks can share a pass, which keeps the matrix
products large and the cores busy.""".split()

Embed = Callable[[list[str]], tuple[np.ndarray, int]]  # texts -> ([n, n_embd] vectors, tokens counted)


@dataclass
class Row:
    """One (model, chunk, batch): both engines' embeddings per second over the rounds."""

    model: str
    engine: str  # ours: auto, native or llama.cpp, as --engine asked
    chunk: int  # tokens per input, [CLS] and [SEP] included
    batch: int  # inputs per request
    inputs_per_timing: int
    threads: int
    cpu: str
    ours: float  # median embeddings per second
    llama_cpp_python: float
    ratio: float  # ours / llama_cpp_python
    ours_rounds: list[float]
    llama_cpp_python_rounds: list[float]
    max_diff: float  # the largest difference between the two's unit vectors of the warm-up request


def texts_of_exactly(engine: Engine, n_tokens: int, count: int, seed: int) -> list[str]:
    """`count` different texts, each tokenized by tokenize_input to exactly n_tokens tokens:
    shuffles of PROSE's words, taken while they fit (WordPiece tokenizes each word apart,
    so a word's tokens are counted once), checked whole at the end."""
    cost = {w: len(engine.backend.tokenize(w, add_special=False, parse_special=False)) for w in dict.fromkeys([*PROSE, "a"])}
    marks = len(engine.tokenize_input("a")) - cost["a"]  # [CLS] and [SEP]
    rng = np.random.default_rng(seed)
    texts = []
    for _ in range(count):
        words, used = [], marks
        while used < n_tokens:
            fits = [w for w in rng.permutation(PROSE) if cost[w] <= n_tokens - used] or (["a"] if cost["a"] <= n_tokens - used else [])
            if not fits:
                raise UserError(f"cannot make a text of exactly {n_tokens} tokens with this model's vocabulary")
            for w in fits:
                if used + cost[w] <= n_tokens:
                    words.append(w)
                    used += cost[w]
        text = " ".join(words)
        if (got := len(engine.tokenize_input(text))) != n_tokens:
            raise UserError(f"a text made for {n_tokens} tokens has {got}: this model's tokenizer does not count words apart")
        texts.append(text)
    return texts


def ours(engine: Engine) -> Embed:
    def run(texts: list[str]) -> tuple[np.ndarray, int]:
        tokens = [engine.tokenize_input(t) for t in texts]
        return finish(engine.embed(tokens)), sum(map(len, tokens))

    return run


def theirs(llm) -> Embed:  # llm: llama_cpp.Llama
    def run(texts: list[str]) -> tuple[np.ndarray, int]:
        rows, count = llm.embed(texts, return_count=True)
        return np.asarray(rows, dtype=np.float32), count

    return run


def timed(embed: Embed, requests: list[list[str]], n_tokens: int) -> tuple[float, np.ndarray]:
    """Seconds for the requests one after another, and the first request's vectors;
    every request must have counted its inputs' tokens, no more, no less."""
    first = None
    start = time.perf_counter()
    for texts in requests:
        vectors, counted = embed(texts)
        if counted != n_tokens * len(texts):
            raise UserError(f"{counted} tokens counted for {len(texts)} inputs of {n_tokens}: the two engines would not do the same work")
        first = vectors if first is None else first
    return time.perf_counter() - start, first


def unit(vectors: np.ndarray) -> np.ndarray:
    return vectors / np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)


def measure(path: Path, chunks: list[int], batches: list[int], rounds: int, threads: int, min_inputs: int, seed: int, log: Callable[[str], None],
            engine_name: str = "auto") -> list[Row]:  # fmt: skip
    """Every (chunk, batch) on both sides, alternating, for one model file; ours on `engine_name`."""
    from llama_cpp import Llama

    engine = open_engine(str(path), LoadOptions(engine=engine_name, threads=threads))
    llm = None
    try:
        too_long = [c for c in chunks if c > min(engine.embed_limit, LLAMA_N_CTX)]
        if too_long:
            raise UserError(f"{path.name} takes at most {min(engine.embed_limit, LLAMA_N_CTX)} tokens an input here; --chunks {too_long} are longer")
        llm = Llama(str(path), embedding=True, n_ctx=LLAMA_N_CTX, n_threads=threads, n_threads_batch=threads, verbose=False)
        embeds = {"ours": ours(engine), "llama_cpp_python": theirs(llm)}
        plans = {}  # (chunk, batch) -> the requests of one timing
        for chunk in chunks:
            pool = texts_of_exactly(engine, chunk, max(max(batches), min_inputs), seed + chunk)
            for batch in batches:
                plans[chunk, batch] = [[pool[(i * batch + j) % len(pool)] for j in range(batch)] for i in range(math.ceil(min_inputs / batch))]
        warm_up = {key: [requests[0][:WARM_UP_INPUTS]] for key, requests in plans.items()}  # each request size's first, untimed
        firsts = {key: {name: timed(run, texts, key[0])[1] for name, run in embeds.items()} for key, texts in warm_up.items()}
        rates: dict[tuple[int, int], dict[str, list[float]]] = {key: {name: [] for name in embeds} for key in plans}
        for r in range(rounds):
            order = list(embeds) if r % 2 == 0 else list(reversed(embeds))
            for key, requests in plans.items():
                for name in order:
                    seconds, _ = timed(embeds[name], requests, key[0])
                    rates[key][name].append(sum(map(len, requests)) / seconds)
            log(f"{path.name}: round {r + 1} of {rounds}")
    finally:
        engine.close()
        if llm is not None:
            llm.close()
    rows = []
    for (chunk, batch), got in rates.items():
        a, b = statistics.median(got["ours"]), statistics.median(got["llama_cpp_python"])
        diff = float(np.abs(unit(firsts[chunk, batch]["ours"]) - unit(firsts[chunk, batch]["llama_cpp_python"])).max())
        rows.append(Row(path.name, engine_name, chunk, batch, sum(map(len, plans[chunk, batch])), threads, cpu_name(), a, b, a / b, got["ours"], got["llama_cpp_python"], diff))
    return rows


def table(rows: list[Row]) -> str:
    lines = [f"{'model':28} {'engine':9} {'chunk':>5} {'batch':>5} {'ours emb/s':>11} {'llama-cpp-python emb/s':>23} {'ratio':>6} {'max diff':>9}"]
    for r in rows:
        lines.append(f"{r.model:28} {r.engine:9} {r.chunk:5} {r.batch:5} {r.ours:11.1f} {r.llama_cpp_python:23.1f} {r.ratio:5.2f}x {r.max_diff:9.1e}")
    return "\n".join(lines)


def counts(text: str) -> list[int]:
    values = [int(v) for v in text.split(",") if v.strip()]
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"'{text}' is not a comma-separated list of positive counts")
    return values


def main(argv: list[str] | None = None) -> list[Row]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("models", nargs="+", type=Path, help="encoder GGUFs (bench/synthetic.py bert-base --types F16,Q8_0)")
    ap.add_argument("--chunks", type=counts, default=[128, 512], help="tokens per input, comma-separated (default 128,512)")
    ap.add_argument("--batches", type=counts, default=[1, 8, 32], help="inputs per request, comma-separated (default 1,8,32)")
    ap.add_argument("--rounds", type=int, default=5, help="timings per (chunk, batch) and engine; medians (default 5)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-inputs", type=int, default=8, help="inputs one timing embeds at least: smaller batches repeat (default 8)")
    ap.add_argument("--seed", type=int, default=0, help="the texts' shuffles")
    ap.add_argument("--engine", default="auto", choices=["auto", "native", "llama.cpp"], help="our engine (default auto: native where it runs the encoder)")
    args = ap.parse_args(argv)
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    rows: list[Row] = []
    try:
        if args.rounds < 1 or args.threads < 1 or args.min_inputs < 1:
            raise UserError("--rounds, --threads and --min-inputs must be at least 1")
        for path in args.models:
            if not path.is_file():
                raise UserError(f"{path}: no such file")
            for row in measure(path, args.chunks, args.batches, args.rounds, args.threads, args.min_inputs, args.seed, log, args.engine):
                print(json.dumps(asdict(row)), flush=True)
                rows.append(row)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    log(table(rows))
    return rows


if __name__ == "__main__":
    main()
