"""What structured output costs per token, measured in one run: decode TPOT with a JSON
schema, a GBNF grammar and a regex against plain decoding of as many tokens, per engine,
plus the time the mask itself takes (computing it, applying it to the logits, advancing
the matcher), timed inside the engine. Each constraint runs until --tokens (its grammar
never lets the answer end sooner), and plain decoding is kept from ending sooner by
`ignore_eos`, so every row decodes the same number of tokens.

    .venv/bin/python bench/constraints.py [--engines llama.cpp,native] [--tokens 128] [--repeats 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localinfer.engine import constraints  # noqa: E402
from localinfer.engine.constraints import Constraint  # noqa: E402
from localinfer.engine.loader import LoadOptions, open_engine  # noqa: E402
from localinfer.engine.types import SamplingParams  # noqa: E402

# Each allows far more than --tokens tokens, so the answer always runs to the limit.
CASES = {
    "JSON schema": Constraint.json_schema(
        {
            "type": "array",
            "minItems": 500,
            "items": {
                "type": "object",
                "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer", "minimum": 0, "maximum": 120}, "role": {"enum": ["admin", "editor", "viewer"]}},
                "required": ["name", "age", "role"],
                "additionalProperties": False,
            },
        }
    ),
    "GBNF grammar": Constraint("grammar", 'root ::= item+\nitem ::= "- " [A-Za-z ]{1,30} " (" [0-9]{1,4} ")\\n"'),
    "regex": Constraint("regex", r"([A-Z][a-z]{1,10} ){500,}"),
}
PROMPT = "List the users of a web app, as many as you can."


class MaskClock:
    """Adds up the time spent in TokenMask's per-token work, wherever the engine calls it."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.calls = 0

    def wrap(self, name: str) -> None:
        original = getattr(constraints.TokenMask, name)

        def timed(mask, *args):  # type: ignore[no-untyped-def]
            t0 = time.perf_counter()
            try:
                return original(mask, *args)
            finally:
                self.seconds += time.perf_counter() - t0
                self.calls += name == "apply"

        setattr(constraints.TokenMask, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--engines", default="llama.cpp,native")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    clock = MaskClock()
    for name in ("apply", "advance"):
        clock.wrap(name)
    print("| engine | constraint | TPOT ms (median) | vs plain | mask ms/token | mask share of plain TPOT |")
    print("|---|---|---:|---:|---:|---:|")
    for engine_name in args.engines.split(","):
        engine = open_engine(None, LoadOptions(engine=engine_name, threads=args.threads))
        try:
            tokens = engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": PROMPT}]))
            params = SamplingParams(temperature=0.8, seed=1, max_tokens=args.tokens, min_p=0.0)
            engine.grammar_vocab()  # built once per engine: not a per-token cost
            engine.complete(tokens, params)  # warm-up
            tpot: dict[str, list[float]] = {"plain": []} | {case: [] for case in CASES}
            mask: dict[str, list[float]] = {case: [] for case in CASES}
            for _ in range(args.repeats):  # interleaved, so drift hits every row alike
                for case in tpot:
                    clock.seconds, clock.calls = 0.0, 0
                    plain = case == "plain"  # with its end-of-generation tokens banned, it too runs to --tokens
                    out = engine.complete(tokens, params.with_overrides(constraint=CASES.get(case), ignore_eos=plain or None))
                    assert out.completion_tokens == args.tokens, (case, out.finish_reason, out.text)
                    tpot[case].append(out.timings.tpot_ms)
                    if case in mask:
                        mask[case].append(clock.seconds * 1e3 / clock.calls)
            plain = statistics.median(tpot["plain"])
            print(f"| {engine_name} | none | {plain:.2f} | 1.00 | – | – |")
            for case in CASES:
                t, m = statistics.median(tpot[case]), statistics.median(mask[case])
                print(f"| {engine_name} | {case} | {t:.2f} | {t / plain:.2f} | {m:.3f} | {m / plain:.1%} |")
        finally:
            engine.close()


if __name__ == "__main__":
    main()
