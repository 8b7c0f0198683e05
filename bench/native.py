"""The native engine's speed, next to numpy and llama.cpp, in one run on one machine.

Three parts, all at the same thread count:

  kernels   GB/s of weight bytes read by each kernel set's matvec (n = 1) on a 4096x4096
            matrix of every type, next to a single-thread numpy read (.sum()) of a buffer
            of the same size, float64 and float32, measured in the same rounds.
  engine    decode and prefill tokens/s on the embedded model: --engine native with the C
            kernels (and, on a CPU with AMX, with LOCALINFER_AMX=0 too), with the Numba
            kernels, and llama.cpp; all through the same Engine
            loop, greedy, rounds interleaved, each contender in a fresh process per round
            (in one process, three spinning thread pools would fight over the cores).
  cold      wall time from starting `localinfer run --engine native` to its first byte of
            answer on stdout: C kernels, Numba with its cache warm, Numba with an empty cache.

    .venv/bin/python bench/native.py [--threads 2] [--rounds 7] [--json] [--skip cold] [--model Q4_K_M.gguf --prefill 512]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as Q

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.native.blocks

from localinfer.backends.base import Batch, LoadParams  # noqa: E402
from localinfer.backends.llamacpp import LlamaCppBackend  # noqa: E402
from localinfer.backends.native import NativeBackend  # noqa: E402
from localinfer.engine.engine import Engine  # noqa: E402
from localinfer.engine.types import CompletionOutput, SamplingParams  # noqa: E402
from localinfer.store.pull import local_path  # noqa: E402
from localinfer.store.refs import resolve  # noqa: E402
from localinfer_native import load_kernels  # noqa: E402
from tests.native.blocks import random_qmatrix  # noqa: E402

KERNEL_TYPES = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.Q4_K, Q.Q5_K, Q.Q6_K, Q.F16, Q.F32]
SETS = ["c", "numba"]
SIZE = 4096


def best_of(fn, reps: int) -> float:
    """Median seconds of `reps` calls (after one warm-up)."""
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def bench_kernels(threads: int, rounds: int) -> list[dict]:
    rng = np.random.default_rng(0)
    kernels = {name: load_kernels(name, threads) for name in SETS}
    x = rng.standard_normal((1, SIZE), dtype=np.float32)
    rows = []
    for qtype in KERNEL_TYPES:
        m = random_qmatrix(qtype, SIZE, SIZE, rng)
        y = np.empty((1, SIZE), np.float32)
        ops = {name: k.matmul_op([m]) for name, k in kernels.items()}
        f64, f32 = np.ones(m.nbytes // 8), np.ones(m.nbytes // 4, np.float32)
        samples: dict[str, list[float]] = {key: [] for key in [*SETS, "numpy f64", "numpy f32"]}
        for _ in range(rounds):  # interleaved, so noise hits every contender alike
            samples["numpy f64"].append(best_of(f64.sum, 5))
            samples["numpy f32"].append(best_of(f32.sum, 5))
            for name, op in ops.items():
                samples[name].append(best_of(lambda op=op: op(x, (y,)), 5))
        gbs = {key: m.nbytes / statistics.median(ts) / 1e9 for key, ts in samples.items()}
        row = {"type": qtype.name, "mbytes": m.nbytes / 1e6, **{f"{k} GB/s": v for k, v in gbs.items()}}
        for name in SETS:
            row[f"{name} / numpy f64"] = gbs[name] / gbs["numpy f64"]
            row[f"{name} / numpy f32"] = gbs[name] / gbs["numpy f32"]
        rows.append(row)
        print(
            f"{qtype.name:5} {m.nbytes / 1e6:6.1f} MB | numpy f64 {gbs['numpy f64']:5.1f} f32 {gbs['numpy f32']:5.1f} GB/s | "
            + " | ".join(f"{n} {gbs[n]:5.1f} GB/s ({gbs[n] / gbs['numpy f64']:.2f}x f64, {gbs[n] / gbs['numpy f32']:.2f}x f32)" for n in SETS),
            flush=True,
        )
    return rows


PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."


def decode_rate(engine: Engine, prompt: list[int], n: int) -> tuple[list[int], float]:
    stamps, tokens = [], []
    for ev in engine.generate(prompt, SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=n)):
        if isinstance(ev, CompletionOutput):
            break
        stamps.append(time.perf_counter())
        tokens.append(ev.token)
    return tokens, (len(stamps) - 1) / (stamps[-1] - stamps[0])


def prefill_rate(backend, tokens: list[int]) -> float:
    backend.kv_clear(0)  # the engine keeps a finished request's cache in its slot for reuse
    t = time.perf_counter()
    backend.forward(Batch.for_sequence(tokens, 0))
    elapsed = time.perf_counter() - t
    backend.kv_clear(0)
    return len(tokens) / elapsed


CONTENDERS = ["native c", "native c, AMX off", "native numba", "llama.cpp"]
AMX_OFF = "native c, AMX off"  # on a CPU with AMX: the C kernels as a CPU without it runs them


def contenders() -> list[str]:
    """AMX off only where there is AMX to turn off."""
    return [n for n in CONTENDERS if n != AMX_OFF or "amx" in load_kernels("c", 1).describe()]


def engine_worker(name: str, threads: int, n_tokens: int, n_prefill: int, model: str | None) -> None:
    """One contender in its own process (so no two thread pools spin against each other):
    warm up, then print one JSON line with its decode and prefill rates and its tokens."""
    path = Path(model) if model else local_path(resolve(None))
    params = LoadParams(n_ctx=2048, n_threads=threads)
    if name == "llama.cpp":
        backend = LlamaCppBackend.load(path, params)
    else:
        backend = NativeBackend.load(path, LoadParams(**{**params.__dict__, "kernels": name.split()[1].rstrip(",")}))
    engine = Engine(backend)
    prompt = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": PROMPT}]))
    long_text = (Path(__file__).resolve().parent.parent / "README.md").read_text() * 4
    long_prompt = backend.tokenize(long_text, add_special=False)[:n_prefill]
    decode_rate(engine, prompt, 8)  # warm-up: page in, start threads
    prefill_rate(backend, long_prompt[:32])
    tokens, rate = decode_rate(engine, prompt, n_tokens)
    print(json.dumps({"decode": rate, "prefill": prefill_rate(backend, long_prompt), "tokens": tokens, "n_prefill": len(long_prompt)}))


def bench_engine(threads: int, rounds: int, n_tokens: int, n_prefill: int, model: str | None) -> dict:
    names = contenders()
    decode: dict[str, list[float]] = {n: [] for n in names}
    prefill: dict[str, list[float]] = {n: [] for n in names}
    outputs: dict[str, list[int]] = {}
    n_prompt = 0
    for r in range(rounds):  # interleaved, a fresh process per contender and round
        for name in names:
            out = subprocess.run(
                [sys.executable, __file__, "--engine-worker", name, "--threads", str(threads), "--tokens", str(n_tokens), "--prefill", str(n_prefill),
                 *(["--model", model] if model else [])],
                capture_output=True, text=True, check=True, env={**os.environ, **({"LOCALINFER_AMX": "0"} if name == AMX_OFF else {})},
            )  # fmt: skip
            row = json.loads(out.stdout.strip().splitlines()[-1])
            decode[name].append(row["decode"])
            prefill[name].append(row["prefill"])
            outputs.setdefault(name, row["tokens"])
            n_prompt = row["n_prefill"]
        print(f"round {r + 1}: " + " | ".join(f"{n} {decode[n][-1]:.1f} tok/s decode, {prefill[n][-1]:.0f} prefill" for n in names), flush=True)
    result = {
        "decode_tok_s": {n: statistics.median(v) for n, v in decode.items()},
        "prefill_tok_s": {n: statistics.median(v) for n, v in prefill.items()},
        "decode_rounds": decode,
        "prefill_rounds": prefill,
        "same_greedy_tokens_as_llama_cpp": {n: outputs[n] == outputs["llama.cpp"] for n in names},
        "n_tokens": n_tokens,
        "n_prefill": n_prompt,
    }
    base_d, base_p = result["decode_tok_s"]["llama.cpp"], result["prefill_tok_s"]["llama.cpp"]
    result["decode_ratio"] = {n: v / base_d for n, v in result["decode_tok_s"].items()}
    result["prefill_ratio"] = {n: v / base_p for n, v in result["prefill_tok_s"].items()}
    return result


def first_byte_seconds(args: list[str], env: dict[str, str]) -> float:
    t = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "localinfer", *args], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, env=env)
    assert proc.stdout is not None
    first = proc.stdout.read(1)
    elapsed = time.perf_counter() - t
    proc.stdout.read()
    proc.wait()
    if not first or proc.returncode:
        raise RuntimeError(f"localinfer {' '.join(args)} failed with code {proc.returncode}")
    return elapsed


def bench_cold(threads: int, rounds: int) -> dict:
    args = ["run", "--engine", "native", "--threads", str(threads), "--temperature", "0", "--max-tokens", "2", "Hello"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1"}
    result: dict[str, float] = {}
    cases = [("c kernels", ["--kernels", "c"], None), ("numba, warm cache", ["--kernels", "numba"], "warm"), ("numba, empty cache", ["--kernels", "numba"], "cold")]
    with tempfile.TemporaryDirectory() as warm_cache:
        for label, extra, cache in cases:
            times = []
            for i in range(rounds + 1):
                case_env = dict(env)
                if cache == "warm":
                    case_env["NUMBA_CACHE_DIR"] = warm_cache
                elif cache == "cold":
                    case_env["NUMBA_CACHE_DIR"] = tempfile.mkdtemp(prefix="numba-cold-")
                seconds = first_byte_seconds(args[:1] + extra + args[1:], case_env)
                if i > 0 or cache == "cold":  # the first start warms the OS file cache (and Numba's)
                    times.append(seconds)
            result[label] = statistics.median(times)
            print(f"cold start to first token, {label}: median {result[label]:.2f} s over {len(times)} starts", flush=True)
    return result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--tokens", type=int, default=128, help="tokens generated per decode round")
    ap.add_argument("--prefill", type=int, default=256, help="prompt tokens per prefill round")
    ap.add_argument("--skip", action="append", default=[], choices=["kernels", "engine", "cold"])
    ap.add_argument("--model", help="a GGUF file for the engine part (default: the embedded model)")
    ap.add_argument("--json", action="store_true", help="print all results as one JSON object at the end")
    ap.add_argument("--engine-worker", choices=CONTENDERS, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.engine_worker:
        return engine_worker(args.engine_worker, args.threads, args.tokens, args.prefill, args.model)
    out: dict[str, object] = {"threads": args.threads, "kernels": {name: load_kernels(name, args.threads).describe() for name in SETS}}
    print(f"threads {args.threads}; " + "; ".join(f"{k}" for k in out["kernels"].values()), flush=True)  # type: ignore[union-attr]
    if "kernels" not in args.skip:
        out["kernel_bandwidth"] = bench_kernels(args.threads, args.rounds)
    if "engine" not in args.skip:
        out["engine"] = bench_engine(args.threads, args.rounds, args.tokens, args.prefill, args.model)
        e = out["engine"]
        print("decode tok/s (median): " + ", ".join(f"{n} {v:.1f} ({e['decode_ratio'][n]:.2f}x)" for n, v in e["decode_tok_s"].items()))  # type: ignore[index]
        print("prefill tok/s (median): " + ", ".join(f"{n} {v:.0f} ({e['prefill_ratio'][n]:.2f}x)" for n, v in e["prefill_tok_s"].items()))  # type: ignore[index]
    if "cold" not in args.skip:
        out["cold_start_s"] = bench_cold(args.threads, max(3, args.rounds // 2))
    if args.json:
        print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
