"""Reranking speed (issue 49): a BERT cross-encoder on our native engine against llama.cpp's
rank pooling, both through the Engine (`Engine.rank`, what /v1/rerank calls), on the same
file, the same query-document pairs and the same threads: pairs scored per second, for pairs
of 128 and 512 tokens at 1, 8 and 32 pairs a request.

The pairs are a short query and an English document cut to the chunk's tokens, tokenized once
(`tokenize_pair`: [CLS] query [SEP] document [SEP]) and handed to both engines as token ids.
Rounds alternate the engines; each timing scores --min-pairs pairs at least (a request of 1
is repeated), and the medians are compared. Out: a JSON line per (chunk, batch) on stdout,
the table on stderr, with the largest difference between the two engines' scores.

    .venv/bin/python bench/synthetic.py bert-base-reranker --types F16,Q8_0
    .venv/bin/python bench/rerank.py ~/.cache/localinfer/bench-models/bert-base-reranker-F16.gguf [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from embeddings import texts_of_exactly  # noqa: E402

from localinfer.devices import cpu_name  # noqa: E402
from localinfer.engine.engine import Engine  # noqa: E402
from localinfer.engine.loader import LoadOptions, open_engine  # noqa: E402

QUERY = "which of these passages says when the old lighthouse was built"


def pairs_of(engine: Engine, n_tokens: int, count: int, seed: int) -> list[list[int]]:
    """`count` pairs of exactly n_tokens tokens: the query, then a document made to fit."""
    query = len(engine.tokenize_pair(QUERY, "a")) - len(engine.tokenize_input("a")) + 1  # the query's tokens and its [SEP]
    return [engine.tokenize_pair(QUERY, doc) for doc in texts_of_exactly(engine, n_tokens - query, count, seed)]


def timed(engine: Engine, requests: list[list[list[int]]]) -> tuple[float, np.ndarray]:
    """Pairs per second over the requests, and the scores."""
    start = time.perf_counter()
    scores = [engine.rank(pairs) for pairs in requests]
    return sum(map(len, requests)) / (time.perf_counter() - start), np.concatenate(scores)


def measure(path: Path, chunks: list[int], batches: list[int], rounds: int, threads: int, min_pairs: int) -> list[dict]:
    engines = {name: open_engine(str(path), LoadOptions(engine=name, threads=threads)) for name in ("native", "llama.cpp")}
    rows = []
    try:
        assert all(e.kind == "rerank" for e in engines.values()), "not a reranker: make one with bench/synthetic.py bert-base-reranker"
        for chunk in chunks:
            pairs = pairs_of(engines["native"], chunk, max(batches), seed=chunk)
            for batch in batches:
                requests = [pairs[:batch]] * math.ceil(min_pairs / batch)
                rates: dict[str, list[float]] = {name: [] for name in engines}
                scores = {name: timed(e, [pairs[:batch]])[1] for name, e in engines.items()}  # warm-up
                for r in range(rounds):
                    print(f"{path.name}: {chunk} tokens, {batch} pairs, round {r + 1} of {rounds}", file=sys.stderr, flush=True)
                    for name, e in engines.items():
                        rates[name].append(timed(e, requests)[0])
                ours, theirs = statistics.median(rates["native"]), statistics.median(rates["llama.cpp"])
                rows.append({"model": path.name, "chunk": chunk, "batch": batch, "threads": threads, "cpu": cpu_name(), "native": ours, "llama_cpp": theirs,
                             "ratio": ours / theirs, "rounds": rates, "max_score_diff": float(np.abs(scores["native"] - scores["llama.cpp"]).max())})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
    finally:
        for e in engines.values():
            e.close()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("model", type=Path)
    ap.add_argument("--chunks", default="128,512")
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--min-pairs", type=int, default=32)
    args = ap.parse_args()
    rows = measure(args.model, [int(c) for c in args.chunks.split(",")], [int(b) for b in args.batches.split(",")], args.rounds, args.threads, args.min_pairs)
    print(f"{'chunk':>5} {'pairs':>5} {'native pairs/s':>15} {'llama.cpp pairs/s':>18} {'ratio':>6} {'max diff':>9}", file=sys.stderr)
    for r in rows:
        print(f"{r['chunk']:>5} {r['batch']:>5} {r['native']:>15.1f} {r['llama_cpp']:>18.1f} {r['ratio']:>5.2f}x {r['max_score_diff']:>9.1e}", file=sys.stderr)


if __name__ == "__main__":
    main()
