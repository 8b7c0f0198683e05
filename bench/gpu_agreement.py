"""Does a GPU build compute what the CPU build computes? (issue 33's agreement points)

Two steps on two machines, since a CPU build and a GPU build are two installs:

    # on a machine with the CPU build: the reference
    .venv/bin/python bench/gpu_agreement.py dump --out ref.npz
    # on the GPU machine, with the CUDA build and every layer offloaded
    .venv/bin/python bench/gpu_agreement.py check --ref ref.npz --gpu-layers all [--json OUT]

`dump` writes, through llama.cpp with no layer offloaded: the greedy tokens of the F32
widening of the embedded model (64 tokens, a fixed prompt), and the log-probabilities the
embedded Q4_1 model gives a held-out text (the second half of one 512-token chunk of the
bundled text, as `localinfer eval` scores it). `check` computes both again on the GPU and
reports whether the greedy tokens are identical, the KL divergence of the GPU's
distribution from the CPU's (mean, p99, max) and the top-1 agreement.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.draft_model import self_pair  # noqa: E402
from localinfer.engine.loader import LoadOptions, open_engine  # noqa: E402
from localinfer.engine.types import SamplingParams  # noqa: E402
from localinfer.quality.evaluate import chunks_of, scored_logprobs  # noqa: E402

PROMPT = "Write a short story about a lighthouse keeper who finds a message in a bottle."
CTX = 512
GREEDY_TOKENS = 64


def held_out_chunk(engine) -> list[int]:  # type: ignore[no-untyped-def]
    """The bundled text's last whole chunk: text no test or benchmark here tunes on."""
    text = (ROOT / "tests" / "data" / "alice_in_wonderland.txt").read_text()
    return chunks_of(engine.backend.tokenize(text, add_special=False), CTX)[-1]


def measure(gpu_layers: int | str, pair: tuple[Path, Path] | None = None) -> tuple[list[int], np.ndarray, str]:
    """(greedy tokens of the F32 model, log-probs [CTX/2 - 1, vocab] of the Q4_1 model, its greedy text).
    `pair`: (F32, Q4_1) files; default the F32 widening (made once, in the user cache) and the embedded Q4_1."""
    f32_path, q4_path = pair or self_pair()
    options = LoadOptions(engine="llama.cpp", ctx=CTX, gpu_layers=gpu_layers, draft=None)
    f32 = open_engine(str(f32_path), options)
    try:
        ids = f32.tokenize_prompt(f32.render_chat([{"role": "user", "content": PROMPT}]))
        out = f32.complete(ids, SamplingParams(temperature=0.0, max_tokens=GREEDY_TOKENS, repeat_penalty=1.0))
        greedy, text = list(out.tokens), out.text
    finally:
        f32.close()
    q4 = open_engine(str(q4_path), options)
    try:
        logp = scored_logprobs(q4.backend, held_out_chunk(q4)).astype(np.float32)
    finally:
        q4.close()
    return greedy, logp, text


def dump(out: Path, pair: tuple[Path, Path] | None = None) -> None:
    greedy, logp, text = measure(0, pair)
    np.savez(out, greedy=np.asarray(greedy, dtype=np.int32), logp=logp)
    print(f"wrote {out}: {len(greedy)} greedy tokens, log-probs {logp.shape}; greedy text: {text!r}")


def check(ref_path: Path, gpu_layers: int | str, pair: tuple[Path, Path] | None = None) -> dict[str, object]:
    ref = np.load(ref_path)
    greedy, logp, text = measure(gpu_layers, pair)
    ref_greedy = [int(t) for t in ref["greedy"]]
    same = next((i for i, (a, b) in enumerate(zip(greedy, ref_greedy)) if a != b), None)
    p = ref["logp"].astype(np.float64)
    kld = np.maximum(np.sum(np.exp(p) * (p - logp.astype(np.float64)), axis=-1), 0.0)
    return {
        "gpu_layers": gpu_layers,
        "greedy_identical": greedy == ref_greedy,
        "greedy_tokens": len(greedy),
        "first_difference": same,
        "greedy_text": text,
        "kld_mean": float(kld.mean()),
        "kld_p99": float(np.percentile(kld, 99)),
        "kld_max": float(kld.max()),
        "top1_agreement": float(np.mean(p.argmax(axis=-1) == logp.argmax(axis=-1))),
        "positions": int(len(kld)),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="step", required=True)
    d = sub.add_parser("dump", help="the CPU build's reference")
    d.add_argument("--out", type=Path, required=True)
    c = sub.add_parser("check", help="the GPU build against a reference")
    c.add_argument("--ref", type=Path, required=True)
    c.add_argument("--gpu-layers", default="all", help="layers on the GPU: a number or all")
    c.add_argument("--json", type=Path, help="write the result here too")
    for step in (d, c):
        step.add_argument("--f32", type=Path, help="the F32 model (default: the embedded model widened, in the user cache)")
        step.add_argument("--q4", type=Path, help="the Q4_1 model (default: the embedded one)")
    args = ap.parse_args()
    pair = (args.f32, args.q4) if args.f32 and args.q4 else None
    if args.step == "dump":
        dump(args.out, pair)
        return
    layers = args.gpu_layers if args.gpu_layers == "all" else int(args.gpu_layers)
    result = check(args.ref, layers, pair)
    print(json.dumps(result, indent=1))
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
