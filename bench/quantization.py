"""The quality table of docs/quantization.md: what each quantization of the F16 source
costs in size, perplexity, KL divergence from F16, top-1 agreement and decode speed.

The F16 source is the embedded SmolLM2-135M-Instruct widened with our codecs (its weights
are therefore exactly the Q4_1 grid values); every quant is made from it by
`localinfer quantize` (llama.cpp's quantizer). Text: tests/data/alice_in_wonderland.txt
(39k tokens), in chunks of --ctx, second half of each chunk scored, every model against
the same F16 logits (the reference run again next to each quant).

    .venv/bin/python bench/quantization.py [--engine llama.cpp|native] [--ctx 512] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from localinfer.backends import get_backend  # noqa: E402
from localinfer.backends.base import LoadParams  # noqa: E402
from localinfer.engine.engine import Engine  # noqa: E402
from localinfer.engine.types import CompletionOutput, SamplingParams  # noqa: E402
from localinfer.modelfile import inspect  # noqa: E402
from localinfer.quality.evaluate import evaluate_many  # noqa: E402
from localinfer_quant.quantize import quantize  # noqa: E402
from localinfer_quant.source import embedded_f16  # noqa: E402

TYPES = ["Q8_0", "Q6_K", "Q5_K_M", "Q4_K_M", "Q4_0"]
TEXT = ROOT / "tests" / "data" / "alice_in_wonderland.txt"


def decode_tok_s(backend, rounds: int = 3, n: int = 64) -> float:
    engine = Engine(backend)
    prompt = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": "Tell me a story about a rabbit."}]))
    rates = []
    for _ in range(rounds):
        stamps = [time.perf_counter() for ev in engine.generate(prompt, SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=n)) if not isinstance(ev, CompletionOutput)]
        rates.append((len(stamps) - 1) / (stamps[-1] - stamps[0]))
    return statistics.median(rates)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--engine", default="llama.cpp", choices=["llama.cpp", "native"])
    ap.add_argument("--ctx", type=int, default=512)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--chunks", type=int, default=None, help="score at most this many chunks (default: the whole text)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    backend_cls = get_backend(args.engine)
    params = LoadParams(n_ctx=args.ctx, n_threads=args.threads)
    with tempfile.TemporaryDirectory(prefix="localinfer-quant-bench-") as tmp:
        f16 = embedded_f16(Path(tmp) / "SmolLM2-135M-Instruct-F16.gguf")
        files = {"F16": f16}
        for t in TYPES:
            files[t] = quantize(f16, Path(tmp) / f"SmolLM2-135M-Instruct-{t}.gguf", t, threads=args.threads).output
        # One quant at a time next to the F16 reference: six llama.cpp contexts in one
        # process leave six thread pools polling over two cores.
        reference = backend_cls.load(f16, params)
        tokens = reference.tokenize(TEXT.read_text(encoding="utf-8"), add_special=False)
        results = {}
        for name, path in files.items():
            started = time.perf_counter()
            model = reference if name == "F16" else backend_cls.load(path, params)
            results[name] = evaluate_many(
                {name: model}, tokens, args.ctx, reference=reference, max_chunks=args.chunks,
                progress=lambda done, total, _: print(f"\r{name}: {done}/{total} chunks, {time.perf_counter() - started:.0f} s", end="", file=sys.stderr, flush=True),
            )[name]  # fmt: skip
            print(file=sys.stderr)
            if model is not reference:
                model.close()
        reference.close()
        rows = []
        for name, path in files.items():
            r, info = results[name], inspect(path)
            alone = backend_cls.load(path, params)  # decode speed with no other model loaded
            rows.append({
                "type": name, "mb": info.file_size / 1e6, "bpw": 8 * info.tensor_bytes / info.n_params,
                "perplexity": r.perplexity, "kld_mean": r.kld["mean"], "kld_p99": r.kld["p99"], "kld_max": r.kld["max"],
                "top1": r.top1_agreement, "decode_tok_s": decode_tok_s(alone), "tokens": r.tokens,
            })  # fmt: skip
            alone.close()
    print(f"engine {args.engine}, {args.threads} threads, ctx {args.ctx}, {rows[0]['tokens']} scored tokens of {TEXT.name} ({len(tokens)} tokens)")
    print("| type | size (MB) | bits/weight | perplexity | KLD mean | KLD p99 | KLD max | top-1 vs F16 | decode tok/s |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for r in rows:
        print(
            f"| {r['type']} | {r['mb']:.1f} | {r['bpw']:.2f} | {r['perplexity']:.4f} | {r['kld_mean']:.6f} | {r['kld_p99']:.5f} | "
            f"{r['kld_max']:.4f} | {100 * r['top1']:.2f} % | {r['decode_tok_s']:.1f} |"
        )
    if args.json:
        print(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
