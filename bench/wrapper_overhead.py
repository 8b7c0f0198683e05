"""What localinfer's decode loop costs over llama.cpp itself, on the embedded model.

Three contenders generate the same greedy tokens from the same prompt, with the same
context, threads, batch and flash-attention settings, in one process, interleaved
round by round so that machine noise hits them alike:

  localinfer   Engine.generate(): our batch, numpy sampler, detokenizer, stop checks
  llama.cpp    llama-cpp-python's low-level API with llama.cpp's own greedy sampler in C:
               the least Python a caller can have per token
  Llama        llama-cpp-python's high-level Llama.create_completion(stream=True)
  CLI          `localinfer run --verbose --raw --repeat-penalty 1` in a subprocess, streaming to a pipe;
               its own TPOT line is parsed (it includes model load in another process)

Decode rate = (tokens - 1) / (time of last token - time of first token): prefill excluded.
We report medians over the rounds and each contender's ratio to llama.cpp's.

    .venv/bin/python bench/wrapper_overhead.py [--rounds 9] [--tokens 128] [--threads 2]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import time

import llama_cpp as C
from llama_cpp import Llama

from localinfer.backends.base import LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.engine.engine import Engine
from localinfer.engine.types import CompletionOutput, SamplingParams
from localinfer.store.pull import local_path
from localinfer.store.refs import resolve

PROMPT = "The history of the city of Rome begins"
N_CTX = 4096


def rate(stamps: list[float]) -> float:
    return (len(stamps) - 1) / (stamps[-1] - stamps[0])


def run_localinfer(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], float]:
    stamps, tokens = [], []
    for ev in engine.generate(prompt, SamplingParams(temperature=0, max_tokens=n)):
        if isinstance(ev, CompletionOutput):
            break
        stamps.append(time.perf_counter())
        tokens.append(ev.token)
    return tokens, rate(stamps)


class RawLoop:
    """The minimal llama-cpp-python decode loop: llama_decode + llama.cpp's greedy sampler."""

    def __init__(self, path: str, threads: int) -> None:
        mp = C.llama_model_default_params()
        self.model = C.llama_model_load_from_file(path.encode(), mp)
        cp = C.llama_context_default_params()
        cp.n_ctx, cp.n_batch, cp.n_ubatch, cp.n_threads, cp.n_threads_batch = N_CTX, 512, 512, threads, threads
        cp.no_perf = True
        self.ctx = C.llama_init_from_model(self.model, cp)
        self.sampler = C.llama_sampler_init_greedy()
        self.mem = C.llama_get_memory(self.ctx)

    def generate(self, prompt: list[int], n: int) -> tuple[list[int], float]:
        C.llama_memory_clear(self.mem, True)
        arr = (C.llama_token * len(prompt))(*prompt)
        C.llama_decode(self.ctx, C.llama_batch_get_one(arr, len(prompt)))
        tokens, stamps = [], []
        one = (C.llama_token * 1)()
        for _ in range(n):
            tok = C.llama_sampler_sample(self.sampler, self.ctx, -1)
            stamps.append(time.perf_counter())
            tokens.append(tok)
            one[0] = tok
            C.llama_decode(self.ctx, C.llama_batch_get_one(one, 1))
        return tokens, rate(stamps)


def run_high_level(llm: Llama, prompt: str, n: int) -> tuple[list[int], float]:
    stamps = []
    for _ in llm.create_completion(prompt, max_tokens=n, temperature=0, stream=True):
        stamps.append(time.perf_counter())
    return [], rate(stamps)


def run_cli(prompt: str, n: int, threads: int) -> tuple[list[int], float]:
    out = subprocess.run(
        [sys.executable, "-m", "localinfer", "run", "--verbose", "--raw", "--temperature", "0", "--repeat-penalty", "1",
         "--max-tokens", str(n), "--threads", str(threads), "--ctx", str(N_CTX), prompt],
        capture_output=True, text=True, check=True,
    )
    return [], float(re.search(r"TPOT [\d.]+ ms \(([\d.]+) tok/s\)", out.stderr).group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    path = local_path(resolve(None))
    engine = Engine(LlamaCppBackend.load(path, LoadParams(n_ctx=N_CTX, n_threads=args.threads)))
    raw = RawLoop(str(path), args.threads)
    llm = Llama(str(path), n_ctx=N_CTX, n_threads=args.threads, n_threads_batch=args.threads, flash_attn=True, verbose=False)
    prompt = engine.tokenize_prompt(PROMPT)

    ours_tokens, _ = run_localinfer(engine, prompt, args.tokens)  # warm-up, and the reference tokens
    raw_tokens, _ = raw.generate(prompt, args.tokens)
    assert ours_tokens == raw_tokens, "both must decode the same greedy tokens"
    run_high_level(llm, PROMPT, args.tokens)

    rates: dict[str, list[float]] = {"localinfer": [], "llama.cpp (low-level)": [], "Llama (high-level)": [], "localinfer run (CLI)": []}
    for _ in range(args.rounds):
        rates["localinfer"].append(run_localinfer(engine, prompt, args.tokens)[1])
        rates["llama.cpp (low-level)"].append(raw.generate(prompt, args.tokens)[1])
        rates["Llama (high-level)"].append(run_high_level(llm, PROMPT, args.tokens)[1])
        rates["localinfer run (CLI)"].append(run_cli(PROMPT, args.tokens, args.threads)[1])

    base = statistics.median(rates["llama.cpp (low-level)"])
    result = {
        "model": str(path.name), "threads": args.threads, "tokens": args.tokens, "rounds": args.rounds,
        "prompt_tokens": len(prompt),
        "decode_tokens_per_s": {k: round(statistics.median(v), 2) for k, v in rates.items()},
        "ratio_to_llama_cpp": {k: round(statistics.median(v) / base, 4) for k, v in rates.items()},
        "per_round_ratio_localinfer": [round(a / b, 4) for a, b in zip(rates["localinfer"], rates["llama.cpp (low-level)"])],
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"{path.name}, {args.threads} threads, {args.tokens} greedy tokens, median of {args.rounds} interleaved rounds")
    for k, v in rates.items():
        print(f"  {k:24s} {statistics.median(v):8.2f} tok/s   ratio {statistics.median(v) / base:.4f}")
    ratios = result["per_round_ratio_localinfer"]
    print(f"  localinfer / llama.cpp per round: median {statistics.median(ratios):.4f}, min {min(ratios):.4f}, max {max(ratios):.4f}")


if __name__ == "__main__":
    sys.exit(main())
