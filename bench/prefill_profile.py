"""Where a prompt's time goes in the native engine, and how far each product is from the machine's
peak: the profile behind "make prefill fast" (issue 27).

Three parts, each for every thread count of --threads:

1. Peak multiply-add throughput of this machine, measured by li_peak_gmacs (native/c/membench.c,
   in the C kernels library): independent accumulator chains of one instruction (sequence) and
   nothing else, on every thread at once. int8: 512-bit vpdpbusd (AVX512-VNNI), 256-bit vpdpbusd
   (AVX512-VL VNNI or AVX-VNNI), and AVX2's vpmaddubsw + vpmaddwd + vpaddd; fp32: 256- and 512-bit
   FMA. Only the kinds this build of the C kernels has (its -march) are measured. A MAC is one
   multiply-add (an FMA's two flops). Each figure is the median of --rounds runs of about
   --peak-seconds each.

2. Matrix products: each distinct (op, block types, rows, k) of the model's layers (q/k/v fused,
   o, gate/up fused, down, as the native engine binds them, from the file's own tensors; "layers"
   says how many layers have it) for --tokens activation rows, and the lm_head for 1 row (a
   prompt wants the last row's logits only). Each is timed as the C kernels' bound matmul op,
   median of --rounds calls after one warm-up, with every row on the kernels' fast path
   (n_fast = n), as the forward pass runs the prompt's rows (the lm_head's one row takes the
   exact path, n_fast = 0, as the wanted row does); once with matrices repacked into panels
   (the default, CKernels(pack=True)) and once without (LOCALINFER_PACK=0, CKernels(pack=False)).
   GMAC/s is n x rows x k over the time; "% peak" sets it against the peak of the instruction
   that path of this build uses (li_peak_kind: the panels' or the row dots' int8 instruction,
   fp32 FMA for F16/BF16/F32 matrices), at the same thread count.

3. One forward pass of --tokens prompt tokens (ppN: logits for the last token only) through the
   native engine, loaded with the engine's defaults but the C kernels (f16 KV cache; panels
   unless LOCALINFER_PACK=0; n_batch 512: longer prompts run in chunks of 512, as the engine
   runs them), with every bound product and kernel call of the Transformer wrapped in a timer:
   embed, rms_norm, qkv product, rope, attention, o product, gate/up product, swiglu, down
   product (a mixture of experts' layer: its whole FFN, routing and products, as one), final
   norm, lm_head, each summed over layers. The residual adds and the qwen2 q/k/v
   bias adds are numpy statements inside forward.py, which this tool does not change: they are
   in the remainder (total minus the timed parts), together with the forward's own Python work
   and the timers' overhead (two clock reads a call).
   The breakdown shown is that of the round whose total is the median, after one warm-up round.

    .venv/bin/python bench/prefill_profile.py --model ~/.cache/localinfer/bench-models/qwen2.5-1.5b-Q4_K_M.gguf \\
        [--tokens 512] [--rounds 3] [--threads 1,2] [--peak-seconds 0.25] [--json]

Synthetic models of real shapes: bench/synthetic.py. Run nothing else on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import math
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localinfer.devices import cpu_name, cpu_simd_flags  # noqa: E402
from localinfer_native import KernelsUnavailable, membench  # noqa: E402
from localinfer.errors import UserError  # noqa: E402

# li_peak_gmacs's kinds (LI_PEAK_* in membench.c): short name, instruction
PEAK_KINDS = {
    0: ("avx2", "vpmaddubsw+vpmaddwd+vpaddd 256-bit (int8)"),
    1: ("vnni256", "vpdpbusd 256-bit (int8)"),
    2: ("vnni512", "vpdpbusd 512-bit (int8)"),
    3: ("fma256", "vfmadd231ps 256-bit (fp32)"),
    4: ("fma512", "vfmadd231ps 512-bit (fp32)"),
}
FMA_KINDS = {"fma256", "fma512"}
# li_peak_kind's paths
PATHS = {0: "int8 row dots", 1: "int8 panels", 2: "float row dots", 3: "float panels"}
FLOAT_TYPES = {"F32", "F16", "BF16"}  # products in fp32 FMA; every other type in int8 dot products
REMAINDER = "residual + bias adds, other (remainder)"
FORWARD_OPS = ["embed", "rms_norm", "qkv product", "rope", "attention", "o product", "gate/up product", "swiglu", "down product",
               "final norm", "lm_head"]  # fmt: skip


class ProfileError(Exception):
    """A measurement that cannot be made here: one line says why."""


# -- 1. peak throughput -------------------------------------------------------------------


def _library() -> ctypes.CDLL:
    """The C kernels' library with membench.c's functions (localinfer_native.membench)."""
    try:
        return membench.library()
    except KernelsUnavailable as e:
        raise ProfileError(str(e)) from None


def peak_gmacs(kind: int, threads: int, seconds: float = 0.25, rounds: int = 3) -> float | None:
    """GMAC/s of li_peak_gmacs's `kind` on `threads` threads: the median of `rounds` runs of
    about `seconds` each; None where this build lacks the kind's instructions."""
    fn = _library().li_peak_gmacs
    rate = fn(kind, threads, 1000)  # also starts the thread pool
    if rate == 0.0:
        return None
    if rate == -2.0:
        raise ProfileError(f"the C kernels were built without OpenMP: {threads} threads cannot run at once")
    if not rate > 0:
        raise ProfileError(f"li_peak_gmacs refused kind {kind} with {threads} threads")
    iters = 1 << 14
    while True:  # grow the run until the clock's and the thread start's cost are noise
        start = time.perf_counter()
        fn(kind, threads, iters)
        took = time.perf_counter() - start
        if took >= seconds / 4 or iters >= 1 << 40:
            break
        iters *= 4
    iters = max(1, int(iters * seconds / max(took, 1e-9)))
    return statistics.median(fn(kind, threads, iters) for _ in range(rounds))


def measure_peaks(threads: list[int], seconds: float, rounds: int) -> list[dict[str, object]]:
    """One row per kind this build has: GMAC/s per thread count (and GFLOP/s for FMA)."""
    rows = []
    for kind, (name, instruction) in PEAK_KINDS.items():
        by_threads = {t: peak_gmacs(kind, t, seconds, rounds) for t in threads}
        if all(v is None for v in by_threads.values()):
            continue
        row: dict[str, object] = {"kind": name, "instruction": instruction, "gmacs": {str(t): v for t, v in by_threads.items()}}
        if name in FMA_KINDS:
            row["gflops"] = {str(t): 2 * v for t, v in by_threads.items() if v is not None}
        rows.append(row)
    return rows


def path_kinds() -> dict[str, str | None]:
    """The peak kind bounding each product path of this build (li_peak_kind), by PATHS' names."""
    lib = _library()
    return {name: PEAK_KINDS[k][0] if k in PEAK_KINDS else None for name, k in ((n, lib.li_peak_kind(p)) for p, n in PATHS.items())}


# -- 2. matrix products --------------------------------------------------------------------


@dataclass
class Shape:
    """One distinct product of the model: an op's matrices as the engine fuses them."""

    op: str  # qkv | o | gate/up | down | lm_head
    mats: list  # [QMatrix], from the first layer that has this shape
    n: int  # activation rows it is timed with
    layers: int  # how many layers have it (1 for the lm_head)

    @property
    def types(self) -> list[str]:
        return [m.type.name for m in self.mats]

    @property
    def rows(self) -> list[int]:
        return [m.rows for m in self.mats]

    @property
    def k(self) -> int:
        return self.mats[0].cols

    @property
    def macs(self) -> int:
        return self.n * sum(self.rows) * self.k


def model_shapes(weights, n: int) -> list[Shape]:
    """The distinct (op, block types, rows, k) of the layers, in layer order, and the lm_head."""
    found: dict[tuple, Shape] = {}
    for lw in weights.layers:
        ffn = [] if lw.moe is not None else [("gate/up", [lw.w_gate, lw.w_up]), ("down", [lw.w_down])]  # experts: timed whole (instrument)
        for op, mats in (("qkv", [lw.wq, lw.wk, lw.wv]), ("o", [lw.wo]), *ffn):
            key = (op, tuple(m.type.name for m in mats), tuple(m.rows for m in mats), mats[0].cols)
            if key in found:
                found[key].layers += 1
            else:
                found[key] = Shape(op, mats, n, 1)
    return [*found.values(), Shape("lm_head", [weights.output], 1, 1)]


def _panels(op) -> bool:
    """Whether the bound op runs any matrix from packed panels (CKernels._packed chose them)."""
    keep = getattr(op, "_keep", None)
    return bool(keep) and any(p is not None for p in keep[2])


def time_op(op, x: np.ndarray, outs: list[np.ndarray], n_fast: int, rounds: int) -> float:
    """Median seconds of `rounds` calls, after one warm-up call."""
    op(x, outs, n_fast)
    samples = []
    for _ in range(rounds):
        start = time.perf_counter()
        op(x, outs, n_fast)
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _against_peak(gmacs: float, kind: str | None, peaks: dict[str, dict[str, float | None]], threads: int) -> float | None:
    peak = peaks.get(kind, {}).get(str(threads)) if kind else None
    return 100 * gmacs / peak if peak else None


def measure_shapes(weights, threads: list[int], n: int, rounds: int, peaks: dict, kinds: dict) -> list[dict[str, object]]:
    """Each shape with and without panels, at each thread count; one row per (shape, threads)."""
    from localinfer_native.c_kernels import CKernels

    sets = {"packed": CKernels(threads[0], pack=True), "unpacked": CKernels(threads[0], pack=False)}
    rng = np.random.default_rng(0)
    rows = []
    for shape in model_shapes(weights, n):
        x = rng.standard_normal((shape.n, shape.k), dtype=np.float32)
        outs = [np.empty((shape.n, r), np.float32) for r in shape.rows]
        n_fast = shape.n if shape.op != "lm_head" else 0  # the forward's wanted row takes the exact path
        is_float = all(t in FLOAT_TYPES for t in shape.types)
        ops = {name: ks.matmul_op(shape.mats) for name, ks in sets.items()}  # binds (and packs) once
        for t in threads:
            row: dict[str, object] = {"op": shape.op, "types": shape.types, "rows": shape.rows, "k": shape.k, "layers": shape.layers,
                                      "n": shape.n, "threads": t}  # fmt: skip
            for name, op in ops.items():
                sets[name].set_threads(t)
                seconds = time_op(op, x, outs, n_fast, rounds)
                panels = _panels(op)
                kind = kinds[f"{'float' if is_float else 'int8'} {'panels' if panels else 'row dots'}"]
                gmacs = shape.macs / seconds / 1e9
                row[name] = {"ms": 1e3 * seconds, "gmacs": gmacs, "pct_peak": _against_peak(gmacs, kind, peaks, t), "reference": kind,
                             "panels": panels}  # fmt: skip
            rows.append(row)
        del ops
    return rows


# -- 3. one forward pass, operation by operation ----------------------------------------------


class OpTimer:
    """Seconds and calls per operation name, summed over every wrapped call."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self.calls: dict[str, int] = {}

    def reset(self) -> None:
        self.seconds = {name: 0.0 for name in FORWARD_OPS}
        self.calls = {name: 0 for name in FORWARD_OPS}

    def add(self, name: str, seconds: float) -> None:
        self.seconds[name] = self.seconds.get(name, 0.0) + seconds
        self.calls[name] = self.calls.get(name, 0) + 1

    def wrap(self, name: str, fn: Callable) -> Callable:
        clock, add = time.perf_counter, self.add

        def timed(*args, **kwargs):
            start = clock()
            try:
                return fn(*args, **kwargs)
            finally:
                add(name, clock() - start)

        return timed


class TimedKernels:
    """The kernel set with its per-token operations timed; everything else passes through.
    The final norm is the rms_norm call with the output norm's weight."""

    def __init__(self, kernels, timer: OpTimer, output_norm: np.ndarray) -> None:
        self._kernels, self._output_norm = kernels, output_norm
        self._norm = timer.wrap("rms_norm", kernels.rms_norm)
        self._final = timer.wrap("final norm", kernels.rms_norm)
        self.rope = timer.wrap("rope", kernels.rope)
        self.attention = timer.wrap("attention", kernels.attention)
        self.swiglu = timer.wrap("swiglu", kernels.swiglu)

    def rms_norm(self, x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray) -> None:
        (self._final if weight is self._output_norm else self._norm)(x, weight, eps, out)

    def __getattr__(self, name: str):
        return getattr(self._kernels, name)


def instrument(model, timer: OpTimer) -> Callable[[], None]:
    """Wraps the Transformer's bound products, its kernel set and embed in timers (instance
    attributes only: forward.py is unchanged); returns the function that undoes it."""
    saved = {name: getattr(model, name) for name in ("qkv", "attn_out", "gate_up", "down", "experts", "lm_head", "kernels")}
    model.qkv = [timer.wrap("qkv product", op) for op in saved["qkv"]]
    model.attn_out = [timer.wrap("o product", op) for op in saved["attn_out"]]
    model.gate_up = [op and timer.wrap("gate/up product", op) for op in saved["gate_up"]]
    model.down = [op and timer.wrap("down product", op) for op in saved["down"]]
    model.experts = [op and timer.wrap("experts (routing and products)", op) for op in saved["experts"]]
    model.lm_head = timer.wrap("lm_head", saved["lm_head"])
    model.kernels = TimedKernels(saved["kernels"], timer, model.weights.output_norm)
    model.embed = timer.wrap("embed", model.embed)  # shadows the method

    def undo() -> None:
        for name, value in saved.items():
            setattr(model, name, value)
        del model.embed

    return undo


def forward_round(backend, batch, timer: OpTimer) -> tuple[float, dict[str, float], dict[str, int]]:
    """One prompt's forward from an empty cache: its seconds and the timer's per-op split."""
    backend.kv_clear(0)
    timer.reset()
    start = time.perf_counter()
    backend.forward(batch)
    total = time.perf_counter() - start
    return total, dict(timer.seconds), dict(timer.calls)


def measure_forward(backend, threads: list[int], n_tokens: int, rounds: int) -> list[dict[str, object]]:
    """Per thread count: the median round's total and its per-op breakdown, remainder included."""
    from localinfer.backends.base import Batch

    vocab = backend.weights.token_embd.rows
    tokens = np.random.default_rng(0).integers(min(100, vocab - 1), min(vocab, 40_000), size=n_tokens).tolist()
    batch = Batch.for_sequence(tokens, 0)  # logits for the last token only, as a prompt
    timer = OpTimer()
    undo = instrument(backend.model, timer)
    results = []
    try:
        for t in threads:
            backend.kernels.set_threads(t)
            forward_round(backend, batch, timer)  # warm-up: workspaces, caches, thread pool
            runs = sorted((forward_round(backend, batch, timer) for _ in range(rounds)), key=lambda r: r[0])
            total, seconds, calls = runs[(len(runs) - 1) // 2]
            timed = sum(seconds.values())
            names = [*FORWARD_OPS, *(name for name in seconds if name not in FORWARD_OPS)]  # a MoE's experts after the rest
            ops = [{"op": name, "ms": 1e3 * seconds[name], "pct": 100 * seconds[name] / total, "calls": calls[name]} for name in names]
            ops.append({"op": REMAINDER, "ms": 1e3 * (total - timed), "pct": 100 * (total - timed) / total, "calls": None, "remainder": True})
            results.append({"threads": t, "total_ms": 1e3 * total, "tokens_per_s": n_tokens / total, "samples_ms": [1e3 * r[0] for r in runs],
                            "ops": ops})  # fmt: skip
    finally:
        undo()
        backend.kv_clear(0)
    return results


# -- the report ------------------------------------------------------------------------------


def _thread_list(text: str) -> list[int]:
    try:
        threads = [int(t) for t in text.split(",") if t.strip()]
    except ValueError:
        raise ProfileError(f"--threads takes comma-separated counts such as 1,2, not '{text}'") from None
    if not threads or min(threads) < 1:
        raise ProfileError("--threads must list counts >= 1")
    return list(dict.fromkeys(threads))


def load_backend(model: Path, n_tokens: int, threads: int):
    """The native engine on the C kernels, as `bench model` loads it, with room for the prompt."""
    from localinfer.backends.base import LoadParams
    from localinfer.backends.native import NativeBackend

    return NativeBackend.load(model, LoadParams(n_ctx=n_tokens + 16, n_threads=threads, kernels="c"))


def report(args: argparse.Namespace) -> dict[str, object]:
    """Everything the run prints: the machine, the build, the peaks, the products, the forward."""
    threads = _thread_list(args.threads)
    if args.tokens < 1 or args.rounds < 1 or not args.peak_seconds > 0:
        raise ProfileError("--tokens and --rounds must be >= 1, and --peak-seconds > 0")
    model = Path(args.model).expanduser()
    if not model.is_file():
        raise ProfileError(f"{model} is not a file")
    lib = _library()
    result: dict[str, object] = {"cpu": cpu_name(), "cpu_flags": cpu_simd_flags(), "build": lib.li_build_info().decode().strip(), "model": str(model),
                                 "tokens": args.tokens, "rounds": args.rounds, "threads": threads}  # fmt: skip
    result["peaks"] = measure_peaks(threads, args.peak_seconds, args.rounds)
    result["path_kinds"] = kinds = path_kinds()
    peaks = {row["kind"]: row["gmacs"] for row in result["peaks"]}
    backend = load_backend(model, args.tokens, threads[0])
    try:
        result["kernels"] = backend.kernels.describe()
        result["forward_panels"] = os.environ.get("LOCALINFER_PACK", "1") != "0"  # CKernels' default, which the engine's ops took
        result["shapes"] = measure_shapes(backend.weights, threads, args.tokens, args.rounds, peaks, kinds)
        result["forward"] = measure_forward(backend, threads, args.tokens, args.rounds)
    finally:
        backend.close()
    warnings = []
    if "amx" in result["kernels"]:
        warnings.append("AMX runs some products here: their % of the VNNI peak can pass 100")
    result["warnings"] = warnings
    return result


def _num(v: float | None, fmt: str = ".1f") -> str:
    return "-" if v is None or not math.isfinite(v) else format(v, fmt)


def _types(types: list[str]) -> str:
    return types[0] if len(set(types)) == 1 else "/".join(types)


def print_tables(r: dict[str, object]) -> None:
    threads = r["threads"]
    print(f"CPU: {r['cpu']}  \nflags: {' '.join(r['cpu_flags']) or '-'}  \nbuild: {r['build']}  \nkernels: {r['kernels']}  ")
    print(f"model: {Path(r['model']).name}, {r['tokens']} tokens, median of {r['rounds']} round{'s' if r['rounds'] > 1 else ''}  ")
    print(f"forward pass: panels {'on' if r['forward_panels'] else 'off (LOCALINFER_PACK=0)'}\n")
    head = " | ".join(f"{t} thread{'s' if t > 1 else ''}" for t in threads)
    print(f"### Peak multiply-add throughput (GMAC/s; FMA also GFLOP/s)\n\n| instruction | {head} |\n|---|{'---:|' * len(threads)}")
    for row in r["peaks"]:
        cells = [_num(row["gmacs"][str(t)]) + (f" ({_num(row['gflops'].get(str(t)))} GFLOP/s)" if "gflops" in row else "") for t in threads]
        print(f"| {row['instruction']} | {' | '.join(cells)} |")
    used = ", ".join(f"{path}: {kind or 'scalar'}" for path, kind in r["path_kinds"].items())
    print(f"\nThe products' instructions in this build: {used}.\n")
    print(f"### Matrix products ({r['tokens']} rows; lm_head 1 row): panels (default) and LOCALINFER_PACK=0\n")
    print("| op | types | rows × k | layers | threads | panels ms | GMAC/s | % peak | no-pack ms | GMAC/s | % peak |")
    print("|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for row in r["shapes"]:
        p, u = row["packed"], row["unpacked"]
        shape = f"{'+'.join(map(str, row['rows']))} × {row['k']}"
        pk = f"{_num(p['pct_peak'])} ({p['reference'] or '-'})" if p["panels"] else f"{_num(p['pct_peak'])} (no panels, {p['reference'] or '-'})"
        print(f"| {row['op']} | {_types(row['types'])} | {shape} | {row['layers']} | {row['threads']} | {_num(p['ms'], '.2f')} | {_num(p['gmacs'])} | {pk} "
              f"| {_num(u['ms'], '.2f')} | {_num(u['gmacs'])} | {_num(u['pct_peak'])} ({u['reference'] or '-'}) |")  # fmt: skip
    print(f"\n### One forward of {r['tokens']} prompt tokens (pp{r['tokens']}), per operation summed over layers\n")
    print(f"| operation | {' | '.join(f'ms ({t}t) | % ({t}t)' for t in threads)} |\n|---|{'---:|---:|' * len(threads)}")
    fwd = r["forward"]
    for i, op in enumerate(fwd[0]["ops"]):
        cells = " | ".join(f"{_num(f['ops'][i]['ms'])} | {_num(f['ops'][i]['pct'])}" for f in fwd)
        print(f"| {op['op']} | {cells} |")
    totals = " | ".join(f"**{_num(f['total_ms'])}** | 100.0" for f in fwd)
    print(f"| **total** | {totals} |")
    print(f"| tokens/s | {' | '.join(_num(f['tokens_per_s']) + ' | ' for f in fwd)} |")
    print("\nThe remainder is the total minus the timed operations: forward.py's numpy residual and bias adds, its Python, and the timers.")
    for warning in r["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="the GGUF file to profile (e.g. one bench/synthetic.py made)")
    ap.add_argument("--tokens", type=int, default=512, help="prompt tokens of the forward, and activation rows of the products (default 512)")
    ap.add_argument("--rounds", type=int, default=3, help="timed rounds of each measurement; figures are medians (default 3)")
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts, each measured in all three parts (default 1,2)")
    ap.add_argument("--peak-seconds", type=float, default=0.25, help="seconds of each peak-throughput run (default 0.25)")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the Markdown tables")
    args = ap.parse_args()
    try:
        result = report(args)
    except (ProfileError, UserError) as e:
        raise SystemExit(f"error: {e}") from None
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_tables(result)


if __name__ == "__main__":
    main()
