"""`bench model`'s results as a Markdown table (llama-bench's layout: one row per test, the
same test the same row whichever engine ran it), CSV or JSON. Given the machine's read
bandwidth, the table and the CSV add each tg row's share of the limit it sets."""

from __future__ import annotations

import csv
import io
import json

from localinfer.benchmark.model import VERIFY_ROWS, Result

COLUMNS = ("model", "size", "params", "engine", "threads", "type_k", "type_v", "draft", "test", "t/s", f"verify {VERIFY_ROWS} rows", "RSS")
LIMIT = "of limit"  # with a bandwidth: after t/s
RIGHT = {"size", "params", "threads", "t/s", LIMIT, f"verify {VERIFY_ROWS} rows", "RSS"}


def of_limit(r: Result, bandwidth: float) -> float | None:
    """A tg row's bytes read per second over the machine's read bandwidth (GB/s), in percent:
    how near decoding runs to the rate memory allows at that depth. None for a pp row."""
    return r.avg * r.bytes_per_token / (bandwidth * 1e9) * 100 if r.bytes_per_token else None


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def _engine(r: Result) -> str:
    kernels = r.kernels_used or r.setup.kernels  # only an engine with kernel sets has them
    if kernels:
        return f"{r.setup.engine} ({kernels.split(' ', 1)[0]})"
    workers = len(r.setup.rpc.split(",")) if r.setup.rpc else 0
    trips = f", {r.round_trips_per_token:.1f} round trips and {r.rpc_bytes_per_token / 1e3:.0f} kB a token" if r.round_trips_per_token is not None else ""
    experts = f", ncmoe {r.setup.cpu_moe}" if r.setup.cpu_moe != "auto" else ""
    return r.setup.engine + (f", ngl {r.setup.gpu_layers}" if r.setup.gpu_layers else "") + experts + (f", {workers} RPC worker{'s' * (workers > 1)}{trips}" if workers else "")


def _draft(r: Result) -> str:
    """The speculation, with the acceptance per source where a tg test drafted."""
    name = r.setup.draft.rsplit("/", 1)[-1]
    rates = [f"{label} {a / d:.0%}" for label, d, a in (("model", r.model_drafted, r.model_accepted), ("lookup", r.lookup_drafted, r.lookup_accepted)) if d]
    return f"{name} ({', '.join(rates)})" if rates else name


def columns(bandwidth: float | None = None) -> list[str]:
    at = COLUMNS.index("t/s") + 1
    return [*COLUMNS[:at], *([LIMIT] if bandwidth else []), *COLUMNS[at:]]


def row(r: Result, bandwidth: float | None = None) -> list[str]:
    s = r.setup
    share = of_limit(r, bandwidth) if bandwidth else None
    return [
        s.model.rsplit("/", 1)[-1], _size(r.model_bytes), _params(r.n_params), _engine(r), str(s.threads), s.type_k, s.type_v,
        _draft(r), r.test, f"{r.avg:.2f} ± {r.stdev:.2f}", *([f"{share:.1f} %" if share is not None else "–"] if bandwidth else []),
        f"{r.verify_cost:.2f}×" if r.verify_cost else "–", _size(r.rss_bytes) if r.rss_bytes else "–",
    ]  # fmt: skip


def markdown(results: list[Result], bandwidth: float | None = None) -> str:
    header = columns(bandwidth)
    rows = [header] + [row(r, bandwidth) for r in results]
    widths = [max(len(x[i]) for x in rows) for i in range(len(header))]
    line = lambda cells: "| " + " | ".join(c.rjust(w) if header[i] in RIGHT else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"  # noqa: E731
    rule = "|" + "|".join(("-" * (w + 1) + ":") if header[i] in RIGHT else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:])])


def as_json(results: list[Result]) -> str:
    return json.dumps([r.as_dict() for r in results], indent=2)


def as_csv(results: list[Result], bandwidth: float | None = None) -> str:
    """One line per test, the JSON's fields; with a bandwidth, `of_limit` after them (percent;
    empty for a pp row)."""
    records = [r.as_dict() for r in results]
    if bandwidth:
        for r, record in zip(results, records):
            share = of_limit(r, bandwidth)
            record["of_limit"] = round(share, 2) if share is not None else None
    out = io.StringIO()
    if records:
        writer = csv.DictWriter(out, fieldnames=list(records[0]))
        writer.writeheader()
        for record in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in record.items()})
    return out.getvalue()


# --- bench serve ---------------------------------------------------------------------------------
def _ms(p: dict | None, q: str) -> str:
    value = (p or {}).get(q)
    return "–" if value is None else f"{value * 1e3:.0f}"


def _level(level: dict) -> str:
    return f"c={level['concurrency']}" if level.get("concurrency") else f"{level['rate']:g} req/s"


SERVE_COLUMNS = ("load", "ok/sent", "TTFT p50/p90/p99 ms", "TPOT p50/p90/p99 ms", "ITL p50/p99 ms", "E2E p50/p99 ms", "req/s", "tok/s", "goodput req/s")


def serve_row(level: dict) -> list[str]:
    s = level["summary"]
    tri = lambda key: "/".join(_ms(s[key], q) for q in ("p50", "p90", "p99"))  # noqa: E731
    return [
        _level(level), f"{s['ok']}/{s['requests']}", tri("ttft_s"), tri("tpot_s"),
        f"{_ms(s['itl_s'], 'p50')}/{_ms(s['itl_s'], 'p99')}", f"{_ms(s['e2e_s'], 'p50')}/{_ms(s['e2e_s'], 'p99')}",
        f"{s['request_throughput']:.2f}", f"{s['output_throughput']:.1f}", f"{s['goodput']:.2f}",
    ]  # fmt: skip


def _table(header: list[str], rows: list[list[str]]) -> str:
    line = lambda cells: "| " + " | ".join(cells) + " |"  # noqa: E731
    return "\n".join([line(header), "|" + "|".join("---" if i == 0 else "---:" for i in range(len(header))) + "|", *(line(r) for r in rows)])


def serve_markdown(run: dict) -> str:
    slo = ", ".join(f"{k.removeprefix('slo_').removesuffix('_ms').upper()} ≤ {run[k]:g} ms" for k in ("slo_ttft_ms", "slo_tpot_ms") if run.get(k) is not None)
    title = f"{run.get('label') or run['url']} · {run['model'] or 'default model'} · {run['workload']} · {run['requests_per_level']} requests per level" + (f" · SLO {slo}" if slo else "")
    errors = [f"- {_level(level)}: " + "; ".join(level["summary"]["errors"]) for level in run["levels"] if level["summary"]["errors"]]
    return "\n".join([title, "", _table(list(SERVE_COLUMNS), [serve_row(level) for level in run["levels"]]), *(["", "Errors:", *errors] if errors else [])])


COMPARED = (("TTFT p50 ms", "ttft_s", "p50"), ("TTFT p99 ms", "ttft_s", "p99"), ("TPOT p50 ms", "tpot_s", "p50"), ("TPOT p99 ms", "tpot_s", "p99"), ("E2E p50 ms", "e2e_s", "p50"))


def compare_markdown(a: dict, b: dict) -> str:
    """Level by level (matched by load), each metric as A, B and B/A."""
    header = ["load", "metric", "A", "B", "B/A"]
    rows = []
    b_levels = {_level(level): level for level in b["levels"]}
    for level in a["levels"]:
        other = b_levels.get(_level(level))
        if other is None:
            continue
        sa, sb = level["summary"], other["summary"]
        pairs = [(name, (sa[key] or {}).get(q), (sb[key] or {}).get(q), 1e3) for name, key, q in COMPARED]
        pairs += [("req/s", sa["request_throughput"], sb["request_throughput"], 1), ("tok/s", sa["output_throughput"], sb["output_throughput"], 1), ("goodput req/s", sa["goodput"], sb["goodput"], 1), ("failed", sa["failed"], sb["failed"], 1)]
        for name, x, y, scale in pairs:
            ratio = f"{y / x:.2f}" if x and y is not None else "–"
            fmt = lambda v: "–" if v is None else (f"{v * scale:.0f}" if scale != 1 else f"{v:.2f}" if isinstance(v, float) else str(v))  # noqa: E731
            rows.append([_level(level), name, fmt(x), fmt(y), ratio])
    if not rows:
        return "The two runs share no load level."
    name = lambda run: f"{run.get('label') or run['url']} · {run['model'] or 'default model'} · {run['workload']}"  # noqa: E731
    return "\n".join([f"A: {name(a)}", f"B: {name(b)}", "", _table(header, rows)])
