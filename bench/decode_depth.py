"""Decode and prefill deep in a context, one engine, each figure paired with the memory's read
speed: D random tokens prefilled in 512-token chunks (timed: a D-token prompt's prefill, its
TTFT), then 24 one-token forwards at positions D on, and after every 8 of them a 512 MiB read
(bench/bandwidth.py's kernel). On a machine whose memory speed changes within a minute, the
limit a row is held to is the bytes a token reads (the weights, and the KV cache at that
depth) over the read speed measured beside it. One JSON line per depth.

    .venv/bin/python bench/decode_depth.py ~/.cache/localinfer/bench-models/qwen2.5-1.5b-Q4_K_M.gguf --depths 16,4096,16384 --cache f16 --engine native
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from bandwidth import read_bandwidth
from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native import NativeBackend
from localinfer.backends.native.config import ModelConfig
from localinfer.benchmark.model import weights_read
from localinfer.kvtypes import position_bytes
from localinfer.modelfile import inspect

ENGINES = {"native": NativeBackend, "llama.cpp": LlamaCppBackend}


def prefill(backend, tokens: list[int]) -> float:
    """Seconds to compute `tokens` into an empty cache, 512 at a time."""
    backend.kv_clear(0)
    start = time.perf_counter()
    for at in range(0, len(tokens), 512):
        backend.forward(Batch.for_sequence(tokens[at : at + 512], at))
    return time.perf_counter() - start


def decode(backend, depth: int, rounds: int = 3, per_round: int = 8) -> tuple[float, float]:
    """Median ms of one-token forwards from `depth` on, and the median read speed beside them."""
    buf, times, speeds = np.ones(512 << 18, np.uint32), [], []
    for r in range(rounds):
        for i in range(per_round):
            start = time.perf_counter()
            backend.forward(Batch.for_sequence([500 + i], depth + r * per_round + i))
            times.append(time.perf_counter() - start)
        speeds.append(read_bandwidth(buf, 2)[0])
    return float(np.median(times)) * 1e3, float(np.median(speeds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", type=Path)
    parser.add_argument("--depths", default="16,4096,16384", help="comma-separated")
    parser.add_argument("--cache", default="f16", help="the K and V cache type")
    parser.add_argument("--engine", choices=ENGINES, default="native")
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    info, types = inspect(args.model), (args.cache, args.cache)
    config = ModelConfig.from_gguf(info)
    backend = ENGINES[args.engine].load(args.model, LoadParams(n_ctx=max(depths) + 64, n_threads=args.threads, cache_types=types))
    rng = np.random.default_rng(0)
    for depth in depths:
        seconds = prefill(backend, rng.integers(100, 20000, size=max(depth, 1)).tolist())
        ms, gbps = decode(backend, depth)
        read = weights_read(info) + (depth + 1) * position_bytes(config.n_head_kv, config.head_dim, types) * config.n_layer
        print(json.dumps({"model": args.model.name, "engine": args.engine, "cache": args.cache, "depth": depth, "decode_ms": round(ms, 3),
                          "bandwidth_gbps": round(gbps, 2), "of_limit": round(read / (gbps * 1e9) * 1e3 / ms, 3), "prefill_s": round(seconds, 2)}), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
