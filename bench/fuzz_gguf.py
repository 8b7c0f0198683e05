"""Fuzz the model-file paths with structure-aware mutants of a real GGUF.

Each case mutates a tiny llama GGUF (tests/reliability/tiny_gguf.py: every tensor kind the
native engine reads) in 1-3 ways: truncation at a field boundary, huge or odd counts,
lengths, dimensions, types and offsets, overlapping tensors, a tensor past the end,
NaN/inf in metadata and weights, spliced bytes, duplicated keys. Then it runs what a
user's file goes through:

  scan      the GGUF header scanner (localinfer.modelfile.inspect)
  native    the native engine's load (llama.cpp's vocabulary, our weight views into the
            mmap) and a 3-token forward with a sampled token
  quantize  the quantize input path (inspect, the source check, llama.cpp's quantizer);
            every --quantize-every'th case, as it costs ~10x the others

The only acceptable outcomes are success and a one-line UserError (or OSError, which
the CLI prints as one line). Anything else is a finding: a traceback, an error of more
than one line, a crash (a signal), a hang (no answer in --timeout s), or a case that
grew the worker's peak memory by more than 512 MiB. Cases run in worker processes, so
a crash costs one worker, which is restarted after the case it died on.

    .venv/bin/python bench/fuzz_gguf.py --cases 200000 [--seed 1] [--workers 2] [--json]
    .venv/bin/python bench/fuzz_gguf.py --cases 10000 --vocab bpe

Exit status 1 if anything was found; each finding's case number reproduces it:
    .venv/bin/python bench/fuzz_gguf.py --replay SEED:CASE [--vocab bpe]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import select
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MEMORY_LIMIT = 512 << 20  # a case may not grow the worker's peak RSS by more than this


def run_case(path: Path, seed_bytes: bytes, lay: object, seed: int, case: int, quantize_every: int, scratch: Path, reraise: bool = False) -> tuple[str, str]:
    """Write case `case`'s mutant to `path`, put it through every path; (outcome, detail)."""
    import numpy as np

    from localinfer.backends.base import Batch, LoadParams
    from localinfer.backends.native import NativeBackend
    from localinfer.engine.sampler import Sampler
    from localinfer.engine.types import SamplingParams
    from localinfer.errors import UserError
    from localinfer.modelfile import inspect
    from tests.reliability.mutate_gguf import mutate

    data, what = mutate(seed_bytes, lay, np.random.default_rng([seed, case]))
    path.write_bytes(data)
    reached = "scan"
    try:
        inspect(path)
        reached = "native"
        backend = NativeBackend.load(path, LoadParams(n_ctx=16, n_threads=1, n_batch=8))
        try:
            logits = backend.forward(Batch.for_sequence([1, 5, 7], 0))
            Sampler(SamplingParams(temperature=1.0, seed=0)).sample(logits[-1], [1, 5, 7])
        finally:
            backend.close()
        if quantize_every and case % quantize_every == 0:
            reached = "quantize"
            from localinfer_quant.quantize import quantize

            quantize(path, scratch / "out.gguf", "Q8_0", allow_requantize=True, threads=1)
    except (UserError, OSError) as e:
        message = str(e)
        if "\n" in message.strip() or not message.strip():
            return "finding", f"{reached}: a {type(e).__name__} of {len(message.splitlines())} lines: {message[:300]!r} [{what}]"
        return f"refused at {reached}", type(e).__name__
    except BaseException as e:  # noqa: BLE001 - this is what we look for
        if reraise:
            raise
        return "finding", f"{reached}: traceback {type(e).__name__}: {str(e)[:300]} [{what}]"
    return "accepted", ""


def seed_model(path: Path, vocab: str) -> bytes:
    from tests.reliability.tiny_gguf import embedded_vocabulary, write_tiny_model

    return write_tiny_model(path, bpe=embedded_vocabulary() if vocab == "bpe" else None).read_bytes()


def worker(seed: int, start: int, stop: int, quantize_every: int, vocab: str) -> None:
    """Run cases [start, stop); before each, print '@@case N', after it, '@@' and its outcome."""
    import logging

    from tests.reliability.tiny_gguf import layout

    logging.disable(logging.WARNING)  # llama.cpp's quantizer logs through Python's logging
    with tempfile.TemporaryDirectory(prefix="fuzz-gguf-", dir="/dev/shm" if Path("/dev/shm").is_dir() else None) as tmp:
        scratch = Path(tmp)
        seed_bytes = seed_model(scratch / "seed.gguf", vocab)
        lay = layout(seed_bytes)
        path = scratch / "case.gguf"
        for case in range(start, stop):
            print(f"@@case {case}", flush=True)
            before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
            outcome, detail = run_case(path, seed_bytes, lay, seed, case, quantize_every, scratch)
            grown = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
            if grown > MEMORY_LIMIT and outcome != "finding":
                outcome, detail = "finding", f"peak memory grew by {grown >> 20} MiB"
            print("@@" + json.dumps({"case": case, "outcome": outcome, "detail": detail}), flush=True)


def run_all(seed: int, cases: int, workers: int, timeout: float, quantize_every: int, vocab: str, progress: bool) -> dict[str, object]:
    """Split the cases over worker processes; a worker that dies or hangs is a finding for
    the case it was on, and a fresh worker goes on after it."""
    counts: Counter[str] = Counter()
    findings: list[dict[str, object]] = []
    todo = [(w * cases // workers, (w + 1) * cases // workers) for w in range(workers)]
    running: dict[int, dict[str, object]] = {}
    started = time.monotonic()
    done = 0

    def spawn(start: int, stop: int) -> None:
        cmd = [sys.executable, __file__, "--worker", f"{seed}:{start}:{stop}", "--quantize-every", str(quantize_every), "--vocab", vocab]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, bufsize=1, env={**os.environ, "PYTHONFAULTHANDLER": ""})
        running[proc.stdout.fileno()] = {"proc": proc, "stop": stop, "case": start - 1, "seen": time.monotonic()}

    for start, stop in todo:
        if start < stop:
            spawn(start, stop)
    while running:
        ready, _, _ = select.select(list(running), [], [], 1.0)
        now = time.monotonic()
        for fd in list(running):
            w = running[fd]
            proc: subprocess.Popen = w["proc"]  # type: ignore[assignment]
            line = proc.stdout.readline() if fd in ready else None
            if line:
                w["seen"] = now
                if not line.startswith("@@"):  # something llama.cpp printed
                    continue
                if line.startswith("@@case "):
                    w["case"] = int(line.split()[1])
                else:
                    result = json.loads(line[2:])
                    done += 1
                    counts[result["outcome"]] += 1
                    if result["outcome"] == "finding":
                        findings.append({"case": f"{seed}:{result['case']}", "what": result["detail"]})
                    if progress and done % 1000 == 0:
                        print(f"{done:,}/{cases:,} cases, {len(findings)} findings, {time.monotonic() - started:.0f} s", file=sys.stderr, flush=True)
                continue
            hung = now - w["seen"] > timeout
            if line == "" or hung:  # the worker ended, died or hangs
                if hung:
                    proc.kill()
                rc = proc.wait()
                del running[fd]
                case, stop = int(w["case"]), int(w["stop"])  # type: ignore[arg-type]
                if rc != 0 or hung:
                    done += 1
                    counts["finding"] += 1
                    findings.append({"case": f"{seed}:{case}", "what": f"hang (no answer in {timeout:g} s)" if hung else f"crash (exit {rc})"})
                if case + 1 < stop and (rc != 0 or hung):
                    spawn(case + 1, stop)
    return {
        "vocab": vocab,
        "seed": seed,
        "cases": done,
        "seconds": round(time.monotonic() - started, 1),
        "outcomes": dict(counts.most_common()),
        "findings": findings,
    }


def replay(spec: str, vocab: str) -> None:
    """Run one case in this process, with its traceback if it has one."""
    import numpy as np

    from tests.reliability.mutate_gguf import mutate
    from tests.reliability.tiny_gguf import layout

    seed, case = (int(x) for x in spec.split(":"))
    with tempfile.TemporaryDirectory() as tmp:
        seed_bytes = seed_model(Path(tmp) / "seed.gguf", vocab)
        data, what = mutate(seed_bytes, layout(seed_bytes), np.random.default_rng([seed, case]))
        print(f"case {spec}: {what}")
        keep = Path(f"fuzz-case-{seed}-{case}.gguf")
        keep.write_bytes(data)
        print(f"wrote the mutant to {keep}")
        print(run_case(Path(tmp) / "case.gguf", seed_bytes, layout(seed_bytes), seed, case, 1, Path(tmp), reraise=True))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cases", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--timeout", type=float, default=30.0, help="seconds without an answer that make a case a hang")
    ap.add_argument("--quantize-every", type=int, default=10, help="run llama.cpp's quantizer on every Nth case (0: never)")
    ap.add_argument("--vocab", choices=("spm", "bpe"), default="spm",
                    help="the tiny model's vocabulary: 48 SentencePiece-style tokens (~1 ms a case), or the embedded model's 49,152 BPE tokens and merges (~50 ms)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("-o", "--output", type=Path, help="also write the JSON report here")
    ap.add_argument("--replay", metavar="SEED:CASE", help="run one case here and show what it does")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        seed, start, stop = (int(x) for x in args.worker.split(":"))
        worker(seed, start, stop, args.quantize_every, args.vocab)
        return
    if args.replay:
        replay(args.replay, args.vocab)
        return
    report = run_all(args.seed, args.cases, args.workers, args.timeout, args.quantize_every, args.vocab, progress=not args.json)
    if args.output:
        args.output.write_text(json.dumps(report, indent=1) + "\n")
    if args.json:
        print(json.dumps(report))
    else:
        print(f"{report['cases']:,} cases in {report['seconds']} s ({args.vocab} vocabulary, seed {report['seed']}): {report['outcomes']}")
        for f in report["findings"]:
            print(f"  {f['case']}: {f['what']}")
    sys.exit(1 if report["findings"] else 0)


if __name__ == "__main__":
    main()
