"""bench/prefill_profile.py and its peak kernel (li_peak_gmacs in native/c/membench.c), on
bench/synthetic.py's tiny shape at Q4_K_M (no timing is asserted): the peaks are positive
finite numbers for every instruction the kernels use, the products are the model's own (read
back from the file with gguf-py's types), the per-operation times of a forward add up to its
total with a non-negative remainder, and the timers change neither the logits nor the model."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
from gguf import GGMLQuantizationType as T

from localinfer.backends.base import Batch
from localinfer.modelfile import inspect

from ..cli.test_errors import assert_one_line_error
from ..conftest import THREADS
from . import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "prefill_profile.py"
SYNTHETIC = ROOT / "bench" / "synthetic.py"
TOKENS = 32
# the engine's fused products, by the GGUF tensors they bind (blk.N.<name>.weight)
LAYER_OPS = {"qkv": ["attn_q", "attn_k", "attn_v"], "o": ["attn_output"], "gate/up": ["ffn_gate", "ffn_up"], "down": ["ffn_down"]}


@pytest.fixture(scope="module")
def profile():
    module = load_script("prefill_profile")
    try:
        module._library()
    except module.ProfileError as e:
        pytest.skip(str(e))  # no C compiler at install: the native engine runs on Numba
    return module


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("tiny")
    args = [sys.executable, str(SYNTHETIC), "tiny", "--types", "Q4_K_M", "--out", str(out), "--threads", str(THREADS)]
    r = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr
    return Path(r.stdout.split()[-1])


def thread_counts(profile) -> list[int]:
    return [1, 2] if b"openmp" in profile._library().li_build_info() else [1]


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def result(profile, tiny: Path) -> dict:
    threads = ",".join(map(str, thread_counts(profile)))
    r = run("--model", str(tiny), "--tokens", str(TOKENS), "--rounds", "1", "--threads", threads, "--peak-seconds", "0.01", "--json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def positive(v: float) -> bool:
    return isinstance(v, float) and math.isfinite(v) and v > 0


def test_peaks_of_every_instruction_the_kernels_use(profile) -> None:
    kinds = profile.path_kinds()
    used = {kind for kind in kinds.values() if kind}
    if b"avx2" in profile._library().li_build_info():  # an AVX2 build's row dots are SIMD
        assert kinds["int8 row dots"] in ("avx2", "vnni256") and kinds["float row dots"] == "fma256"
    names = {kind: name for kind, (name, _) in profile.PEAK_KINDS.items()}
    for t in thread_counts(profile):
        for kind, name in names.items():
            rate = profile.peak_gmacs(kind, t, seconds=0.005, rounds=1)
            assert rate is None or positive(rate), (name, rate)
            if name in used:
                assert rate is not None, f"{name} runs the products but was not measured"


def test_peak_kernel_refuses_bad_arguments(profile) -> None:
    fn = profile._library().li_peak_gmacs
    assert fn(len(profile.PEAK_KINDS), 1, 10) == -1.0
    assert fn(-1, 1, 10) == -1.0
    assert fn(0, 0, 10) == -1.0
    assert fn(0, 1, 0) == -1.0


def expected_shapes(path: Path) -> Counter:
    """(op, types, rows, k) -> layers, from the file's own tensors."""
    tensors = {t.name: t for t in inspect(path).tensors}
    n_layer = sum(1 for name in tensors if name.endswith("attn_q.weight"))
    shapes = Counter()
    for i in range(n_layer):
        for op, names in LAYER_OPS.items():
            mats = [tensors[f"blk.{i}.{n}.weight"] for n in names]
            shapes[(op, tuple(T(m.type).name for m in mats), tuple(int(m.shape[1]) for m in mats), int(mats[0].shape[0]))] += 1
    out = tensors.get("output.weight", tensors["token_embd.weight"])  # tied: the embedding is the lm_head
    shapes[("lm_head", (T(out.type).name,), (int(out.shape[1]),), int(out.shape[0]))] = 1
    return shapes


def test_json_has_the_machine_and_the_peaks(result: dict, profile) -> None:
    assert result["cpu"] and isinstance(result["cpu_flags"], list) and result["build"]
    assert result["kernels"].startswith("c (") and result["tokens"] == TOKENS and result["rounds"] == 1
    assert result["threads"] == thread_counts(profile) and isinstance(result["forward_panels"], bool)
    assert set(result["path_kinds"]) == set(profile.PATHS.values())
    if "avx2" in result["build"].split():
        assert result["peaks"], "no peak measured"
    for row in result["peaks"]:
        assert set(row["gmacs"]) == {str(t) for t in result["threads"]}
        assert all(positive(v) for v in row["gmacs"].values()), row
        if row["kind"] in profile.FMA_KINDS:
            assert row["gflops"] == {t: 2 * v for t, v in row["gmacs"].items()}
    measured = {row["kind"] for row in result["peaks"]}
    assert {k for k in result["path_kinds"].values() if k} <= measured


def test_products_are_the_models_own(result: dict, tiny: Path) -> None:
    rows = result["shapes"]
    want = expected_shapes(tiny)
    for t in result["threads"]:
        got = Counter({(r["op"], tuple(r["types"]), tuple(r["rows"]), r["k"]): r["layers"] for r in rows if r["threads"] == t})
        assert got == want
    for r in rows:
        assert r["n"] == (1 if r["op"] == "lm_head" else TOKENS)
        macs = r["n"] * sum(r["rows"]) * r["k"]
        for name in ("packed", "unpacked"):
            m = r[name]
            assert positive(m["ms"]) and positive(m["gmacs"])
            assert m["gmacs"] * m["ms"] * 1e6 == pytest.approx(macs, rel=1e-9)
            assert m["pct_peak"] is None or positive(m["pct_peak"])
            assert m["reference"] is None or m["reference"] in {row["kind"] for row in result["peaks"]}
        assert r["unpacked"]["panels"] is False


def test_forward_ops_add_up_to_the_total(result: dict, profile, tiny: Path) -> None:
    n_layer = sum(1 for t in inspect(tiny).tensors if t.name.endswith("attn_q.weight"))
    per_call = {"embed": 1, "rms_norm": 2 * n_layer, "qkv product": n_layer, "rope": 2 * n_layer, "attention": n_layer, "o product": n_layer,
                "gate/up product": n_layer, "swiglu": n_layer, "down product": n_layer, "final norm": 1, "lm_head": 1}  # fmt: skip
    assert [f["threads"] for f in result["forward"]] == result["threads"]
    for f in result["forward"]:
        ops = {op["op"]: op for op in f["ops"]}
        assert list(ops) == [*profile.FORWARD_OPS, profile.REMAINDER]
        assert {name: ops[name]["calls"] for name in profile.FORWARD_OPS} == per_call
        assert all(ops[name]["ms"] > 0 for name in profile.FORWARD_OPS)
        remainder = ops[profile.REMAINDER]
        assert remainder["remainder"] is True and remainder["ms"] >= 0  # every timed call ran inside the total
        assert sum(op["ms"] for op in f["ops"]) == pytest.approx(f["total_ms"], rel=1e-9)
        assert sum(op["pct"] for op in f["ops"]) == pytest.approx(100, rel=1e-9)
        assert f["tokens_per_s"] == pytest.approx(TOKENS / f["total_ms"] * 1e3, rel=1e-9)
        assert len(f["samples_ms"]) == 1 and f["samples_ms"][0] == f["total_ms"]


def test_timers_change_neither_logits_nor_model(profile, tiny: Path) -> None:
    backend = profile.load_backend(tiny, TOKENS, 1)
    try:
        model = backend.model
        before = {name: getattr(model, name) for name in ("qkv", "attn_out", "gate_up", "down", "lm_head", "kernels")}
        batch = Batch.for_sequence(np.arange(100, 100 + TOKENS).tolist(), 0)
        plain = backend.forward(batch)
        timer = profile.OpTimer()
        timer.reset()
        undo = profile.instrument(model, timer)
        backend.kv_clear(0)
        timed = backend.forward(batch)
        undo()
        np.testing.assert_array_equal(timed, plain)
        assert timer.calls["lm_head"] == 1 and timer.seconds["attention"] > 0
        assert all(getattr(model, name) is value for name, value in before.items())
        assert "embed" not in vars(model)
    finally:
        backend.close()


def test_markdown_tables(profile, tiny: Path) -> None:
    r = run("--model", str(tiny), "--tokens", "8", "--rounds", "1", "--threads", "1", "--peak-seconds", "0.005")
    assert r.returncode == 0, r.stderr
    for heading in ("### Peak multiply-add throughput", "### Matrix products (8 rows", "### One forward of 8 prompt tokens (pp8)"):
        assert heading in r.stdout
    for name in ["qkv", "gate/up", "lm_head", "attention", "swiglu", "**total**", "tokens/s", profile.REMAINDER]:
        assert f"| {name} |" in r.stdout


def test_help_names_every_option() -> None:
    r = run("--help")
    assert r.returncode == 0
    for option in ("--model", "--tokens", "--rounds", "--threads", "--peak-seconds", "--json", "LOCALINFER_PACK", "remainder"):
        assert option in r.stdout


@pytest.mark.parametrize("args, needle", [(["--model", "/nonexistent.gguf"], "is not a file"), (["--model", "x.gguf", "--threads", "two"], "--threads")])
def test_bad_input_is_one_line(args: list[str], needle: str) -> None:
    assert_one_line_error(run(*args), needle)


def test_a_mixture_of_experts_is_profiled_with_its_ffn_whole(model_path: Path, tmp_path: Path) -> None:
    """A MoE model's products table has its attention products, and the forward's breakdown
    times each layer's FFN (routing and the chosen experts' products) as one."""
    from ..native.test_architectures import tiny_model, vocabulary_of

    path = tiny_model(tmp_path / "tiny-qwen3moe.gguf", "qwen3moe", vocabulary_of(model_path), 4, 2, np.random.default_rng(3))
    r = run("--model", str(path), "--tokens", "32", "--rounds", "1", "--threads", "1", "--peak-seconds", "0.005")  # past the fused decode step's 16 rows
    assert r.returncode == 0, r.stderr
    assert "| qkv |" in r.stdout and "| gate/up |" not in r.stdout
    experts = next(line for line in r.stdout.splitlines() if line.startswith("| experts (routing and products) |"))
    assert float(experts.split("|")[2]) > 0
