"""schemathesis against `localinfer serve`'s own OpenAPI document (issue 15, item 2).

Every operation, generated from the schema (positive and negative cases), in three runs:
a server without a key; a server with --api-key and requests that carry it; the same
server and requests without it (every answer must then be a documented 401). The checks:
no 5xx, and every status, content type, header and body as the document says.

    .venv/bin/python bench/api_fuzz.py [--max-examples 100] [--report-dir docs/bench/schemathesis] [--runs no-key,with-key,wrong-key] [--phases ...]

Exit status 1 if any check failed; the JUnit reports name each failing case.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.server.test_serve import Server  # noqa: E402

CHECKS = "not_a_server_error,status_code_conformance,content_type_conformance,response_schema_conformance,response_headers_conformance"
KEY = "sk-local-test-key"
# A short context bounds each generated request's answer (max_tokens may be anything).
SERVE = ("--ctx", "64", "--parallel", "2", "--draft", "none")


def schemathesis(url: str, name: str, args: argparse.Namespace, header: str | None) -> int:
    cmd = [
        str(Path(sys.executable).with_name("schemathesis")), "run", url + "/openapi.json", "--checks", CHECKS,
        "--max-examples", str(args.max_examples), "--seed", str(args.seed), "--request-timeout", "120", "--workers", "1",
        "--phases", args.phases, "--report", "junit", "--report-junit-path", str(args.report_dir / f"{name}.xml"),
    ]  # fmt: skip
    if header:
        cmd += ["--header", header]
    print("$", " ".join(cmd), flush=True)
    return subprocess.run(cmd, cwd=args.report_dir).returncode  # its .schemathesis cache goes there too


RUNS = ("no-key", "with-key", "wrong-key")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-examples", type=int, default=100, help="examples per operation and phase")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--phases", default="examples,coverage,fuzzing", help="schemathesis's phases (the coverage phase's ~140 boundary cases per operation are most of the time)")
    ap.add_argument("--report-dir", type=Path, default=Path("schemathesis-reports"))
    ap.add_argument("--runs", default=",".join(RUNS), help=f"which of the three runs, comma-separated (default: all: {','.join(RUNS)})")
    args = ap.parse_args()
    runs = args.runs.split(",")
    if not runs or not set(runs) <= set(RUNS):
        ap.error(f"--runs takes some of {', '.join(RUNS)}, got {args.runs!r}")
    args.report_dir = args.report_dir.resolve()
    args.report_dir.mkdir(parents=True, exist_ok=True)
    failed = 0
    if "no-key" in runs:
        server = Server(*SERVE)
        try:
            failed += schemathesis(server.url, "no-key", args, None) != 0
        finally:
            failed += server.stop()[0] != 0
    if "with-key" in runs or "wrong-key" in runs:
        server = Server(*SERVE, "--api-key", KEY)
        headers = {"with-key": f"Authorization: Bearer {KEY}", "wrong-key": "Authorization: Bearer wrong"}
        try:
            for name in ("with-key", "wrong-key"):
                if name in runs:
                    failed += schemathesis(server.url, name, args, headers[name]) != 0
        finally:
            failed += server.stop()[0] != 0
    print("schemathesis: " + ("all checks passed" if not failed else f"{failed} run(s) failed"))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
