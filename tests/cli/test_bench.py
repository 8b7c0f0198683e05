"""`localinfer bench model` as a user runs it, on the embedded model with tiny tests: a row per
combination in each format, the JSON's documented fields, and bad options in one line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from ..conftest import THREADS, run_cli

FIELDS = {
    "model", "engine", "kernels", "threads", "type_k", "type_v", "draft", "gpu_layers", "cpu_moe", "rpc",  # the setup
    "test", "n_prompt", "n_gen", "samples", "avg_ts", "stddev_ts",  # the test and its tokens/s
    "model_file", "model_bytes", "n_params", "kernels_used", "verify_cost", "rss_bytes", "cpu",
    "model_drafted", "model_accepted", "lookup_drafted", "lookup_accepted",  # speculation over the tg runs
    "round_trips_per_token", "rpc_bytes_per_token",  # with --rpc
}  # fmt: skip


def test_every_combination_is_a_row_in_json_markdown_and_csv(tmp_path: Path) -> None:
    args = ("bench", "model", "-p", "16", "-n", "8", "-r", "2", "--engine", "llama.cpp,native", "-t", "1,2")
    out = run_cli(*args, "--json", "-o", str(tmp_path / "run.json"))
    assert out.returncode == 0, out.stderr
    records = json.loads(out.stdout)
    assert json.loads((tmp_path / "run.json").read_text()) == records
    combos = {(r["engine"], r["threads"], r["test"]) for r in records}
    assert combos == {(e, t, test) for e in ("llama.cpp", "native") for t in (1, 2) for test in ("pp16", "tg8")} and len(records) == 8
    for r in records:
        assert set(r) == FIELDS, set(r) ^ FIELDS
        assert len(r["samples"]) == 2 and all(s > 0 for s in r["samples"])
        assert r["avg_ts"] == pytest.approx(sum(r["samples"]) / 2, abs=1e-3) and r["stddev_ts"] >= 0
        assert (r["n_prompt"], r["n_gen"]) == ((16, 0) if r["test"] == "pp16" else (0, 8))
        assert r["verify_cost"] >= 1.0 and r["rss_bytes"] > r["model_bytes"] / 2 and r["n_params"] > 100e6
    assert {r["kernels_used"].split()[0] for r in records if r["engine"] == "native"} <= {"c", "numba"}

    # the other formats from a smaller matrix (one thread count, one repetition): 4 rows
    small = ("bench", "model", "-p", "16", "-n", "8", "-r", "1", "--engine", "llama.cpp,native", "-t", str(THREADS))
    table = run_cli(*small)
    assert table.returncode == 0, table.stderr
    lines = table.stdout.strip().splitlines()
    assert lines[0].startswith("| model") and len(lines) == 2 + 4  # header, rule, a row per test
    assert sum("native (" in line for line in lines) == 2 and sum(" pp16 " in line for line in lines) == 2

    rows = list(csv.DictReader(io.StringIO(run_cli(*small, "--csv").stdout)))
    assert len(rows) == 4 and set(rows[0]) == FIELDS


def test_a_draft_model_row_reports_its_acceptance(model_path: Path, f32_path: Path, tmp_path: Path) -> None:
    """--draft MODEL: the embedded Q4_1 drafting for its own F32 (the same weights, so drafts
    hold, at 0.18 of the bytes: a draft as dear as its target is never tried at all)."""
    out = run_cli("bench", "model", str(f32_path), "-p", "0", "-n", "24", "-r", "1", "--engine", "native", "--draft", str(model_path), "-o", str(tmp_path / "run.json"))
    assert out.returncode == 0, out.stderr
    (record,) = json.loads((tmp_path / "run.json").read_text())
    assert record["draft"] == str(model_path) and record["model_accepted"] > 0 and record["model_drafted"] >= record["model_accepted"]
    assert f"{model_path.name} (model " in out.stdout  # the table gives the acceptance per source


def test_lists_multiply_and_a_native_only_option_is_not_copied() -> None:
    out = run_cli("bench", "model", "-p", "0", "-n", "4", "-r", "1", "--engine", "llama.cpp,native", "-t", str(THREADS), "-ctk", "f16,q8_0", "-ctv", "q8_0", "--draft", "off,on", "--kernels", "c", "--json")
    assert out.returncode == 0, out.stderr
    records = json.loads(out.stdout)
    assert len(records) == 2 * 2 * 2  # engines x K types x draft; the kernels list applies to native alone
    assert {(r["engine"], r["kernels"]) for r in records} == {("llama.cpp", None), ("native", "c")}
    assert {(r["type_k"], r["type_v"], r["draft"]) for r in records} == {(k, "q8_0", d) for k in ("f16", "q8_0") for d in ("none", "prompt-lookup")}


@pytest.mark.parametrize(
    "args, says",
    [
        (("-p", "abc"), "'abc' is not a whole number"),
        (("-p", "0", "-n", "0"), "nothing to measure"),
        (("-p", "-4"), "-p: must be between 0 and"),
        (("--engine", "vllm"), "'vllm' is not one of"),
        (("-ctk", "q3_z"), "not a KV-cache type"),
        (("-t", "0"), "-t: must be between 1 and 1024"),
        (("--draft", "maybe"), "'maybe' is not on, off or a draft model"),
        (("-r", "0"), "between 1 and 100"),
        (("--json", "--csv"), "not both"),
        (("no-such-model:1b",), "no-such-model"),
    ],
)
def test_a_bad_option_is_one_line_and_runs_nothing(args: tuple[str, ...], says: str) -> None:
    out = run_cli("bench", "model", *args)
    assert out.returncode in (1, 2) and says in out.stderr and len(out.stderr.strip().splitlines()) == 1, out.stderr
    assert out.stdout == ""
