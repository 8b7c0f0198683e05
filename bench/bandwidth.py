"""The machine's memory read bandwidth in GB/s (1e9 bytes/s), with 1 and 2 threads: the
reference for "decode at >= 90 % of the machine's measured read bandwidth" (a decode step
reads every weight byte once, so GB/s over the model's bytes is its tokens/s ceiling).

The reading is done by li_read_bandwidth (native/c/membench.c, in the C kernels library):
the widest SIMD loads the build has, every thread on its own slice of one buffer at once,
summing it as 64-bit integers; the sum is checked every round, so a pass that skipped
bytes cannot report a rate. The buffer (1 GiB by default) is much larger than the last-
level cache, so the figure is memory's, not the cache's. Thread counts are interleaved
within each round; the figure is the median of the rounds, after one warm-up round.

    .venv/bin/python bench/bandwidth.py [--threads 1,2] [--size-mib 1024] [--rounds 7] [--model FILE.gguf] [--json]

With --model, each row also gives that file's decode ceiling: GB/s over its size.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from localinfer.devices import cpu_name, cpu_simd_flags  # noqa: E402
from localinfer_native import KernelsUnavailable, membench  # noqa: E402


class BandwidthError(Exception):
    """A measurement that cannot be made here: one line says why."""


def _library() -> ctypes.CDLL:
    """The C kernels' library with membench.c's functions (localinfer_native.membench)."""
    try:
        return membench.library()
    except KernelsUnavailable as e:
        raise BandwidthError(str(e)) from None


def read_bandwidth(buf: np.ndarray, threads: int, reps: int = 1) -> tuple[float, int]:
    """GB/s reading `buf` `reps` times with `threads` threads, and the checksum: the wrapping
    sum of every 64-bit word read (reps times the buffer's own sum)."""
    if not buf.flags.c_contiguous or buf.nbytes % 8:
        raise BandwidthError("the buffer must be contiguous and a whole number of 64-bit words")
    checksum = ctypes.c_uint64()
    rate = _library().li_read_bandwidth(buf.ctypes.data, buf.nbytes, threads, reps, ctypes.byref(checksum))
    if rate == -2.0:
        raise BandwidthError(f"the C kernels were built without OpenMP: {threads} threads cannot read at once")
    if not rate > 0:
        raise BandwidthError(f"li_read_bandwidth refused {buf.nbytes} bytes, {threads} threads, {reps} passes")
    return rate, checksum.value


def expected_checksum(n_words: int, reps: int) -> int:
    """The wrapping sum of arange(n_words) read `reps` times: the buffer measure() reads."""
    return (reps * (n_words * (n_words - 1) // 2)) % 2**64


def l3_bytes() -> int | None:
    """The last-level cache's size as Linux reports it for cpu0, or None."""
    caches = sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*"))
    for index in reversed(caches):
        try:
            size = (index / "size").read_text().strip()
        except OSError:
            continue
        units = {"K": 1024, "M": 1024**2, "G": 1024**3}
        return int(size[:-1]) * units[size[-1]] if size[-1] in units else int(size)
    return None


def measure(threads: list[int], size_mib: int, rounds: int) -> dict[str, object]:
    """Median, min and max GB/s per thread count over `rounds` interleaved rounds."""
    n_words = size_mib * 1024 * 1024 // 8
    buf = np.arange(n_words, dtype=np.uint64)  # touched: every page is mapped before timing
    want = expected_checksum(n_words, 1)
    samples: dict[int, list[float]] = {t: [] for t in threads}
    for r in range(rounds + 1):
        for t in threads:
            rate, checksum = read_bandwidth(buf, t)
            if checksum != want:
                raise BandwidthError(f"the read with {t} threads summed to {checksum}, not {want}: the kernel skipped or misread bytes")
            if r:  # round 0 warms the thread pool and the TLB
                samples[t].append(rate)
    rows = [{"threads": t, "gb_s": statistics.median(s), "min_gb_s": min(s), "max_gb_s": max(s), "samples_gb_s": s} for t, s in samples.items()]
    return {"buffer_bytes": buf.nbytes, "rows": rows}


def report(args: argparse.Namespace) -> dict[str, object]:
    """Everything the run prints: the machine, the build, the rows, and the warnings."""
    try:
        threads = [int(t) for t in args.threads.split(",") if t.strip()]
    except ValueError:
        raise BandwidthError(f"--threads takes comma-separated counts such as 1,2, not '{args.threads}'") from None
    if not threads or min(threads) < 1 or args.size_mib < 1 or args.rounds < 1:
        raise BandwidthError("--threads must list counts >= 1, and --size-mib and --rounds must be >= 1")
    model_bytes = None
    if args.model:
        model = Path(args.model)
        if not model.is_file():
            raise BandwidthError(f"{model} is not a file")
        model_bytes = model.stat().st_size
    lib = _library()
    result = {"cpu": cpu_name(), "cpu_flags": cpu_simd_flags(), "build": lib.li_build_info().decode().strip(), "l3_bytes": l3_bytes()}
    result.update(measure(threads, args.size_mib, args.rounds))
    warnings = []
    if result["l3_bytes"] and result["buffer_bytes"] < 4 * result["l3_bytes"]:
        warnings.append(f"the buffer is under 4x the {result['l3_bytes'] >> 20} MiB cache: the figure is partly the cache's")
    if model_bytes:
        result["model"], result["model_bytes"] = str(args.model), model_bytes
        for row in result["rows"]:
            row["decode_ceiling_tok_s"] = row["gb_s"] * 1e9 / model_bytes
    result["warnings"] = warnings
    return result


def print_table(result: dict[str, object]) -> None:
    print(f"CPU      {result['cpu']}")
    print(f"flags    {' '.join(result['cpu_flags']) or '-'}")
    print(f"build    {result['build']}")
    l3 = result["l3_bytes"]
    print(f"buffer   {result['buffer_bytes'] >> 20} MiB (L3: {f'{l3 >> 20} MiB' if l3 else 'unknown'})")
    for row in result["rows"]:
        threads = f"{row['threads']} thread{'s' if row['threads'] > 1 else ''}"
        line = f"{threads:9} {row['gb_s']:6.1f} GB/s  (min {row['min_gb_s']:.1f}, max {row['max_gb_s']:.1f}, {len(row['samples_gb_s'])} rounds)"
        if "decode_ceiling_tok_s" in row:
            line += f"  ceiling {row['decode_ceiling_tok_s']:.1f} tok/s for {result['model_bytes'] / 1e6:,.0f} MB"
        print(line)
    for warning in result["warnings"]:
        print(f"warning: {warning}", file=sys.stderr)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--threads", default="1,2", help="comma-separated thread counts (default 1,2)")
    ap.add_argument("--size-mib", type=int, default=1024, help="buffer size in MiB (default 1024; keep it many times the L3 cache)")
    ap.add_argument("--rounds", type=int, default=7, help="timed rounds after the warm-up; the figure is their median (default 7)")
    ap.add_argument("--model", help="a model file: also print its decode ceiling, GB/s over its size")
    ap.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    args = ap.parse_args()
    try:
        result = report(args)
    except BandwidthError as e:
        raise SystemExit(f"error: {e}") from None
    except MemoryError:
        raise SystemExit(f"error: cannot allocate a {args.size_mib} MiB buffer; pass a smaller --size-mib") from None
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_table(result)


if __name__ == "__main__":
    main()
