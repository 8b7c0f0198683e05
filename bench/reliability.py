"""The server's reliability runs at the issue's sizes (issue 15, items 3-5), each against a
fresh `localinfer serve` on 127.0.0.1, bounded in count and time. The scenarios are the
ones the tests run small (tests/reliability/serving.py).

    .venv/bin/python bench/reliability.py load         # 100 streaming clients vs --parallel 4 --max-queue 32
    .venv/bin/python bench/reliability.py disconnects  # 200 rounds of drops mid-decode, mid-prefill, queued, non-streamed
    .venv/bin/python bench/reliability.py soak         # 100 warm-up + 1,000 sequential + 1,000 concurrent; RSS and fds
    .venv/bin/python bench/reliability.py all [--engine native] [-o docs/bench/reliability.json]

The model is the F32 widening of the embedded model (made once in a cache), or --model's.
On the CPU engines greedy answers do not depend on how requests are batched, so each must
equal its prompt's answer alone; where llama.cpp runs on a GPU they may part after a common
start, and each must start more like its own prompt's answer than any other's.
Exit status 1 if any promise failed.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.reliability import serving  # noqa: E402
from tests.server.test_serve import Server  # noqa: E402


def f32_model() -> Path:
    from localinfer_quant.source import embedded_model_path
    from tests.conftest import llama_quantize

    path = Path(tempfile.gettempdir()) / "localinfer-bench-f32.gguf"
    if not path.exists():
        part = llama_quantize(embedded_model_path(), path.with_suffix(".part"), 0)  # LLAMA_FTYPE_ALL_F32
        part.rename(path)
    return path


def batch_invariant(engine: str) -> bool:
    """False where the engine offloads and a GPU is there: cuBLAS picks kernels by batch size,
    so a row's rounding depends on its batch (two answers parted so on an H200, docs/benchmarks.md)."""
    from localinfer.backends import get_backend
    from localinfer.devices import list_devices

    return not (get_backend(engine).capabilities().gpu_offload and any(d.kind == "GPU" for d in list_devices()))


def run(name: str, engine: str, model: Path) -> dict[str, object]:
    parallel = {"load": 4, "disconnects": 2, "soak": 4}[name]
    args = ["--parallel", str(parallel), "--max-queue", "32", "--draft", "none", "--engine", engine]
    server = Server(str(model), *args)
    started = time.monotonic()
    try:
        if name == "load":
            report = serving.load(server.url, parallel, clients=100, exact=batch_invariant(engine))
        elif name == "disconnects":
            report = serving.disconnects(server.url, parallel, rounds=200)
        else:
            report = serving.soak(server.url, server.proc.pid, parallel)
    finally:
        code, log = server.stop()
    if code != 0:
        report["problems"].append(f"serve exited {code} on SIGTERM")  # type: ignore[union-attr]
    if "Traceback" in log:
        report["problems"].append("the server's log has a traceback: " + log[log.index("Traceback") :][:600])  # type: ignore[union-attr]
    return {"scenario": name, "engine": engine, "server": " ".join(["localinfer serve", *args]), "seconds": round(time.monotonic() - started, 1), **report}


def plot_soak(report: dict[str, object], out: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curve = report["curve"]
    fig, ax = plt.subplots(figsize=(7, 3.2))
    ax.plot([p["requests"] for p in curve], [p["rss_mib"] for p in curve], marker=".")
    ax.set_xlabel("requests served")
    ax.set_ylabel("server RSS (MiB)")
    ax.set_title(f"soak, {report['engine']}: RSS {report['rss_mib'][0]} -> {report['rss_mib'][1]} MiB after warm-up ({report['rss_growth_pct']} %)")
    ax.axvline(1100, color="grey", linestyle=":")
    ax.text(1110, min(p["rss_mib"] for p in curve), "concurrent from here", fontsize=8)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out, dpi=110)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("scenario", choices=("load", "disconnects", "soak", "all"))
    ap.add_argument("--engine", default="llama.cpp", choices=("llama.cpp", "native"))
    ap.add_argument("--model", type=Path, help="a GGUF to serve instead of the F32 widening of the embedded model")
    ap.add_argument("-o", "--output", type=Path, help="write the reports as JSON here (and the soak curve as a PNG beside it)")
    args = ap.parse_args()
    model = args.model or f32_model()
    reports = [run(name, args.engine, model) for name in (("load", "disconnects", "soak") if args.scenario == "all" else (args.scenario,))]
    for r in reports:
        shown = {k: v for k, v in r.items() if k != "curve"}
        print(json.dumps(shown))
    if args.output:
        args.output.write_text(json.dumps(reports, indent=1) + "\n")
        for r in reports:
            if r["scenario"] == "soak":
                plot_soak(r, args.output.with_name(args.output.stem + f"-soak-{args.engine.replace('.', '')}.png"))
    sys.exit(1 if any(r["problems"] for r in reports) else 0)


if __name__ == "__main__":
    main()
