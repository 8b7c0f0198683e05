"""The C kernels' SIMD paths against each other, in one process: the installed build (made for
this CPU: AVX-512 and VNNI where it has them) and the same sources built for AVX2 alone.

For each build: the verify-cost curve of bench/speculative.py (forward time of 1, 2, 4, 8, 16
rows after a 256-token prefix), rounds interleaved, medians.

    .venv/bin/python bench/kernel_builds.py [--model PATH] [--threads 2] [--rounds 3] [--json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

import localinfer.backends.native.backend as native_backend  # noqa: E402
from localinfer.backends.base import LoadParams  # noqa: E402
from localinfer.store.pull import local_path  # noqa: E402
from localinfer.store.refs import resolve  # noqa: E402
from localinfer_native.c_kernels import CKernels  # noqa: E402
from speculative import verify_curve  # noqa: E402

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
        backends = {name: load(path, lib, args.threads) for name, lib in builds.items()}
        curves: dict[str, list[dict[int, float]]] = {name: [] for name in builds}
        for _ in range(args.rounds):
            for name, backend in backends.items():
                curves[name].append(verify_curve(backend, repeats=9))
        result = {}
        for name, backend in backends.items():
            med = {n: statistics.median(c[n] for c in curves[name]) for n in (1, 2, 4, 8, 16)}
            result[name] = {"kernels": backend.kernels.describe(), "ms": med, "ratio": {n: v / med[1] for n, v in med.items()}}
            print(f"{name:9} {backend.kernels.describe():55} " + " | ".join(f"{n} rows {v:.2f} ms ({v / med[1]:.2f}x)" for n, v in med.items()), flush=True)
            backend.close()
    if args.json:
        print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
