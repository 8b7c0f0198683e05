"""Plots of a `bench serve` run: latency percentiles against load and throughput against
load, with matplotlib into a PNG, and a small one in the terminal with plotext."""

from __future__ import annotations

from pathlib import Path


def _series(run: dict) -> tuple[list[float], str, dict[str, list[float]]]:
    levels = run["levels"]
    closed = all(level["concurrency"] for level in levels)
    xs = [float(level["concurrency"] if closed else level["rate"]) for level in levels]
    get = lambda metric, q: [((level["summary"][metric] or {}).get(q) or 0.0) * 1e3 for level in levels]  # noqa: E731
    series = {f"TTFT {q}": get("ttft_s", q) for q in ("p50", "p90", "p99")} | {f"TPOT {q}": get("tpot_s", q) for q in ("p50", "p99")}
    series["tokens/s"] = [level["summary"]["output_throughput"] for level in levels]
    series["goodput"] = [level["summary"]["goodput"] for level in levels]
    return xs, "concurrency" if closed else "requests/s offered", series


def png(run: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, xlabel, series = _series(run)
    fig, (lat, thr) = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, ys in series.items():
        if name.startswith(("TTFT", "TPOT")):
            lat.plot(xs, ys, marker="o", label=name)
    lat.set(xlabel=xlabel, ylabel="ms (log scale)", title="Latency percentiles against load", yscale="log")
    lat.legend(fontsize=8)
    thr.plot(xs, series["tokens/s"], marker="o", color="tab:green", label="output tokens/s")
    thr.set(xlabel=xlabel, ylabel="output tokens/s", title="Throughput against load")
    good = thr.twinx()
    good.plot(xs, series["goodput"], marker="s", color="tab:purple", label="goodput (req/s)")
    good.set_ylabel("goodput, requests/s")
    thr.legend(loc="upper left", fontsize=8)
    good.legend(loc="lower right", fontsize=8)
    fig.suptitle(f"{run.get('label') or run['url']} · {run['model'] or 'default model'} · workload {run['workload']}", fontsize=10)
    fig.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp.png")
    fig.savefig(tmp, dpi=110)
    plt.close(fig)
    tmp.replace(path)


def terminal(run: dict) -> str:
    import plotext as plt

    xs, xlabel, series = _series(run)
    plt.clf()
    plt.plotsize(70, 15)
    for name in ("TTFT p50", "TTFT p99", "TPOT p50"):
        plt.plot(xs, series[name], label=name, marker="dot")
    plt.xlabel(xlabel)
    plt.ylabel("ms")
    plt.title("latency against load")
    return plt.build()
