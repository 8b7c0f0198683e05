"""KV-cache types, measured in one run: what each costs in quality and what it saves in bytes.

For each K/V type pair on each engine: KV bytes per token, perplexity and its shift from an
f16 cache, the KL divergence of the next-token distributions from an f16 cache of the same
weights on the same engine (mean and p99) and top-1 agreement, at --ctx 2048 over the first
chunks of Alice in Wonderland; and decode tokens/s with 2,000 tokens of context.

    .venv/bin/python bench/kv_types.py [--engines llama.cpp,native] [--threads 2] [--chunks 4] [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localinfer import memory  # noqa: E402
from localinfer.backends import get_backend  # noqa: E402
from localinfer.backends.base import Backend, LoadParams  # noqa: E402
from localinfer.engine.engine import Engine  # noqa: E402
from localinfer.engine.types import SamplingParams  # noqa: E402
from localinfer.modelfile import inspect  # noqa: E402
from localinfer.quality.evaluate import evaluate_many  # noqa: E402
from localinfer.store.pull import local_path  # noqa: E402
from localinfer.store.refs import resolve  # noqa: E402

PAIRS = {
    "llama.cpp": [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q5_1", "q5_0"), ("q4_0", "q4_0")],
    "native": [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_0", "q4_0")],
}
CTX = 2048


def decode_speed(backend: Backend, text: str) -> float:
    """Greedy decode tokens/s after a 2,000-token prompt."""
    engine = Engine(backend)
    prompt = backend.tokenize(text, add_special=True)[:2000]
    return engine.complete(prompt, SamplingParams(temperature=0, max_tokens=64, repeat_penalty=1.0)).timings.tokens_per_s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engines", default="llama.cpp,native", help="comma-separated: llama.cpp, native")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=4)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = local_path(resolve(None))
    info = inspect(path)
    text = (ROOT / "tests" / "data" / "alice_in_wonderland.txt").read_text()
    f16_bytes = memory.kv_cache_bytes(info, 1)
    rows = []
    for engine in args.engines.split(","):
        rows += measure_engine(engine, path, info, text, f16_bytes, args)
    for r in rows:
        print(f"{r['engine']:9} {r['types']:10} {r['bytes_per_token']:7,} B/token ({r['share_of_f16']:.1%} of f16) | ppl {r['perplexity']:.4f} ({r['ppl_shift']:+.2%})"
              f" | KLD mean {r['kld_mean']:.5f} p99 {r['kld_p99']:.5f} | top-1 {r['top1']:.2%} | decode at 2,000 ctx {r['decode_tok_s']:.1f} tok/s", flush=True)  # fmt: skip
    if args.json:
        print(json.dumps(rows, indent=2))


def measure_engine(engine: str, path: Path, info, text: str, f16_bytes: int, args: argparse.Namespace) -> list[dict]:
    """The table's rows of one engine, scored against an f16 cache on that engine."""
    load = get_backend(engine).load
    backends = {pair: load(path, LoadParams(n_ctx=CTX + 64, n_threads=args.threads, cache_types=pair)) for pair in PAIRS[engine]}
    reference = load(path, LoadParams(n_ctx=CTX + 64, n_threads=args.threads))
    try:
        tokens = reference.tokenize(text, add_special=False)
        scores = evaluate_many({"/".join(p): b for p, b in backends.items()}, tokens, CTX, reference, args.chunks)
        rows = []
        for pair, backend in backends.items():
            s = scores["/".join(pair)]
            per_token = memory.kv_cache_bytes(info, 1, pair)
            rows.append({"engine": engine, "types": "/".join(pair), "bytes_per_token": per_token, "share_of_f16": per_token / f16_bytes,
                         "perplexity": s.perplexity, "kld_mean": s.kld["mean"], "kld_p99": s.kld["p99"], "top1": s.top1_agreement,
                         "decode_tok_s": decode_speed(backend, text)})  # fmt: skip
    finally:
        for b in [*backends.values(), reference]:
            b.close()
    for r in rows:
        r["ppl_shift"] = r["perplexity"] / rows[0]["perplexity"] - 1
    return rows


if __name__ == "__main__":
    main()
