"""Where one decode token's time goes in the native engine: the whole forward of one token
against the same bound products alone (every layer's q/k/v, o, gate/up and down, and the
lm_head, on one activation row; a mixture of experts' layer runs its whole FFN, routing
included, and counts the bytes of the experts a token takes), and against a plain read of
as many bytes as the products read (bench/bandwidth.py's kernel, on a buffer of that size). What is left after the
products is the norms, RoPE, attention, the residual and bias adds and the Python between
them. The three alternate, so that the memory's speed, which drifts on a shared machine by
a quarter within minutes, is the same for all: the read's time over the forward's is the
share of the measured read bandwidth that decode reaches.

    .venv/bin/python bench/decode_split.py --model ~/.cache/localinfer/bench-models/qwen2.5-1.5b-Q4_K_M.gguf [--threads 2]

With --engine llama.cpp, llama.cpp's 1-token forward against a plain read of the same
bytes (the file's, counted as the native engine reads them), alternating the same way: on
a shared machine whose memory speed drifts, this is the paired way to see how close each
engine comes to the bandwidth, and so the most one engine can gain over the other.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from bandwidth import read_bandwidth
from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native import NativeBackend
from localinfer.backends.native.weights import LayerWeights
from localinfer.benchmark.model import weights_read
from localinfer.modelfile import inspect


def layer_bytes(lw: LayerWeights) -> int:
    """What one token reads of a layer's products: all of a dense FFN, the router and the
    chosen share of a mixture of experts' (each expert's slices are equal)."""
    attention = sum(m.nbytes for m in (lw.wq, lw.wk, lw.wv, lw.wo))
    if lw.moe is None:
        return attention + sum(m.nbytes for m in (lw.w_gate, lw.w_up, lw.w_down))
    moe = lw.moe
    return attention + moe.router.nbytes + sum(m.nbytes for m in (moe.gate, moe.up, moe.down)) * moe.n_used // moe.n_expert


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=60)
    ap.add_argument("--engine", choices=["native", "llama.cpp"], default="native")
    args = ap.parse_args()
    if args.engine == "llama.cpp":
        llama_against_read(args.model, args.threads, args.rounds)
        return
    backend = NativeBackend.load(args.model, LoadParams(n_ctx=args.rounds + 64, n_threads=args.threads))
    model = backend.model
    backend.forward(Batch.for_sequence(list(range(1, 9)), 0))  # a short prompt: the cache is not empty
    ws = model.workspace(1)
    x = np.random.default_rng(0).standard_normal((1, model.config.n_embd)).astype(np.float32)
    logits = np.empty((1, model.weights.output.rows), np.float32)

    def products() -> None:
        for layer in range(len(model.qkv)):
            model.qkv[layer](x, ws.qkv_out)
            model.attn_out[layer](ws.attn, ws.o_out)
            if model.experts[layer] is not None:
                model.experts[layer](x, ws.o)
            else:
                model.gate_up[layer](x, ws.gate_up_out)
                model.down[layer](ws.gate, ws.o_out)
        model.lm_head(x, (logits,))

    weights = model.weights
    n_bytes = sum(layer_bytes(lw) for lw in weights.layers) + weights.output.nbytes
    plain = np.arange(n_bytes // 8, dtype=np.uint64)  # touched: every page mapped before timing
    times: list[tuple[float, float, float]] = []
    for i in range(args.rounds):
        t0 = time.perf_counter()
        backend.forward(Batch.for_sequence([5], 8 + i))
        t1 = time.perf_counter()
        products()
        t2 = time.perf_counter()
        read_bandwidth(plain, args.threads)
        times.append((t1 - t0, t2 - t1, time.perf_counter() - t2))
    forward, alone, read = (float(np.median(col)) * 1e3 for col in zip(*times))
    backend.close()
    rest = forward - alone
    print(f"{args.model.name}, {args.threads} threads: a 1-token forward {forward:.2f} ms ({1e3 / forward:.1f} tokens/s), "
          f"its products alone {alone:.2f} ms, the rest {rest:.2f} ms ({rest / forward * 100:.0f} %); "
          f"a plain read of the products' {n_bytes / 1e9:.3f} GB {read:.2f} ms ({n_bytes / read / 1e6:.1f} GB/s): "
          f"decode at {read / forward * 100:.0f} % of the read bandwidth")  # fmt: skip


def llama_against_read(path: Path, threads: int, rounds: int) -> None:
    backend = LlamaCppBackend.load(path, LoadParams(n_ctx=rounds + 64, n_threads=threads))
    backend.forward(Batch.for_sequence(list(range(1, 9)), 0))
    n_bytes = weights_read(inspect(path))  # what bench model's bytes_per_token counts of the weights
    plain = np.arange(n_bytes // 8, dtype=np.uint64)
    times: list[tuple[float, float]] = []
    for i in range(rounds):
        t0 = time.perf_counter()
        backend.forward(Batch.for_sequence([5], 8 + i))
        t1 = time.perf_counter()
        read_bandwidth(plain, threads)
        times.append((t1 - t0, time.perf_counter() - t1))
    forward, read = (float(np.median(col)) * 1e3 for col in zip(*times))
    backend.close()
    print(f"{path.name}, llama.cpp, {threads} threads: a 1-token forward {forward:.2f} ms ({1e3 / forward:.1f} tokens/s); "
          f"a plain read of its {n_bytes / 1e9:.3f} GB {read:.2f} ms ({n_bytes / read / 1e6:.1f} GB/s): "
          f"decode at {read / forward * 100:.0f} % of the read bandwidth")  # fmt: skip


if __name__ == "__main__":
    main()
