"""bench/vision_ttft.py --tiny, run as a user runs it: bench/synthetic_vision.py writes the
tiny Gemma 3 pair, both paths (our Engine, llama-mtmd-cli's calls) time the image's phases,
and the JSON has every phase finite and positive, adding up to the TTFT. No timing is
asserted (the figures go in docs/benchmarks.md)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

from ..cli.test_errors import assert_one_line_error
from ..conftest import THREADS
from . import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "vision_ttft.py"


@pytest.fixture(scope="module")
def synthetic_vision():
    return load_script("synthetic_vision")


def bench(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)


def test_tiny_times_both_paths(tmp_path: Path, synthetic_vision) -> None:
    out = tmp_path / "ttft.json"
    r = bench("--tiny", "--runs", "2", "--threads", str(THREADS), "--out", str(tmp_path / "models"), "--json", str(out))
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["image_tokens"] == synthetic_vision.PAIRS["tiny-gemma3-vision"].vision.image_tokens
    assert report["text_tokens"] > 0 and report["runs"] == 2 and report["threads"] == THREADS
    assert report["same_first_token"]  # the same logits after the image: the same greedy token
    for key in ("ours", "mtmd"):
        runs = report["paths"][key]["runs"]
        assert len(runs) == 2
        for times in [*runs, report["paths"][key]["median"]]:
            assert all(math.isfinite(v) and v > 0 for v in times.values()), times
        for times in runs:
            assert times["ttft_s"] == pytest.approx(sum(v for k, v in times.items() if k != "ttft_s"))
        assert any(report["paths"][key]["label"] in line for line in r.stdout.splitlines()[-2:])
    assert report["cpu"] in r.stdout


def test_full_shape_is_gemma3_4bs(synthetic_vision) -> None:
    """4.3 B parameters (Google's figure for Gemma 3 4B) and 256 tokens an image (its mm_tokens_per_image)."""
    import synthetic

    pair = synthetic_vision.PAIRS["gemma3-4b-vision"]
    assert round((synthetic.n_params(pair.text) + synthetic_vision.projector_params(pair)) / 1e9, 1) == 4.3
    assert pair.vision.image_tokens == 256


def test_half_a_pair_is_one_line(tmp_path: Path) -> None:
    assert_one_line_error(bench("--model", str(tmp_path / "x.gguf")), "--model and --mmproj together")
