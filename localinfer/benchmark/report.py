"""`bench model`'s results as a Markdown table (llama-bench's layout: one row per test, the
same test the same row whichever engine ran it), CSV or JSON."""

from __future__ import annotations

import csv
import io
import json

from localinfer.benchmark.model import VERIFY_ROWS, Result

COLUMNS = ("model", "size", "params", "engine", "threads", "type_k", "type_v", "draft", "test", "t/s", f"verify {VERIFY_ROWS} rows", "RSS")


def _size(n: int) -> str:
    return f"{n / 2**20:.1f} MiB" if n < 2**30 else f"{n / 2**30:.2f} GiB"


def _params(n: int) -> str:
    return f"{n / 1e6:.1f} M" if n < 1e9 else f"{n / 1e9:.2f} B"


def _engine(r: Result) -> str:
    return f"native ({(r.kernels_used or r.setup.kernels or 'auto').split(' ', 1)[0]})" if r.setup.engine == "native" else r.setup.engine + (f", ngl {r.setup.gpu_layers}" if r.setup.gpu_layers else "")


def row(r: Result) -> list[str]:
    s = r.setup
    return [
        s.model.rsplit("/", 1)[-1], _size(r.model_bytes), _params(r.n_params), _engine(r), str(s.threads), s.type_k, s.type_v,
        "prompt-lookup" if s.draft else "none", r.test, f"{r.avg:.2f} ± {r.stdev:.2f}",
        f"{r.verify_cost:.2f}×" if r.verify_cost else "–", _size(r.rss_bytes) if r.rss_bytes else "–",
    ]  # fmt: skip


def markdown(results: list[Result]) -> str:
    rows = [list(COLUMNS)] + [row(r) for r in results]
    widths = [max(len(x[i]) for x in rows) for i in range(len(COLUMNS))]
    right = {"size", "params", "threads", "t/s", f"verify {VERIFY_ROWS} rows", "RSS"}
    line = lambda cells: "| " + " | ".join(c.rjust(w) if COLUMNS[i] in right else c.ljust(w) for i, (c, w) in enumerate(zip(cells, widths))) + " |"  # noqa: E731
    rule = "|" + "|".join(("-" * (w + 1) + ":") if COLUMNS[i] in right else "-" * (w + 2) for i, w in enumerate(widths)) + "|"
    return "\n".join([line(rows[0]), rule, *(line(r) for r in rows[1:])])


def as_json(results: list[Result]) -> str:
    return json.dumps([r.as_dict() for r in results], indent=2)


def as_csv(results: list[Result]) -> str:
    records = [r.as_dict() for r in results]
    out = io.StringIO()
    if records:
        writer = csv.DictWriter(out, fieldnames=list(records[0]))
        writer.writeheader()
        for record in records:
            writer.writerow({k: json.dumps(v) if isinstance(v, list) else v for k, v in record.items()})
    return out.getvalue()
