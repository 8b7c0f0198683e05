"""Speculative decoding with a draft model, measured in one run; ratios, not absolute numbers.

Two pairs, as llama.cpp's quantizer makes them from the embedded SmolLM2-135M (no real
target/draft pair is reachable offline):
- `self`: target F32 (~540 MB), draft the embedded Q4_1 (~98 MB, 5.5x fewer bytes). The draft
  has the target's own weights, so its acceptance is optimistic against a real pair.
- `adversarial`: target F32, draft its F16 (0.5 of the target's bytes) with every weight matrix
  perturbed by Gaussian noise (`--noise`, a fraction of each matrix's spread). At 0.12 the
  draft's greedy token is the target's 59 % of the time (code and chat, teacher-forced; 0.08:
  69-83 %, 0.2: 15-18 %): the regime where drafting barely pays or loses, as a 0.5B drafting
  for a 1.5B can (issue 46). Speculation must never fall below 0.95x there.

TTFT: nothing may stand between a prompt and its first token. Per row, the median TTFT of
each side's requests; and `--first-token N` times what a user meets, `localinfer run MODEL
-n 8 "Hi"` as a new process each time, with the draft and with `--draft none` in turn (N
each, --no-prompt-cache, the file already in the page cache): its TTFT and prompt time.

For each engine, task (code, chat, summary, extraction) and temperature (0, 0.7): decode
tokens/s with --draft MODEL against --draft none, alternately, medians of --repeats runs;
acceptance per source and tokens per target forward; and at temperature 0 whether the two
answers are identical. The anchor: llama.cpp's own draft-model speculation as
llama-cpp-python drives it (`Llama(draft_model=...)`, a LlamaDraftModel that drafts greedily
with the same Q4_1), against the same Llama without a draft.

    .venv/bin/python bench/draft_model.py [--pair self|adversarial] [--noise 0.12] [--threads 2] [--tokens 128]
        [--repeats 5] [--engines ...] [--first-token 3] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localinfer.devices import cpu_name  # noqa: E402
from localinfer.engine.loader import LoadOptions, open_engine  # noqa: E402
from localinfer.engine.speculative import DraftConfig  # noqa: E402
from localinfer.engine.types import SamplingParams  # noqa: E402
from localinfer.store.pull import local_path  # noqa: E402
from localinfer.store.refs import resolve  # noqa: E402

TEXT = (ROOT / "tests" / "data" / "alice_in_wonderland.txt").read_text()[:1500]
TASKS = {
    "code": "Write a Python function that parses a CSV file into a list of dictionaries, with a docstring and an example.",
    "chat": "What are some good ways to stay focused while working from home? Explain each one.",
    "summary": f"Summarise this text in a few sentences:\n\n{TEXT}",
    "extraction": f"List every character named in this text, each with what they do:\n\n{TEXT}",
}
TEMPERATURES = (0.0, 0.7)


def self_pair() -> tuple[Path, Path]:
    """(target F32, draft Q4_1): the embedded model and its F32, made once."""
    draft = local_path(resolve(None))
    target = Path.home() / ".cache" / "localinfer" / "bench-models" / "smollm2-135m-f32.gguf"
    if not target.exists():
        import llama_cpp

        from tests.conftest import llama_quantize

        target.parent.mkdir(parents=True, exist_ok=True)
        llama_quantize(draft, target, llama_cpp.LLAMA_FTYPE_ALL_F32)
    return target, draft


def adversarial_pair(noise: float, seed: int = 0) -> tuple[Path, Path]:
    """(target F32, draft F16 with noise): the draft's weight matrices each get Gaussian noise
    of `noise` times their own standard deviation, written in place into a copy (made once per
    noise level)."""
    import llama_cpp
    from gguf import GGUFReader

    from tests.conftest import llama_quantize

    target, q4 = self_pair()
    folder = target.parent
    f16 = folder / "smollm2-135m-f16.gguf"
    if not f16.exists():
        llama_quantize(q4, f16, llama_cpp.LLAMA_FTYPE_MOSTLY_F16)
    draft = folder / f"smollm2-135m-f16-noise{noise:g}.gguf"
    if not draft.exists():
        partial = draft.with_suffix(".partial")
        partial.write_bytes(f16.read_bytes())
        rng = np.random.default_rng(seed)
        for tensor in GGUFReader(partial, "r+").tensors:
            data = tensor.data
            if data.ndim == 2 and data.dtype == np.float16:
                spread = data.astype(np.float32).std()
                data[...] = (data.astype(np.float32) + rng.normal(0, noise * spread, data.shape)).astype(np.float16)
        partial.rename(draft)
    return target, draft


def ours(engines: str, target: Path, draft: Path, threads: int, tokens: int, repeats: int) -> list[dict]:
    """`engines`: the target's engine, or target/draft engines (llama.cpp/native)."""
    engine, _, draft_engine = engines.partition("/")
    plain = open_engine(str(target), LoadOptions(engine=engine, threads=threads, ctx=2048, draft=None))
    spec = open_engine(str(target), LoadOptions(engine=engine, threads=threads, ctx=2048, draft=DraftConfig(), draft_model=str(draft), draft_engine=draft_engine or None))
    rows = []
    try:
        for task, prompt in TASKS.items():
            ids = plain.tokenize_prompt(plain.render_chat([{"role": "user", "content": prompt}]))
            for temperature in TEMPERATURES:
                runs: list[list] = [[], []]
                for r in range(repeats):
                    params = SamplingParams(temperature=temperature, max_tokens=tokens, repeat_penalty=1.0, seed=r)
                    order = [(plain, runs[0]), (spec, runs[1])]
                    for e, out in order if r % 2 == 0 else order[::-1]:  # alternate who runs first: memory speed drifts
                        e.slots.forget_all()  # no prefix reuse between runs
                        out.append(e.complete(ids, params))
                rows.append(row(engines, task, temperature, *runs))
                print(line(rows[-1]), flush=True)
    finally:
        spec.close()
        plain.close()
    return rows


def row(engine: str, task: str, temperature: float, plain: list, spec: list) -> dict:
    rate = [[r.timings.tokens_per_s for r in runs] for runs in (plain, spec)]
    t = [r.timings for r in spec]
    return {
        "engine": engine, "task": task, "temperature": temperature, "repeats": len(plain),
        "plain_tok_s": statistics.median(rate[0]), "spec_tok_s": statistics.median(rate[1]),
        "speedup": statistics.median(s / p for p, s in zip(*rate) if p),
        "model_accepted": sum(x.model_accepted for x in t), "model_drafted": sum(x.model_drafted for x in t),
        "lookup_accepted": sum(x.lookup_accepted for x in t), "lookup_drafted": sum(x.lookup_drafted for x in t),
        "tokens_per_forward": statistics.median(x.tokens_per_forward for x in t),
        "plain_ttft_ms": statistics.median(r.timings.ttft_ms for r in plain), "spec_ttft_ms": statistics.median(x.ttft_ms for x in t),
        "identical": all(a.tokens == b.tokens for a, b in zip(plain, spec)) if temperature == 0 else None,
    }  # fmt: skip


def line(r: dict) -> str:
    rate = lambda a, d: f"{a}/{d} ({a / d:.0%})" if d else "–"  # noqa: E731
    same = "" if r["identical"] is None else f" | identical {r['identical']}"
    return (f"{r['engine']:22} {r['task']:10} T={r['temperature']:.1f} {r['plain_tok_s']:6.1f} -> {r['spec_tok_s']:6.1f} tok/s = {r['speedup']:.2f}x"
            f" | model {rate(r['model_accepted'], r['model_drafted'])} lookup {rate(r['lookup_accepted'], r['lookup_drafted'])}"
            f" | {r['tokens_per_forward']:.2f} tok/forward | TTFT {r['plain_ttft_ms']:.0f} / {r['spec_ttft_ms']:.0f} ms{same}")  # fmt: skip


def first_tokens(engines: str, target: Path, draft: Path, threads: int, runs: int) -> list[dict]:
    """`run -n 8 "Hi"` as a user starts it, with the draft and without, alternately: TTFT and
    prompt time from --json, medians of `runs` each."""
    import subprocess

    engine, _, draft_engine = engines.partition("/")
    sides: dict[str, list[tuple[float, float]]] = {"draft": [], "none": []}
    for r in range(runs * 2):
        side = ("draft", "none")[r % 2]
        cmd = [str(ROOT / ".venv" / "bin" / "localinfer"), "run", str(target), "--engine", engine, "--threads", str(threads), "-n", "8",
               "--temperature", "0", "--no-prompt-cache", "--json", "--draft", str(draft) if side == "draft" else "none", "Hi"]  # fmt: skip
        if side == "draft" and draft_engine:
            cmd += ["--draft-engine", draft_engine]
        t = json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)["timings"]
        sides[side].append((t["ttft_ms"], t["prompt_ms"]))
    row = {"engine": engines, "runs": runs} | {f"{side}_{what}_ms": statistics.median(v[i] for v in values)
                                              for side, values in sides.items() for i, what in enumerate(("ttft", "prompt"))}  # fmt: skip
    print(f"{engines:22} run -n 8 \"Hi\": TTFT {row['draft_ttft_ms']:.0f} ms with the draft (prompt {row['draft_prompt_ms']:.0f}), "
          f"{row['none_ttft_ms']:.0f} ms with --draft none (prompt {row['none_prompt_ms']:.0f}); medians of {runs}", flush=True)  # fmt: skip
    return [row]


def llama_cpp_anchor(target: Path, draft: Path, threads: int, tokens: int, repeats: int, k: int = 4) -> list[dict]:
    """llama-cpp-python's own speculation with a greedy draft model, against no draft."""
    from llama_cpp import Llama
    from llama_cpp.llama_speculative import LlamaDraftModel

    class GreedyDraft(LlamaDraftModel):
        def __init__(self) -> None:
            self.llm = Llama(str(draft), n_ctx=2048, n_threads=threads, verbose=False)

        def __call__(self, input_ids, /, **kwargs):  # noqa: ANN001 - llama-cpp-python's signature
            out = []
            for token in self.llm.generate(input_ids.tolist(), temp=0.0):  # reuses the longest cached prefix
                out.append(token)
                if len(out) == k:
                    break
            return np.array(out, dtype=np.intc)

    plain = Llama(str(target), n_ctx=2048, n_threads=threads, verbose=False)
    spec = Llama(str(target), n_ctx=2048, n_threads=threads, verbose=False, draft_model=GreedyDraft())
    rows = []
    for task, prompt in TASKS.items():
        messages = [{"role": "user", "content": prompt}]
        for temperature in TEMPERATURES:
            rates: list[list[float]] = [[], []]
            try:
                for r in range(repeats):
                    for llm, out in zip((plain, spec), rates):
                        out.append(decode_rate(llm, messages, temperature, tokens, seed=r))
            except (ValueError, RuntimeError) as e:  # llama-cpp-python's speculative loop fails on some prompts
                print(f"llama-cpp-python draft {task:10} T={temperature:.1f} failed: {type(e).__name__}: {str(e)[:120]}", flush=True)
                rows.append({"engine": "llama-cpp-python draft", "task": task, "temperature": temperature, "error": f"{type(e).__name__}: {e}"})
                continue
            rows.append({"engine": "llama-cpp-python draft", "task": task, "temperature": temperature, "repeats": repeats,
                         "plain_tok_s": statistics.median(rates[0]), "spec_tok_s": statistics.median(rates[1]),
                         "speedup": statistics.median(s / p for p, s in zip(*rates)), "model_accepted": 0, "model_drafted": 0,
                         "lookup_accepted": 0, "lookup_drafted": 0, "tokens_per_forward": 0.0, "identical": None})  # fmt: skip
            print(line(rows[-1]), flush=True)
    return rows


def decode_rate(llm, messages: list[dict], temperature: float, tokens: int, seed: int) -> float:
    """Tokens per second after the first, streamed."""
    llm.reset()
    first = last = None
    n = 0
    for _ in llm.create_chat_completion(messages, temperature=temperature, max_tokens=tokens, seed=seed, stream=True, repeat_penalty=1.0):
        last = time.perf_counter()
        first = first or last
        n += 1
    return (n - 1) / (last - first) if n > 1 and last > first else 0.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pair", choices=("self", "adversarial"), default="self")
    ap.add_argument("--noise", type=float, default=0.12, help="the adversarial draft's noise, a fraction of each matrix's spread")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--engines", default="native,llama.cpp,llama.cpp/native,anchor",
                    help="comma-separated, of native, llama.cpp, TARGET/DRAFT engines (llama.cpp/native: drafting on native), anchor")
    ap.add_argument("--first-token", type=int, default=3, help="`run -n 8` processes timed per side (0: none)")
    ap.add_argument("--json", type=Path, help="write the rows here")
    args = ap.parse_args()
    target, draft = self_pair() if args.pair == "self" else adversarial_pair(args.noise)
    rows = []
    for engine in args.engines.split(","):
        if engine == "anchor":
            rows += llama_cpp_anchor(target, draft, args.threads, args.tokens, args.repeats)
        else:
            rows += ours(engine, target, draft, args.threads, args.tokens, args.repeats)
            if args.first_token:
                rows += first_tokens(engine, target, draft, args.threads, args.first_token)
    if args.json:
        meta = {"cpu": cpu_name(), "pair": args.pair, "noise": args.noise if args.pair == "adversarial" else None, "threads": args.threads, "tokens": args.tokens}
        args.json.write_text(json.dumps(meta | {"rows": rows}, indent=1))



if __name__ == "__main__":
    main()
