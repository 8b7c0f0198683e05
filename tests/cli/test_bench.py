"""`localinfer bench model` as a user runs it, on the embedded model with tiny tests: a row per
combination in each format, the JSON's documented fields, tests at a depth (-d) with the bytes
a decoded token reads there, and bad options in one line."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest

from ..conftest import THREADS, read_gguf, run_cli

FIELDS = {
    "model", "engine", "kernels", "threads", "type_k", "type_v", "draft", "gpu_layers", "cpu_moe", "rpc",  # the setup
    "test", "n_prompt", "n_gen", "n_depth", "samples", "avg_ts", "stddev_ts",  # the test and its tokens/s
    "bytes_per_token",  # tg: weights and KV cache a decoded token reads
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


def model_facts(path: Path) -> tuple[int, int, int]:
    """From the file itself (gguf-py's reader): the bytes of weights a decoded token reads (all
    tensors: a dense model, the output reading the embedding table where it has no matrix of
    its own), one position's f16 K and V in every layer, and the context it was trained on."""
    reader = read_gguf(path)
    arch = reader.fields["general.architecture"].contents()
    meta = lambda key: reader.fields[f"{arch}.{key}"].contents()  # noqa: E731
    n_head = meta("attention.head_count")
    head_dim = meta("attention.key_length") if f"{arch}.attention.key_length" in reader.fields else meta("embedding_length") // n_head
    tensors = {t.name: int(t.n_bytes) for t in reader.tensors}
    weights = sum(tensors.values()) - (tensors["token_embd.weight"] if "output.weight" in tensors else 0)
    return weights, meta("block_count") * meta("attention.head_count_kv") * head_dim * 2 * 2, meta("context_length")


def test_a_depth_runs_each_test_after_a_prefix_and_counts_its_cache_bytes(model_path: Path, tmp_path: Path) -> None:
    """-d 0,64: each engine's pp and tg at each depth, named as llama-bench names them; a tg
    row's bytes per token grows by exactly the f16 cache of the 64 positions more it reads;
    --bandwidth adds the share of that limit in the table (and CSV), and only then."""
    args = ("bench", "model", "-p", "16", "-n", "8", "-d", "0,64", "-r", "1", "--engine", "llama.cpp,native", "-t", str(THREADS))
    out = run_cli(*args, "--bandwidth", "20", "-o", str(tmp_path / "run.json"))
    assert out.returncode == 0, out.stderr
    records = json.loads((tmp_path / "run.json").read_text())
    names = [(d, f"pp16{at}", f"tg8{at}") for d, at in ((0, ""), (64, " @ d64"))]
    assert [(r["engine"], r["n_depth"], r["test"]) for r in records] == [(e, d, t) for e in ("llama.cpp", "native") for d, *tests in names for t in tests]
    weights, per_position, _ = model_facts(model_path)
    for r in records:
        assert set(r) == FIELDS and all(s > 0 for s in r["samples"]), r
        assert (r["bytes_per_token"] is None) == r["test"].startswith("pp")
    for engine in ("llama.cpp", "native"):
        tg = {r["n_depth"]: r["bytes_per_token"] for r in records if r["engine"] == engine and r["n_gen"]}
        assert tg[64] - tg[0] == 64 * per_position  # exactly the cache of the extra positions
        assert per_position <= tg[0] - weights <= (16 + 8) * per_position  # at depth 0: the weights and a short prompt's cache

    header, _, *lines = [[cell.strip() for cell in line.strip("|").split("|")] for line in out.stdout.strip().splitlines()]
    assert header[header.index("t/s") + 1] == "of limit" and len(lines) == len(records)
    for r, cells in zip(records, lines):  # a row per record, in the same order
        share = f"{r['samples'][0] * r['bytes_per_token'] / 20e9 * 100:.1f} %" if r["bytes_per_token"] else "–"  # one run: its mean
        assert cells[header.index("test")] == r["test"] and cells[header.index("of limit")] == share, (r, cells)

    small = ("bench", "model", "-p", "0", "-n", "4", "-d", "0,32", "-r", "1", "--engine", "native", "-t", str(THREADS))
    table = run_cli(*small)
    assert table.returncode == 0, table.stderr
    assert "of limit" not in table.stdout and " tg4 @ d32 " in table.stdout  # no bandwidth given: no guessed figure
    rows = list(csv.DictReader(io.StringIO(run_cli(*small, "--csv", "--bandwidth", "20").stdout)))
    assert [(row["test"], row["n_depth"]) for row in rows] == [("tg4", "0"), ("tg4 @ d32", "32")]
    for row in rows:
        assert float(row["of_limit"]) == pytest.approx(float(row["avg_ts"]) * int(row["bytes_per_token"]) / 20e9 * 100, abs=0.01)


def test_a_depth_past_the_trained_context_is_one_line_and_runs_nothing(model_path: Path) -> None:
    trained = model_facts(model_path)[2]
    out = run_cli("bench", "model", "-p", "16", "-n", "8", "-d", f"0,{trained}")
    assert out.returncode == 1 and out.stdout == "", out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and f"-d {trained} + -p 16 + -n 8 = {trained + 24} tokens, more than the {trained}" in out.stderr


@pytest.mark.parametrize(
    "args, says",
    [
        (("-p", "abc"), "'abc' is not a whole number"),
        (("-p", "0", "-n", "0"), "nothing to measure"),
        (("-p", "-4"), "-p: must be between 0 and"),
        (("-d", "-4"), "-d: must be between 0 and"),
        (("-d", "0,1.5"), "'1.5' is not a whole number"),
        (("-d", ","), "-d: is empty"),
        (("--bandwidth", "0"), "must be a finite number more than 0"),
        (("--bandwidth", "nan"), "must be a finite number more than 0"),
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
