"""The C kernels' SIMD paths against each other, in one process: the installed build (made for
this CPU: AVX-512 and VNNI where it has them) and the same sources built for AVX2 alone.

For each build: GB/s of weight bytes of a 4096x4096 matvec of each legacy block type (per byte
against Q4_0: Llama.cpp's Q4_K_M falls back to Q5_0 for most of a small model), and the
verify-cost curve of bench/speculative.py (forward time of 1, 2, 4, 8, 16 rows after a
256-token prefix); rounds interleaved, medians.

    .venv/bin/python bench/kernel_builds.py [--model PATH] [--threads 2] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import numpy as np  # noqa: E402
from gguf import GGMLQuantizationType as Q  # noqa: E402

import localinfer.backends.native.backend as native_backend  # noqa: E402
from localinfer.backends.base import LoadParams  # noqa: E402
from localinfer.store.pull import local_path  # noqa: E402
from localinfer.store.refs import resolve  # noqa: E402
from localinfer_native.c_kernels import CKernels  # noqa: E402
from speculative import verify_curve  # noqa: E402
from tests.native.blocks import random_qmatrix  # noqa: E402

SRC = ROOT / "native" / "c"


def build_avx2(out: Path) -> Path:
    sources = [str(p) for p in sorted(SRC.glob("*.c"))]
    subprocess.run(["gcc", "-O3", "-std=gnu11", "-shared", "-fPIC", "-fopenmp", "-mavx2", "-mfma", "-mf16c", "-I", str(SRC), *sources, "-o", str(out), "-lm"],
                   check=True)  # fmt: skip
    return out


def load(path: Path, library: str | None, threads: int):
    """A native backend whose C kernels come from `library` (None: the installed build)."""
    native_backend.load_kernels = lambda name, n: CKernels(threads=n, library=library)
    return native_backend.NativeBackend.load(path, LoadParams(n_ctx=2048, n_threads=threads, kernels="c"))


def matvec_rates(builds: dict[str, str | None], threads: int, rounds: int) -> dict[str, dict[str, float]]:
    """GB/s of weight bytes per legacy type and build, 4096x4096, n = 1; best of 5 per round, median over rounds."""
    rng = np.random.default_rng(0)
    kernels = {name: CKernels(threads=threads, library=lib) for name, lib in builds.items()}
    x, y = rng.standard_normal((1, 4096), dtype=np.float32), np.empty((1, 4096), np.float32)
    rates: dict[str, dict[str, float]] = {name: {} for name in builds}
    for qtype in (Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0):
        m = random_qmatrix(qtype, 4096, 4096, rng)
        ops = {name: k.matmul_op([m]) for name, k in kernels.items()}
        times: dict[str, list[float]] = {name: [] for name in builds}
        for _ in range(rounds * 3):
            for name, op in ops.items():
                best = float("inf")
                for _ in range(5):
                    t = time.perf_counter()
                    op(x, (y,))
                    best = min(best, time.perf_counter() - t)
                times[name].append(best)
        for name in builds:
            rates[name][qtype.name] = m.nbytes / statistics.median(times[name]) / 1e9
    for name, r in rates.items():
        print(f"{name:9} matvec GB/s " + " | ".join(f"{t} {v:.1f} ({v / r['Q4_0']:.2f} of Q4_0)" for t, v in r.items()), flush=True)
    return rates


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", help="a GGUF file (default: the embedded model)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    path = Path(args.model) if args.model else local_path(resolve(None))
    with tempfile.TemporaryDirectory() as tmp:
        builds = {"installed": None, "avx2": str(build_avx2(Path(tmp) / "_ckernels_avx2.so"))}
        matvec = matvec_rates(builds, args.threads, args.rounds)
        backends = {name: load(path, lib, args.threads) for name, lib in builds.items()}
        curves: dict[str, list[dict[int, float]]] = {name: [] for name in builds}
        for _ in range(args.rounds):
            for name, backend in backends.items():
                curves[name].append(verify_curve(backend, repeats=9))
        result = {}
        for name, backend in backends.items():
            med = {n: statistics.median(c[n] for c in curves[name]) for n in (1, 2, 4, 8, 16)}
            result[name] = {"kernels": backend.kernels.describe(), "matvec_gb_s": matvec[name], "verify_ms": med, "verify_ratio": {n: v / med[1] for n, v in med.items()}}
            print(f"{name:9} {backend.kernels.describe():55} " + " | ".join(f"{n} rows {v:.2f} ms ({v / med[1]:.2f}x)" for n, v in med.items()), flush=True)
            backend.close()
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
