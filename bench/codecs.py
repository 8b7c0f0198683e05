"""Throughput of the numpy quantization codecs (localinfer_quant.codecs) on one embedding-
sized tensor, the largest the embedded model has (49152 x 576; 18432 x 1536 for the
K-quants and IQ4_XS, whose rows must hold whole 256-element super-blocks): MB of float32
input per second, quantize and dequantize, median of several rounds.

This was once a wall-clock assert in the test suite ("under 10 s"); speed targets belong
here, where a slow shared machine gives a number instead of a failed build.

    .venv/bin/python bench/codecs.py [--rounds 5] [--types Q8_0,Q4_K] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q

from localinfer_quant import codecs


def measure(qtype: Q, x: np.ndarray, rounds: int) -> dict[str, float]:
    quantize, dequantize = [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        q = codecs.quantize(x, qtype)
        t1 = time.perf_counter()
        codecs.dequantize(q, qtype)
        t2 = time.perf_counter()
        quantize.append(t1 - t0)
        dequantize.append(t2 - t1)
    mb = x.nbytes / 1e6
    return {"quantize_s": statistics.median(quantize), "dequantize_s": statistics.median(dequantize),
            "quantize_MBps": mb / statistics.median(quantize), "dequantize_MBps": mb / statistics.median(dequantize)}  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--types", default="Q8_0,Q4_0,Q4_1,Q5_0,Q5_1,Q2_K,Q3_K,Q4_K,Q5_K,Q6_K,IQ4_NL,IQ4_XS,BF16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    x = np.random.default_rng(1).standard_normal((49152, 576)).astype(np.float32)
    # 256-element super-blocks need rows of whole blocks: the same numbers as 1536-wide rows
    wide = x.reshape(-1, 1536)
    results = {}
    for name in args.types.split(","):
        results[name] = measure(Q[name], wide if x.shape[1] % GGML_QUANT_SIZES[Q[name]][0] else x, args.rounds)
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"| type | quantize s | quantize MB/s | dequantize s | dequantize MB/s |  ({x.shape[0]}x{x.shape[1]} float32, median of {args.rounds})")
    print("|---|---:|---:|---:|---:|")
    for name, r in results.items():
        print(f"| {name} | {r['quantize_s']:.2f} | {r['quantize_MBps']:.0f} | {r['dequantize_s']:.2f} | {r['dequantize_MBps']:.0f} |")


if __name__ == "__main__":
    main()
