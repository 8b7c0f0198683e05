"""KV-cache types: the memory plan against the bytes llama.cpp itself allocates (its own log
line is the reference), --cache-type auto's order, a quantized cache that still decodes and
still truncates and copies, eval --ref-cache, and the bad values."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from localinfer import memory
from localinfer.backends import get_backend
from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend, log_listener
from localinfer.errors import OutOfMemory
from localinfer.kvtypes import KV_TYPES
from localinfer.modelfile import inspect
from localinfer.quality.evaluate import log_softmax

from .cli.test_errors import assert_one_line_error
from .conftest import THREADS, run_cli

MiB = 2**20


@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_1", "q5_1"), ("q5_0", "iq4_nl")])
def test_the_plan_counts_the_bytes_llama_cpp_allocates(model_path: Path, types: tuple[str, str]) -> None:
    lines: list[str] = []
    with log_listener(lines.append):
        LlamaCppBackend.load(model_path, LoadParams(n_ctx=1024, n_threads=THREADS, cache_types=types)).close()
    size = next(m for line in lines if (m := re.search(r"llama_kv_cache: size = +([\d.]+) MiB.*K \((\w+)\).*V \((\w+)\)", line)))
    assert (size.group(2), size.group(3)) == types
    assert abs(float(size.group(1)) - memory.kv_cache_bytes(inspect(model_path), 1024, types) / MiB) < 0.01


def test_cache_type_auto_keeps_f16_then_q8_0_then_q4_0(model_path: Path) -> None:
    info = inspect(model_path)
    n_ctx = 8192

    def ram_for(types: tuple[str, str]) -> int:
        return info.tensor_bytes + memory.kv_cache_bytes(info, n_ctx, types) + memory.compute_bytes(info, n_ctx)

    picks = {}
    for label, ram in [("roomy", ram_for(("f16", "f16"))), ("tighter", ram_for(("q8_0", "q8_0"))), ("tight", ram_for(("q4_0", "q4_0")))]:
        plan = memory.plan_cache(info, n_ctx, 0, "auto", ram_free=ram)
        picks[label] = plan.cache_types
        assert plan.cache_note
    assert picks == {"roomy": ("f16", "f16"), "tighter": ("q8_0", "q8_0"), "tight": ("q4_0", "q4_0")}
    assert "would not fit" in memory.plan_cache(info, n_ctx, 0, "auto", ram_free=ram_for(("q8_0", "q8_0"))).cache_note
    with pytest.raises(OutOfMemory, match="even with a q4_0 KV cache"):
        memory.plan_cache(info, n_ctx, 0, "auto", ram_free=ram_for(("q4_0", "q4_0")) - 1)


@pytest.mark.parametrize("engine", ["llama.cpp", "native"])
def test_a_q8_0_cache_decodes_truncates_and_copies_like_f16(model_path: Path, engine: str) -> None:
    backend_cls = get_backend(engine)
    backends = {t: backend_cls.load(model_path, LoadParams(n_ctx=512, n_threads=THREADS, n_seq_max=2, cache_types=(t, t))) for t in ("f16", "q8_0")}
    try:
        prompt = backends["f16"].tokenize("The capital of France is Paris. The capital of Italy is", add_special=True)
        logits = {}
        for t, b in backends.items():
            b.forward(Batch.for_sequence(prompt + [1, 2, 3], 0, 0))  # three tokens too many ...
            b.kv_truncate(0, len(prompt) - 1)  # ... rolled back with the prompt's last token
            b.kv_copy(0, 1, len(prompt) - 1)
            logits[t] = [b.forward(Batch.for_sequence(prompt[-1:], len(prompt) - 1, seq))[0] for seq in (0, 1)]
        q8, f16 = logits["q8_0"], logits["f16"]
        np.testing.assert_array_equal(q8[0], q8[1])  # the copy is the original
        assert q8[0].argmax() == f16[0].argmax() and kl(f16[0], q8[0]) < 0.02  # the same next-token distribution, nearly
    finally:
        for b in backends.values():
            b.close()


def kl(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float((np.exp(lp) * (lp - lq)).sum())


def test_eval_measures_a_quantized_cache_against_f16() -> None:
    r = run_cli("eval", "smollm2:135m", "--cache-type", "q8_0", "--ref-cache", "f16", "--ctx", "256", "--chunks", "2", "--json")
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert 0 <= result["kld"]["mean"] < 0.01 and result["top1_agreement"] > 0.9


@pytest.mark.parametrize(
    "args, needle",
    [
        (("--cache-type-k", "q3_z"), "not a KV-cache type"),
        (("--cache-type", "auto", "--cache-type-v", "f16"), "give it to --cache-type alone"),
    ],
)
def test_bad_cache_types_get_one_line(args: tuple[str, ...], needle: str) -> None:
    assert_one_line_error(run_cli("run", *args, "Hi"), needle, code=2)


@pytest.mark.parametrize("types", [("f16", "f16"), ("q8_0", "q8_0"), ("q8_0", "q4_0"), ("q4_0", "q4_0")])
def test_the_plan_counts_the_bytes_the_native_cache_holds(model_path: Path, types: tuple[str, str]) -> None:
    from localinfer.backends.native import NativeBackend

    b = NativeBackend.load(model_path, LoadParams(n_ctx=256, n_threads=THREADS, cache_types=types))
    try:
        b.forward(Batch.for_sequence(list(range(1, 101)), 0, 0))
        assert b.cache.used_bytes() == memory.kv_cache_bytes(inspect(model_path), 100, types)
    finally:
        b.close()


@pytest.mark.parametrize("engine", ["llama.cpp", "native"])
def test_run_with_a_q8_0_cache_reports_it(model_path: Path, engine: str) -> None:
    r = run_cli("run", "--engine", engine, "--cache-type-k", "q8_0", "--cache-type-v", "q8_0", "--verbose", "--max-tokens", "8", "--temperature", "0", "Hi")
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip()
    used = re.search(r"KV cache q8_0/q8_0: (\d+) tokens, ([\d.]+) MB in use", r.stderr)
    assert used, r.stderr
    assert abs(float(used.group(2)) * 1e6 - memory.kv_cache_bytes(inspect(model_path), int(used.group(1)), ("q8_0", "q8_0"))) < 0.01e6


def test_the_native_engine_names_the_cache_types_it_keeps() -> None:
    assert_one_line_error(run_cli("run", "--engine", "native", "--cache-type-v", "q5_1", "Hi"), "q5_1 cache needs --engine llama.cpp")


def test_the_catalog_can_set_a_models_cache_types() -> None:
    from localinfer.engine.loader import cache_types

    assert cache_types((None, None), {}) == ("f16", "f16")
    assert cache_types((None, None), {"cache_type": "q8_0"}) == ("q8_0", "q8_0")
    assert cache_types((None, None), {"cache_type": "q8_0", "cache_type_v": "q4_0"}) == ("q8_0", "q4_0")
    assert cache_types(("f16", None), {"cache_type": "q8_0"}) == ("f16", "q8_0")  # an option overrides its half
    assert cache_types((None, None), {"cache_type": "auto"}) == "auto"
    assert cache_types(("q4_0", None), {"cache_type": "auto"}) == ("q4_0", "f16")
    assert cache_types("auto", {"cache_type": "q8_0"}) == "auto"


def test_the_catalogs_cache_defaults_are_cache_types() -> None:
    from localinfer.store.catalog import load_catalog

    named = {str(e.defaults[key]) for e in load_catalog().entries.values() for key in ("cache_type", "cache_type_k", "cache_type_v") if key in e.defaults}
    assert named and named <= {*KV_TYPES, "auto"}
