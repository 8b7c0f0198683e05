"""bench/loop_cost.py, kept honest: over its instant backend the real Engine's greedy answer
is numpy's argmax of the very rows the backend returns, a top-p answer draws only among
each row's candidates, stop strings that never match change nothing, and the script's
smallest case runs end to end. No timing is asserted (the figures go in docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from localinfer.engine.engine import Engine

ROOT = Path(__file__).resolve().parents[2]
TOKENS = 24


@pytest.fixture(scope="module")
def bench():
    with pytest.MonkeyPatch.context() as mp:
        mp.syspath_prepend(str(ROOT / "bench"))  # the scripts import their siblings, as when run
        import instant_backend
        import loop_cost

        class Recording(instant_backend.InstantBackend):
            """The instant backend, keeping a copy of every row it hands out."""

            def __init__(self, **kwargs: object) -> None:
                super().__init__(**kwargs)
                self.seen: list[np.ndarray] = []

            def forward(self, batch):  # noqa: ANN001, ANN201
                rows = super().forward(batch)
                self.seen += list(rows.copy())
                return rows

        yield loop_cost, instant_backend, Recording


def test_greedy_answer_is_numpys_argmax_of_the_rows(bench) -> None:
    loop_cost, instant, Recording = bench
    backend = Recording(n_vocab=32_000)
    for stops in (0, len(instant.STOPS)):
        case = loop_cost.Case(32_000, "greedy", 1, stops)
        engine = Engine(backend, slots=1, defaults=case.params(TOKENS))
        backend.seen.clear()
        seconds, cpu, (out,) = loop_cost.run_once(engine, backend, case, TOKENS)
        expected = [int(np.argmax(row)) for row in backend.seen]  # the prompt's forward gave the first token
        assert seconds > 0 and cpu > 0 and len(expected) == TOKENS == len(set(expected))  # a different token every step
        assert out.tokens == expected == loop_cost.greedy_answer(backend, TOKENS)
        assert out.text == b"".join(backend.token_bytes(t) for t in expected).decode("utf-8", errors="replace")
        assert out.stop_sequence is None


def test_top_p_draws_among_each_rows_candidates(bench) -> None:
    loop_cost, instant, Recording = bench
    backend = Recording(n_vocab=32_000)
    case = loop_cost.Case(32_000, "top-p", 1, 0)
    *_, (out,) = loop_cost.run_once(Engine(backend, slots=1, defaults=case.params(TOKENS)), backend, case, TOKENS)
    for token, row in zip(out.tokens, backend.seen, strict=True):
        assert token in np.argsort(-row)[: instant.N_CANDIDATES]  # the row's largest logits, by numpy
    assert sum(t != int(np.argmax(row)) for t, row in zip(out.tokens, backend.seen)) > TOKENS // 4  # it does not just take the top


def test_several_sequences_each_answer_greedily(bench) -> None:
    loop_cost, _, Recording = bench
    backend = Recording(n_vocab=32_000, n_seq=4)
    case = loop_cost.Case(32_000, "greedy", 4, 0)
    *_, outs = loop_cost.run_once(Engine(backend, slots=4, defaults=case.params(TOKENS)), backend, case, TOKENS)
    assert [len(o.tokens) for o in outs] == [TOKENS] * 4
    # every row went to one sequence, whose next token is its argmax (all differ: the order shows nothing)
    assert sorted(t for o in outs for t in o.tokens) == sorted(int(np.argmax(row)) for row in backend.seen)


def test_rows_in_turn_and_speculation_keep_the_answer(bench) -> None:
    loop_cost, _, _ = bench
    case = loop_cost.Case(32_000, "greedy", 1, 0)
    for n_rows, draft in ((16, False), (None, True)):  # logits read from a 16-row buffer; prompt lookup's bookkeeping on
        (engine,), (backend,) = (d.values() for d in loop_cost.setup([case], TOKENS, n_rows, draft))
        for _ in range(2):  # speculation times its verify on the first run's rows
            *_, (out,) = loop_cost.run_once(engine, backend, case, TOKENS)
        assert out.tokens == loop_cost.greedy_answer(backend, TOKENS)  # no draft is ever found: one row a step
        assert out.timings.drafted == 0


def test_the_smallest_case_runs_end_to_end() -> None:
    args = ["--vocab", "32000", "--sampling", "greedy", "--seqs", "1", "--stops", "0", "--tokens", "16", "--runs", "1", "--json"]
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "loop_cost.py"), *args], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads(r.stdout)
    (case,) = report["cases"]
    assert (case["vocab"], case["sampling"], case["seqs"], case["stops"], case["tokens"]) == (32_000, "greedy", 1, 0, 16)
    assert case["us_per_token"] > 0 and case["cpu_us_per_token"] > 0 and len(case["runs_us_per_token"]) == 1
    assert report["cpu"] and set(report["floor"]["32000"]) == {"argmax_hot_us", "argmax_cold_us", "forward_us"}


def test_a_bad_case_is_a_usage_error() -> None:
    r = subprocess.run([sys.executable, str(ROOT / "bench" / "loop_cost.py"), "--sampling", "beam"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and r.stderr.strip() == "error: unknown sampling 'beam' (greedy, top-p)"
