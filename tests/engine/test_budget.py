"""The prefill time budget's arithmetic, fed made-up step times (the engine feeds it measured ones)."""

import math

from localinfer.engine.budget import PrefillBudget, work


def trained(slowdown: float = 2.5) -> PrefillBudget:
    budget = PrefillBudget(slowdown)
    for _ in range(50):
        budget.observe(0.010, decoded=3, chunks=[])  # a decode step: 10 ms
    budget.observe(0.010 + work(0, 16) * 0.001, decoded=3, chunks=[(0, 16)])  # 1 ms a work unit
    return budget


def test_no_limit_without_decoding_or_when_off() -> None:
    budget = trained()
    assert budget.seconds(decoding=False) == math.inf and budget.take(0, 512, math.inf) == 512
    assert trained(slowdown=0).seconds(decoding=True) == math.inf
    assert PrefillBudget().seconds(decoding=True) == math.inf  # nothing timed yet: the token limit alone


def test_a_chunk_fits_the_time_left_and_shrinks_deep_into_a_prompt() -> None:
    budget = trained()
    seconds = budget.seconds(decoding=True)
    assert math.isclose(seconds, 0.015)  # 2.5 decode steps, less the decode step itself
    near, deep = budget.take(0, 512, seconds), budget.take(2000, 512, seconds)
    assert budget.cost(0, near) <= seconds < budget.cost(0, near + 1)
    assert 1 <= deep < near
    assert budget.take(4000, 512, 1e-9) == 1  # every step makes progress


def test_the_cost_estimate_follows_the_steps() -> None:
    budget = trained()
    before = budget.take(0, 512, budget.seconds(decoding=True))
    for _ in range(20):
        budget.observe(0.010 + work(0, 8) * 0.002, decoded=3, chunks=[(0, 8)])  # the machine got twice as slow
    assert budget.take(0, 512, budget.seconds(decoding=True)) < before
