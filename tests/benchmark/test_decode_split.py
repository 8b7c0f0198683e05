"""bench/decode_split.py on the embedded model: it runs end to end, its figures add up (the
forward = the products + the rest) and its share of the bandwidth is the read's time over
the forward's; no timing is asserted."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_split_adds_up(model_path: Path) -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "decode_split.py"), "--model", str(model_path), "--threads", "1", "--rounds", "4"],
                       capture_output=True, text=True, timeout=300)  # fmt: skip
    assert r.returncode == 0, r.stderr[-2000:]
    m = re.search(r"forward ([\d.]+) ms .* alone ([\d.]+) ms, the rest (-?[\d.]+) ms .* GB ([\d.]+) ms .* decode at (\d+) %", r.stdout)
    assert m, r.stdout
    forward, alone, rest, read, share = map(float, m.groups())
    assert forward > 0 and alone > 0 and read > 0 and abs(forward - alone - rest) < 0.02
    assert abs(share - read / forward * 100) <= 1
