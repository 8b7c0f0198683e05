"""bench/bandwidth.py and its kernel (li_read_bandwidth in native/c/membench.c): on small
buffers (no timing is asserted), the rate is a positive finite number and the checksum is
numpy's wrapping sum of every word read, for every thread count and for lengths that are
not a whole number of SIMD registers or of per-thread slices."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from . import load_script

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "bench" / "bandwidth.py"


@pytest.fixture(scope="module")
def bandwidth():
    module = load_script("bandwidth")
    try:
        module._library()
    except module.BandwidthError as e:
        pytest.skip(str(e))  # no C compiler at install: the native engine runs on Numba
    return module


def numpy_checksum(buf: np.ndarray, reps: int) -> int:
    return int(np.sum(buf.view(np.uint64), dtype=np.uint64)) * reps % 2**64


@pytest.mark.parametrize("threads", [1, 2, 3])
@pytest.mark.parametrize("n_words", [1, 7, 33, 1000, 65_537])
def test_read_sums_every_word(bandwidth, threads: int, n_words: int) -> None:
    if threads > 1 and b"openmp" not in bandwidth._library().li_build_info():
        pytest.skip("the C kernels were built without OpenMP")
    buf = np.random.default_rng(n_words).integers(0, 2**64, size=n_words, dtype=np.uint64)
    for reps in (1, 3):
        rate, checksum = bandwidth.read_bandwidth(buf, threads, reps)
        assert math.isfinite(rate) and rate > 0
        assert checksum == numpy_checksum(buf, reps)


def test_checksum_of_the_measured_buffer(bandwidth) -> None:
    n = 12_345
    assert bandwidth.expected_checksum(n, 2) == numpy_checksum(np.arange(n, dtype=np.uint64), 2)


def test_bad_buffers_are_refused(bandwidth) -> None:
    with pytest.raises(bandwidth.BandwidthError):
        bandwidth.read_bandwidth(np.zeros(13, dtype=np.uint8), 1)  # not whole 64-bit words
    with pytest.raises(bandwidth.BandwidthError):
        bandwidth.read_bandwidth(np.zeros(16, dtype=np.uint64), 0)


def test_script_reports_json(bandwidth) -> None:
    threads = [1, 2] if b"openmp" in bandwidth._library().li_build_info() else [1]
    args = ["--size-mib", "4", "--rounds", "2", "--threads", ",".join(map(str, threads)), "--json"]
    r = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["buffer_bytes"] == 4 << 20 and result["cpu"]
    assert [row["threads"] for row in result["rows"]] == threads
    for row in result["rows"]:
        assert len(row["samples_gb_s"]) == 2 and row["gb_s"] > 0


def test_script_bad_option_is_one_line() -> None:
    r = subprocess.run([sys.executable, str(SCRIPT), "--threads", "two"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0 and r.stderr.startswith("error:")
