"""Prompt-lookup speculation, measured in one run; ratios, not absolute numbers.

  verify   the forward time of 1, 2, 4, 8 and 16 rows of one sequence (after a 256-token
           prefix, rolled back each time), per engine and kernel set, against 1 row: what a
           K-token verification costs.
  speedup  decode tokens/s with --draft prompt-lookup against --draft none, greedy, on
           input-grounded tasks (summarise, extract, quote, edit code) and an open-ended one
           (a story), per engine, on the embedded Q4_1 model and the F16 and Q8_0 variants
           made from it with `localinfer quantize`; and whether the two outputs are identical.

    .venv/bin/python bench/speculative.py [--threads 2] [--tokens 160] [--json] [--skip verify,speedup]
        [--repeats 7 --tasks story --models Q4_1]   # the open-ended case, medians of 7 alternate runs
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localinfer.backends.base import Batch, LoadParams  # noqa: E402
from localinfer.engine.engine import Engine  # noqa: E402
from localinfer.engine.speculative import DraftConfig  # noqa: E402
from localinfer.engine.types import SamplingParams  # noqa: E402
from localinfer.store.pull import local_path  # noqa: E402
from localinfer.store.refs import resolve  # noqa: E402

TEXT = (ROOT / "tests" / "data" / "alice_in_wonderland.txt").read_text()[:1800]
CODE = (ROOT / "localinfer" / "engine" / "stops.py").read_text()
TASKS = {
    "summarise": f"Summarise this text in a few sentences, using its own words:\n\n{TEXT}",
    "extract": f"List every character named in this text, each with the sentence that mentions them:\n\n{TEXT}",
    "quote": f"Quote the first paragraph of this text exactly:\n\n{TEXT}",
    "edit code": f"Rename the class StopMatcher to StopFinder in this file and print the whole file:\n\n{CODE}",
    "story (open-ended)": "Write a long story about a dragon who learns to bake bread.",
}
ENGINES = [("llama.cpp", None), ("native", "c"), ("native", "numba")]


def variant(kind: str, cache: Path) -> Path:
    """The embedded model re-quantized to F16 or Q8_0 with our own quantizer (made once)."""
    src = local_path(resolve(None))
    out = cache / f"smollm2-135m-{kind}.gguf"
    if not out.exists():
        subprocess.run([sys.executable, "-m", "localinfer", "quantize", str(src), kind, "--allow-requantize", "-o", str(out), "--json"],
                       check=True, capture_output=True)  # fmt: skip
    return out


def load(engine: str, kernels: str | None, path: Path, threads: int, n_ctx: int = 2048):
    if engine == "native":
        from localinfer.backends.native import NativeBackend as cls
    else:
        from localinfer.backends.llamacpp import LlamaCppBackend as cls
    return cls.load(path, LoadParams(n_ctx=n_ctx, n_threads=threads, n_seq_max=1, kernels=kernels))


def verify_curve(backend, repeats: int = 15) -> dict[int, float]:
    """Median forward ms of n rows after a 256-token prefix, n = 1, 2, 4, 8, 16."""
    prefix = backend.tokenize(TEXT, add_special=True, parse_special=False)[:256]
    backend.kv_clear(0)
    backend.forward(Batch.for_sequence(prefix, 0, 0))
    out = {}
    for n in (1, 2, 4, 8, 16):
        times = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            backend.forward(Batch.for_sequence(prefix[:n], len(prefix), 0, all_logits=True))
            times.append(time.perf_counter() - t0)
            backend.kv_truncate(0, len(prefix))
        out[n] = statistics.median(times) * 1e3
    backend.kv_clear(0)
    return out


def speedup(backend, tokens: int, repeats: int = 1, tasks: dict[str, str] = TASKS) -> dict[str, dict]:
    """Each task run plain and with speculation, alternately, `repeats` times: medians."""
    plain, spec = Engine(backend), Engine(backend, draft=DraftConfig())
    params = SamplingParams(temperature=0, max_tokens=tokens, repeat_penalty=1.0)
    results = {}
    for task, prompt in tasks.items():
        ids = plain.tokenize_prompt(plain.render_chat([{"role": "user", "content": prompt}]))
        runs: list[list] = [[], []]
        for _ in range(repeats):
            for engine, out in zip((plain, spec), runs):
                engine.slots.forget_all()  # the other engine wrote the slot; nothing stale is reused
                out.append(engine.complete(ids, params))
        a, b = runs[0][-1], runs[1][-1]
        rate = [[r.timings.tokens_per_s for r in out] for out in runs]
        results[task] = {"plain_tok_s": statistics.median(rate[0]), "spec_tok_s": statistics.median(rate[1]),
                         "ratio": statistics.median(s / p for p, s in zip(*rate) if p), "repeats": repeats,
                         "identical": all(x.tokens == y.tokens for x, y in zip(*runs)), "tokens": len(a.tokens),
                         "accepted": b.timings.accepted, "drafted": b.timings.drafted, "tokens_per_forward": b.timings.tokens_per_forward}  # fmt: skip
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=160)
    ap.add_argument("--skip", default="", help="comma-separated: verify, speedup")
    ap.add_argument("--repeats", type=int, default=1, help="runs of each task, plain and speculative alternately (medians)")
    ap.add_argument("--tasks", default="", help="comma-separated words; only the tasks whose names hold one (e.g. story)")
    ap.add_argument("--models", default="Q4_1,Q8_0,F16", help="comma-separated, of Q4_1, Q8_0, F16")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    skip = set(args.skip.split(",")) - {""}
    cache = Path.home() / ".cache" / "localinfer" / "bench"
    cache.mkdir(parents=True, exist_ok=True)
    wanted = args.models.split(",")
    models = {"Q4_1": local_path(resolve(None))} if "Q4_1" in wanted else {}
    models |= {kind: variant(kind, cache) for kind in ("Q8_0", "F16") if kind in wanted}
    words = [w for w in args.tasks.split(",") if w]
    tasks = {t: p for t, p in TASKS.items() if not words or any(w in t for w in words)}
    results: dict[str, dict] = {"verify": {}, "speedup": {}}
    for engine, kernels in ENGINES:
        name = engine + (f" ({kernels})" if kernels else "")
        for model, path in models.items():
            if kernels == "numba" and model != "Q4_1":
                continue  # the Numba set is the fallback; one model shows its curve
            backend = load(engine, kernels, path, args.threads)
            try:
                if "verify" not in skip:
                    curve = verify_curve(backend)
                    results["verify"][f"{name} {model}"] = curve
                    print(f"verify {name:18} {model:5} " + " | ".join(f"{n} rows {ms:6.2f} ms ({ms / curve[1]:.2f}x)" for n, ms in curve.items()), flush=True)
                if "speedup" not in skip and kernels != "numba":
                    r = results["speedup"][f"{name} {model}"] = speedup(backend, args.tokens, args.repeats, tasks)
                    for task, x in r.items():
                        print(f"speedup {name:18} {model:5} {task:20} {x['plain_tok_s']:6.1f} -> {x['spec_tok_s']:6.1f} tok/s = {x['ratio']:.2f}x (median of {x['repeats']})"
                              f" | identical {x['identical']} | accepted {x['accepted']}/{x['drafted']}, {x['tokens_per_forward']:.2f} tok/forward", flush=True)  # fmt: skip
            finally:
                backend.close()
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
