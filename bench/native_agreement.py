"""How closely the native engine follows llama.cpp, next to how closely llama.cpp follows itself.

For the embedded Q4_1, a Q4_K_M and an F32 made from it by llama.cpp's quantizer:

  teacher-forced   256 tokens of tests.native's text in one batch: top-1 agreement and
                   mean/max |logit difference| of native (C, Numba) against llama.cpp
                   (flash attention on: its default), and of llama.cpp with flash
                   attention off against the same
  greedy           for tests.native's 5 chat prompts, how many of the first 32 greedy
                   tokens match llama.cpp's before the first difference

    .venv/bin/python bench/native_agreement.py [--json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import Llama

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # for tests.native

from localinfer.backends.base import Batch, LoadParams  # noqa: E402
from localinfer.backends.llamacpp import LlamaCppBackend  # noqa: E402
from localinfer.backends.native import NativeBackend  # noqa: E402
from localinfer.engine.engine import Engine  # noqa: E402
from localinfer.engine.types import SamplingParams  # noqa: E402
from localinfer.store.pull import local_path  # noqa: E402
from localinfer.store.refs import resolve  # noqa: E402
from tests.conftest import llama_quantize  # noqa: E402
from tests.native.test_native_vs_llamacpp import N_CTX, N_FORCED, N_GREEDY, PROMPTS, TEXT  # noqa: E402

THREADS = 2


def stats(a: np.ndarray, b: np.ndarray) -> dict[str, float]:
    d = np.abs(a - b)
    return {"top1": float(np.mean(a.argmax(1) == b.argmax(1))), "mean": float(d.mean()), "max": float(d.max())}


def common_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def measure(path: Path) -> dict:
    greedy = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=N_GREEDY)
    ref_backend = LlamaCppBackend.load(path, LoadParams(n_ctx=N_CTX, n_threads=THREADS))
    ref = Engine(ref_backend)
    tokens = ref_backend.tokenize(TEXT, add_special=False)[:N_FORCED]
    theirs = ref_backend.forward(Batch.for_sequence(tokens, 0, all_logits=True)).copy()  # llama.cpp's own buffer: the next decode overwrites it
    ref_backend.kv_clear(0)
    prompts = [ref.tokenize_prompt(ref.render_chat([{"role": "user", "content": p}])) for p in PROMPTS]
    expected = [ref.complete(p, greedy).tokens for p in prompts]
    ref_backend.close()

    out: dict[str, dict] = {}
    fa_off = Llama(str(path), n_ctx=N_CTX, n_threads=THREADS, flash_attn=False, logits_all=True, verbose=False)
    fa_off.eval(tokens)
    forced = stats(np.array(fa_off.scores[: len(tokens)], dtype=np.float32), theirs)
    matches = []
    for p, want in zip(prompts, expected):
        got = []
        for t in fa_off.generate(p, temp=0, top_k=1, repeat_penalty=1.0, reset=True):
            got.append(t)
            if len(got) == N_GREEDY:
                break
        matches.append(common_prefix(got, want))
    fa_off.close()
    out["llama.cpp, flash attention off"] = {"forced": forced, "greedy_prefix": matches}

    for kernels in ("c", "numba"):
        native = NativeBackend.load(path, LoadParams(n_ctx=N_CTX, n_threads=THREADS, kernels=kernels))
        forced = stats(native.forward(Batch.for_sequence(tokens, 0, all_logits=True)), theirs)
        native.kv_clear(0)
        ours = Engine(native)
        matches = [common_prefix(ours.complete(p, greedy).tokens, want) for p, want in zip(prompts, expected)]
        native.close()
        out[f"native {kernels}"] = {"forced": forced, "greedy_prefix": matches}
    return out


def sensitivity(path: Path) -> dict[str, float]:
    """How far our own logits move when the input embeddings are scaled by (1 + 1e-6):
    on quantized models as far as switching engines, which is why the tests hold the
    native engine to llama.cpp's own spread there. A measurement, not a test: better
    numerics would rightly shrink it."""
    native = NativeBackend.load(path, LoadParams(n_ctx=N_CTX, n_threads=THREADS, kernels="c"))
    tokens = native.tokenize(TEXT, add_special=False)[:N_FORCED]
    before = native.forward(Batch.for_sequence(tokens, 0, all_logits=True))
    native.kv_clear(0)
    embed = native.model.embed
    native.model.embed = lambda ids: embed(ids) * np.float32(1 + 1e-6)
    after = native.forward(Batch.for_sequence(tokens, 0, all_logits=True))
    native.close()
    return stats(after, before)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    src = local_path(resolve(None))
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = {
            "F32": llama_quantize(src, Path(tmp) / "f32.gguf", llama_cpp.LLAMA_FTYPE_ALL_F32),
            "Q4_1 (embedded)": src,
            "Q4_K_M": llama_quantize(src, Path(tmp) / "q4km.gguf", llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M),
        }
        for name, path in models.items():
            results[name] = measure(path)
            results[name]["native c, embeddings x (1 + 1e-6)"] = {"forced": sensitivity(path), "greedy_prefix": []}
            print(f"\n{name}: against llama.cpp (flash attention on)")
            for who, r in results[name].items():
                f = r["forced"]
                print(
                    f"  {who:32} teacher-forced top-1 {f['top1']:.4f}, mean |diff| {f['mean']:.4f}, max {f['max']:.3f}"
                    + (f" | greedy tokens matching, per prompt: {r['greedy_prefix']} of {N_GREEDY}" if r["greedy_prefix"] else ""),
                    flush=True,
                )
    if args.json:
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
