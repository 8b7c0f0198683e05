"""schemathesis against serve's OpenAPI document (issue 15, item 2), a few generated
requests per operation of the four dialects: no 5xx, and every answer as the document
says, with the API key and with a wrong one. bench/api_fuzz.py runs the same with 100
examples per operation, the coverage phase (its ~140 boundary cases per operation, most of
the time: a minute for the 19 operations, so not in CI) and a server without a key too."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from xml.etree import ElementTree

ROOT = Path(__file__).resolve().parents[2]


def operations() -> int:
    """How many operations serve's OpenAPI document has (the app is built, no model loaded)."""
    from localinfer.engine.loader import LoadOptions
    from localinfer.server.app import create_app
    from localinfer.server.host import ModelHost

    paths = create_app(ModelHost(None, LoadOptions())).openapi()["paths"]
    return sum(len(methods) for methods in paths.values())


def test_schemathesis_finds_no_server_error_and_no_schema_violation(tmp_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "api_fuzz.py"), "--max-examples", "5", "--report-dir", str(tmp_path),
                        "--runs", "with-key,wrong-key", "--phases", "examples,fuzzing"],
                       capture_output=True, text=True, timeout=900)  # fmt: skip
    assert r.returncode == 0, r.stdout[-4000:]
    for name in ("with-key", "wrong-key"):
        suite = ElementTree.parse(tmp_path / f"{name}.xml").getroot()
        cases = suite.iter("testcase")
        assert sum(1 for _ in cases) == operations(), name  # every operation was run
        assert not list(suite.iter("failure")) and not list(suite.iter("error")), name
