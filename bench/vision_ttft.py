"""Time to first token for one 896 x 896 image and a short question (issue 50), on the CPU:
our Engine against llama-mtmd-cli's path in llama-cpp-python, on bench/synthetic_vision.py's
Gemma 3 4B with its projector (random weights; --model and --mmproj take real files).

Each path loads the pair once, prefills a short text prompt untimed (every mapped weight
touched once), then times --runs requests of the same PNG and question, each on an emptied
KV cache (nothing reused from the run before), and reports medians of:

  prepare        the image's bytes to chunks: PNG decode, resize to the projector's side and
                 normalise, the prompt tokenized around the image (mtmd_tokenize, in both)
  image encode   the projector: SigLIP over the image's patches, pooled and projected into
                 its 256 embeddings (mtmd_encode_chunk)
  image prefill  those embeddings decoded into the text model's cache, in one batch with
                 attention over the whole image (mtmd_helper_decode_image_chunk)
  text prefill   the rest up to the first token: the prompt's text before and after the
                 image, the first token's logits and its sampling
  TTFT           the image's bytes to the first token's id: the sum

Ours: `open_engine(model, LoadOptions(engine="llama.cpp", threads=T, ctx=4096, mmproj=...,
prompt_cache=off))` (`run --image ... --no-prompt-cache`: the prompt cache would hand the next
run the image's KV, and write the user's cache folder), then per run
`engine.slots.forget_all()`, `engine.tokenize_media(prompt, [png])` and
`engine.generate(tokens, greedy, media)` up to its first TokenEvent (as `run --image` does;
the engine prefills the text before the image, the image whole in a step of its own, then
the text after it).

Theirs, llama-mtmd-cli's calls: `llama_model_load_from_file`, a context as the cli makes it
(its n_batch 2048 and n_ubatch 512; our n_ctx 4096; T threads for both), `mtmd_init_from_file`
with T threads, then per run `llama_memory_clear`, `mtmd_helper_bitmap_init_from_buf` (the
cli's from_file without the file read), `mtmd_tokenize` and `mtmd_helper_eval_chunks` into
sequence 0 with the last logits; the first token is their argmax (the cli's sampler, greedy).

Both drive the image through the same mtmd_helper_eval_chunk_single, which logs a line as it
starts encoding, one when the encoding is done and one when each image batch is decoded:
those lines, stamped with time.perf_counter() as llama.cpp hands them to our log callback,
split the image's time into its encoding and its prefill in either path alike (the lines'
own millisecond figures are not read). The text prefill is what remains of the time between
the chunks and the first token. The mtmd path's logits are checked finite (random weights
that overflowed would time nothing real), and whether both paths' first tokens agree is
reported.

Out: a markdown table on stdout naming the CPU (its /proc/cpuinfo name and whether it has
avx512f and AMX), threads and files; --json PATH writes every run and the medians. --tiny
runs tiny-gemma3-vision instead (a smoke check in seconds, no figure to report).

    .venv/bin/python bench/synthetic_vision.py gemma3-4b-vision      # 2.5 GB + 0.85 GB, minutes, once
    .venv/bin/python bench/vision_ttft.py [--runs 3] [--threads 2] [--json OUT] [--out DIR] [--model F --mmproj F] [--tiny]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import statistics
import struct
import sys
import time
import zlib
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from localinfer.backends.base import MEDIA_MARKER  # noqa: E402
from localinfer.backends.llamacpp import _init_once, _on_log, last_error, log_listener  # noqa: E402
from localinfer.devices import cpu_name, cpu_simd_flags  # noqa: E402
from localinfer.engine.engine import Engine  # noqa: E402
from localinfer.engine.loader import LoadOptions, open_engine  # noqa: E402
from localinfer.engine.prompt_cache import CacheOptions  # noqa: E402
from localinfer.engine.types import CompletionOutput, SamplingParams, TokenEvent  # noqa: E402
from localinfer.errors import UserError  # noqa: E402

import llama_cpp as C  # noqa: E402  (after localinfer's import, which loads the shared library first)
from llama_cpp import mtmd_cpp as M  # noqa: E402

import synthetic  # noqa: E402
import synthetic_vision  # noqa: E402

PROMPT = MEDIA_MARKER + "\nWhat is in this picture? Answer in one word."
IMAGE_SIDE = 896
N_CTX = 4096  # open_engine's default for a model trained longer, given to both
CLI_N_BATCH, CLI_N_UBATCH = 2048, 512  # llama-mtmd-cli's defaults (common_params)
FIRST_TOKEN = SamplingParams(temperature=0.0, max_tokens=1)
PATHS = {"ours": "localinfer Engine", "mtmd": "llama-mtmd-cli's path (mtmd_helper_eval_chunks)"}


@dataclass(frozen=True)
class RunTimes:
    """One request's phases, in seconds (the module's docstring says what each covers)."""

    prepare_s: float
    encode_s: float
    image_prefill_s: float
    text_prefill_s: float
    ttft_s: float


@dataclass(frozen=True)
class PathResult:
    runs: list[RunTimes]
    positions: int  # the prompt's positions: its text tokens and the image's
    image_tokens: int
    first_token: int

    def median(self) -> RunTimes:
        return RunTimes(*(statistics.median(getattr(r, f.name) for r in self.runs) for f in fields(RunTimes)))


class PhaseMarks:
    """mtmd's log lines around an image's two halves, each stamped as it arrives (a log_listener)."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []

    def __call__(self, line: str) -> None:
        self.lines.append((time.perf_counter(), line))

    def clear(self) -> None:
        self.lines.clear()

    def image(self) -> tuple[float, float]:
        """(encoding, prefill) seconds of the one image since the last clear()."""
        start = [t for t, line in self.lines if line.startswith("encoding image slice")]
        encoded = [t for t, line in self.lines if line.startswith("image slice encoded in")]
        decoded = [t for t, line in self.lines if line.startswith("image decoded (batch")]
        if len(start) != 1 or len(encoded) != 1 or not decoded:
            raise UserError("mtmd's log did not mark one image's encoding and decoding (its helper's lines changed?): cannot split the image's time")
        return encoded[0] - start[0], decoded[-1] - encoded[0]


def phases(t0: float, t_chunks: float, t_first: float, marks: PhaseMarks) -> RunTimes:
    encode, image = marks.image()
    return RunTimes(t_chunks - t0, encode, image, t_first - t_chunks - encode - image, t_first - t0)


# --- the image ---------------------------------------------------------------------------------


def sample_png(side: int, seed: int = 0) -> bytes:
    """An 8-bit RGB PNG: smooth colour gradients plus noise (something to compress, as a photo)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side] / side
    base = np.stack([np.sin(3 * x + 2 * y + p) for p in rng.uniform(0, 2 * np.pi, 3)], axis=-1)
    pixels = np.clip(127.5 + 100 * base + 20 * rng.standard_normal((side, side, 3)), 0, 255).astype(np.uint8)
    rows = b"".join(b"\x00" + row.tobytes() for row in pixels)  # filter 0 on every row

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)  # depth 8, colour type 2 (RGB)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


# --- ours: the Engine --------------------------------------------------------------------------


def ours_once(engine: Engine, png: bytes, marks: PhaseMarks) -> tuple[RunTimes, int, int, int]:
    """One request: (its phases, prompt positions, image tokens, first token)."""
    engine.slots.forget_all()  # the run before left the same prefix in the slot
    marks.clear()
    t0 = time.perf_counter()
    tokens, media = engine.tokenize_media(PROMPT, [png])
    t_chunks, t_first, first, out = time.perf_counter(), None, -1, None
    for event in engine.generate(tokens, FIRST_TOKEN, media):
        if isinstance(event, TokenEvent) and t_first is None:
            t_first, first = time.perf_counter(), event.token
        elif isinstance(event, CompletionOutput):
            event.raise_error()
            out = event
    if t_first is None or out is None or out.cached_tokens:
        raise UserError(f"the engine's request gave no first token from a fresh cache ({out.finish_reason if out else 'no result'})")
    (chunk,) = media.values()
    return phases(t0, t_chunks, t_first, marks), len(tokens), chunk.n_tokens, first


def run_ours(model: Path, mmproj: Path, png: bytes, threads: int, runs: int, marks: PhaseMarks) -> PathResult:
    options = LoadOptions(engine="llama.cpp", threads=threads, ctx=N_CTX, mmproj=str(mmproj), prompt_cache=CacheOptions(enabled=False))
    engine = open_engine(str(model), options)
    try:
        engine.complete(engine.tokenize_prompt("Hello"), FIRST_TOKEN)  # warm-up, untimed
        done = [ours_once(engine, png, marks) for _ in range(runs)]
    finally:
        engine.close()
    return PathResult([d[0] for d in done], *done[-1][1:])


# --- theirs: llama-mtmd-cli's calls ------------------------------------------------------------


@contextmanager
def mtmd_pipeline(model: Path, mmproj: Path, threads: int) -> Iterator[tuple[C.llama_model_p, C.llama_context_p, M.mtmd_context_p]]:
    """The text model, a context of llama-mtmd-cli's defaults and mtmd's context, freed on the way out."""
    _init_once(False)
    M.mtmd_helper_log_set(_on_log, ctypes.c_void_p(0))  # mtmd's lines reach the listeners
    with ExitStack() as stack:
        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = 0
        lmodel = C.llama_model_load_from_file(os.fsencode(model), mparams)
        if not lmodel:
            raise UserError(f"llama.cpp could not load {model}: {last_error() or 'unknown error'}")
        stack.callback(C.llama_model_free, lmodel)
        cparams = C.llama_context_default_params()
        cparams.n_ctx, cparams.n_batch, cparams.n_ubatch = N_CTX, CLI_N_BATCH, CLI_N_UBATCH
        cparams.n_threads = cparams.n_threads_batch = threads
        cparams.no_perf = True
        ctx = C.llama_init_from_model(lmodel, cparams)
        if not ctx:
            raise UserError(f"llama.cpp could not make a context for {model.name}: {last_error() or 'unknown error'}")
        stack.callback(C.llama_free, ctx)
        params = M.mtmd_context_params_default()
        params.use_gpu, params.n_threads, params.print_timings = False, threads, False
        mctx = M.mtmd_init_from_file(os.fsencode(mmproj), lmodel, params)
        if not mctx:
            raise UserError(f"mtmd could not load {mmproj}: {last_error() or 'unknown error'}")
        stack.callback(M.mtmd_free, mctx)
        yield lmodel, ctx, mctx


@contextmanager
def mtmd_chunks(mctx: M.mtmd_context_p, prompt: str, images: list[bytes]) -> Iterator[M.mtmd_input_chunks_p]:
    """mtmd_tokenize's chunks of `prompt`, each image decoded from its file's bytes; freed on the way out."""
    with ExitStack() as stack:
        bitmaps = []
        for data in images:
            buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
            bitmap = M.mtmd_helper_bitmap_init_from_buf(mctx, buffer, len(data), False)
            if not bitmap:
                raise UserError(f"mtmd could not decode the image: {last_error() or 'unknown error'}")
            stack.callback(M.mtmd_bitmap_free, bitmap)
            bitmaps.append(bitmap)
        data = prompt.encode()
        text = M.mtmd_input_text(text=data, text_len=len(data), add_special=True, parse_special=True)
        chunks = M.mtmd_input_chunks_init()
        stack.callback(M.mtmd_input_chunks_free, chunks)
        array = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        if M.mtmd_tokenize(mctx, chunks, ctypes.byref(text), array, len(bitmaps)) != 0:
            raise UserError(f"mtmd_tokenize failed: {last_error() or 'unknown error'}")
        yield chunks


def mtmd_first_token(lmodel: C.llama_model_p, ctx: C.llama_context_p, mctx: M.mtmd_context_p, chunks: M.mtmd_input_chunks_p) -> int:
    """mtmd_helper_eval_chunks from an empty cache, then the argmax of the last logits (checked finite)."""
    n_past = C.llama_pos(0)
    if M.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, CLI_N_BATCH, True, ctypes.byref(n_past)) != 0:
        raise UserError(f"mtmd_helper_eval_chunks failed: {last_error() or 'unknown error'}")
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(lmodel))
    logits = np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, -1), shape=(n_vocab,))  # [n_vocab]
    if not np.isfinite(logits).all():
        raise UserError("the logits after the image are not finite: the random weights overflowed, and nothing real was timed")
    return int(np.argmax(logits))


def mtmd_once(lmodel: C.llama_model_p, ctx: C.llama_context_p, mctx: M.mtmd_context_p, png: bytes, marks: PhaseMarks) -> tuple[RunTimes, int, int, int]:
    C.llama_memory_clear(C.llama_get_memory(ctx), True)
    marks.clear()
    t0 = time.perf_counter()
    with mtmd_chunks(mctx, PROMPT, [png]) as chunks:
        t_chunks = time.perf_counter()
        first = mtmd_first_token(lmodel, ctx, mctx, chunks)
        t_first = time.perf_counter()
        return phases(t0, t_chunks, t_first, marks), M.mtmd_helper_get_n_pos(chunks), image_tokens(chunks), first


def image_tokens(chunks: M.mtmd_input_chunks_p) -> int:
    """The cells the image chunks fill."""
    pieces = [M.mtmd_input_chunks_get(chunks, i) for i in range(M.mtmd_input_chunks_size(chunks))]
    return sum(M.mtmd_input_chunk_get_n_tokens(c) for c in pieces if M.mtmd_input_chunk_get_type(c) == M.MTMD_INPUT_CHUNK_TYPE_IMAGE)


def run_mtmd(model: Path, mmproj: Path, png: bytes, threads: int, runs: int, marks: PhaseMarks) -> PathResult:
    with mtmd_pipeline(model, mmproj, threads) as (lmodel, ctx, mctx):
        with mtmd_chunks(mctx, "Hello", []) as chunks:  # warm-up, untimed
            mtmd_first_token(lmodel, ctx, mctx, chunks)
        done = [mtmd_once(lmodel, ctx, mctx, png, marks) for _ in range(runs)]
    return PathResult([d[0] for d in done], *done[-1][1:])


# --- the report --------------------------------------------------------------------------------


def cpu_line(threads: int) -> str:
    flags = cpu_simd_flags()
    return f"{cpu_name()} (avx512f: {'yes' if 'avx512f' in flags else 'no'}, AMX: {'yes' if 'amx_tile' in flags else 'no'}), {threads} threads"


def table(report: dict) -> str:
    r = report
    lines = [
        f"CPU: {r['cpu']}; {r['model']} + {r['mmproj']}; one {r['image']} PNG ({r['image_tokens']} image tokens, "
        f"{r['text_tokens']} text tokens); median of {r['runs']} runs, seconds",
        "",
        "| path | prepare | image encode | image prefill | text prefill | TTFT |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for key, label in PATHS.items():
        m = r["paths"][key]["median"]
        lines.append(f"| {label} | " + " | ".join(f"{m[f.name]:.3f}" for f in fields(RunTimes)) + " |")
    return "\n".join(lines)


def report_of(results: dict[str, PathResult], model: Path, mmproj: Path, threads: int, runs: int) -> dict:
    ours, mtmd = results["ours"], results["mtmd"]
    if (ours.positions, ours.image_tokens) != (mtmd.positions, mtmd.image_tokens):
        raise UserError(f"the two paths cut the prompt differently: {ours.positions} positions ({ours.image_tokens} an image) against {mtmd.positions} ({mtmd.image_tokens})")
    return {
        "cpu": cpu_line(threads),
        "cpu_flags": cpu_simd_flags(),
        "threads": threads,
        "runs": runs,
        "model": model.name,
        "mmproj": mmproj.name,
        "image": f"{IMAGE_SIDE}x{IMAGE_SIDE}",
        "prompt": PROMPT,
        "image_tokens": ours.image_tokens,
        "text_tokens": ours.positions - ours.image_tokens,
        "llama_cpp_python": C.__version__,
        "same_first_token": ours.first_token == mtmd.first_token,
        "paths": {key: {"label": PATHS[key], "median": asdict(res.median()), "runs": [asdict(t) for t in res.runs]} for key, res in results.items()},
    }


def write_json(path: Path, report: dict) -> None:
    tmp = path.with_name(f".{path.name}.partial")
    try:
        tmp.write_text(json.dumps(report, indent=2) + "\n")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def model_files(args: argparse.Namespace) -> tuple[Path, Path]:
    if (args.model is None) != (args.mmproj is None):
        raise UserError("give --model and --mmproj together, or neither (the synthetic pair)")
    if args.model is not None:
        for path in (args.model, args.mmproj):
            if not path.is_file():
                raise UserError(f"{path}: no such file")
        return args.model, args.mmproj
    name = "tiny-gemma3-vision" if args.tiny else "gemma3-4b-vision"
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    return synthetic_vision.make_pair(name, args.out or synthetic.default_out(), threads=args.threads, log=log)


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--runs", type=int, default=3, help="timed requests per path (default 3); the medians are reported")
    ap.add_argument("--threads", type=int, default=2, help="threads of the text model and the projector (default 2)")
    ap.add_argument("--json", type=Path, default=None, help="write every run and the medians here")
    ap.add_argument("--out", type=Path, default=None, help=f"the synthetic pair's folder (default {synthetic.default_out()})")
    ap.add_argument("--model", type=Path, default=None, help="a Gemma 3 text GGUF instead of the synthetic one (with --mmproj)")
    ap.add_argument("--mmproj", type=Path, default=None, help="its projector")
    ap.add_argument("--tiny", action="store_true", help="tiny-gemma3-vision: a smoke check in seconds")
    args = ap.parse_args(argv)
    try:
        if args.runs < 1 or args.threads < 1:
            raise UserError("--runs and --threads must be at least 1")
        model, mmproj = model_files(args)
        png, marks = sample_png(IMAGE_SIDE), PhaseMarks()
        with log_listener(marks):
            results = {"ours": run_ours(model, mmproj, png, args.threads, args.runs, marks),
                       "mtmd": run_mtmd(model, mmproj, png, args.threads, args.runs, marks)}  # fmt: skip
        report = report_of(results, model, mmproj, args.threads, args.runs)
        if args.json is not None:
            write_json(args.json, report)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None
    print(table(report), flush=True)
    return report


if __name__ == "__main__":
    main()
