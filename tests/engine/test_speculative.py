"""Prompt-lookup speculation: lossless on the real model (both engines, F32, so that a
1-row and a many-row forward agree to the last bit that matters; the module docstring of
test_engine_threads.py says why), every rollback path, the cache after a rollback, and the
sampling rule checked statistically."""

from __future__ import annotations

from collections import deque

from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.base import Batch, LoadParams
from localinfer.engine.engine import Engine
from localinfer.engine.sampler import Sampler
from localinfer.engine.speculative import CLOCK_REFRESH, PRIOR_ROW_COST, DraftConfig, DraftState, NgramIndex, StepClock
from localinfer.engine.types import SamplingParams

from ..conftest import THREADS

# A fixed, cheap verify-cost curve instead of the one the engine times on its steps, so that
# draft lengths, and the rollback paths a test walks, do not depend on how busy the machine is.
CHEAP_VERIFIES = tuple(np.linspace(1.0, 1.5, DraftConfig().max_draft + 1))

TEXT = (Path(__file__).parents[1] / "data" / "alice_in_wonderland.txt").read_text()[:700]
GROUNDED = [f"Repeat this text exactly:\n\n{TEXT}", f"Quote the first two sentences of this text:\n\n{TEXT}"]
OPEN = ["Write a short story about a dragon.", "Name three fruits."]
GREEDY = SamplingParams(temperature=0, max_tokens=96, repeat_penalty=1.0)


@pytest.fixture(scope="module", params=["llama.cpp", "native"])
def backend(request, f32_path: Path):
    if request.param == "native":
        from localinfer.backends.native import NativeBackend as cls
    else:
        from localinfer.backends.llamacpp import LlamaCppBackend as cls
    b = cls.load(f32_path, LoadParams(n_ctx=2048, n_threads=THREADS, n_seq_max=2))
    yield b
    b.close()


class Fresh(Engine):
    """An engine that forgets what the shared backend's slots held before each request (the
    other engine on that backend may have overwritten them), so nothing stale is reused."""

    def complete(self, prompt_tokens, params=None):
        self.slots.forget_all()
        return super().complete(prompt_tokens, params)


@pytest.fixture(scope="module")
def engines(backend) -> tuple[Engine, Engine]:
    """(plain, speculative with CHEAP_VERIFIES) on one backend."""
    spec = Fresh(backend, slots=2, draft=DraftConfig(assumed_costs=CHEAP_VERIFIES))
    return Fresh(backend, slots=2), spec


def chat(engine: Engine, prompt: str) -> list[int]:
    return engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": prompt}]))


def lookup(context: list[int], ngram_min: int, ngram_max: int, k: int) -> list[int]:
    """Prompt lookup by its definition, for reference: the k tokens after the latest earlier
    occurrence of the longest suffix n-gram, searched from scratch."""
    size = len(context)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        for i in range(size - n - 1, -1, -1):
            if context[i : i + n] == context[size - n :]:
                return context[i + n : i + n + k]
    return []


def test_lookup_takes_the_longest_latest_match() -> None:
    ctx = [5, 1, 2, 3, 9, 1, 2, 3, 7, 8, 4, 2, 3]
    assert NgramIndex(2, 4).draft(ctx, 3) == [7, 8, 4]  # "2 3" last seen at 6..7, followed by 7 8 4
    assert NgramIndex(1, 1).draft(ctx, 2) == [7, 8]  # "3" likewise
    assert NgramIndex(1, 3).draft([1, 2, 3, 4], 5) == []  # nothing repeats
    assert NgramIndex(2, 2).draft([1, 1, 1], 4) == [1]  # the match may run into the tail itself


def test_the_index_kept_as_tokens_arrive_drafts_as_a_search_from_scratch() -> None:
    rng = np.random.default_rng(1)
    for _ in range(300):
        n_min = int(rng.integers(1, 4))
        n_max, k, vocab = int(rng.integers(n_min, 6)), int(rng.integers(1, 6)), int(rng.integers(1, 6))
        index, history = NgramIndex(n_min, n_max), []
        for _ in range(int(rng.integers(1, 40))):
            history += rng.integers(0, vocab, int(rng.integers(1, 4))).tolist()  # a step adds one token or an accepted draft's several
            assert index.draft(history, k) == lookup(history, n_min, n_max, k), (history, n_min, n_max, k)


def test_draft_length_grows_with_acceptance_and_pauses_below_break_even() -> None:
    config = DraftConfig(max_draft=8, window=4, evidence=4, retry_after=3)
    cheap = np.linspace(1.0, 1.4, 9)  # verifying 8 tokens costs 1.4 forwards
    state = DraftState(config)
    for _ in range(4):
        k = state.draft_length(cheap)
        state.record(k, k)  # every drafted token held
    assert state.draft_length(cheap) == 8
    dear = np.linspace(1.0, 5.0, 9)  # each drafted token's verify costs half a forward: pays only if most are kept
    state = DraftState(config)
    tried = 0
    while k := state.draft_length(dear):
        state.record(k, 0)  # every drafted token missed
        tried += 1
    assert tried == 4 and state.paused == 3  # switched off for this request once the window saw enough ...
    assert [state.draft_length(dear) for _ in range(4)] == [0, 0, 0, 1]  # ... and it tries again later


def test_costs_that_lose_even_if_every_token_were_kept_pay_for_no_trial() -> None:
    """As dear as decoding each token (a draft model whose step costs the target's): no
    acceptance could win, so drafting pauses before a single token is drafted."""
    config = DraftConfig(max_draft=8, window=4, evidence=4, retry_after=3)
    state = DraftState(config)
    assert state.draft_length(np.arange(1.0, 10.0)) == 0 and state.paused == 3 and state.drafted == 0


def test_a_new_request_starts_from_the_draft_models_verdicts_on_earlier_ones() -> None:
    """The draft model's acceptance is the pair's: a request after one where it lost pauses
    it at once instead of paying for its own trial; one after a win drafts long at once."""
    config = DraftConfig(max_draft=8, window=4, evidence=4, retry_after=3)
    dear = np.linspace(1.0, 5.0, 9)  # pays only if most drafted tokens are kept
    shared: deque[tuple[int, int]] = deque(maxlen=config.window)
    first = DraftState(config, shared)
    while k := first.draft_length(dear):
        first.record(k, 0)
    assert first.paused and len(shared) == 4
    second = DraftState(config, shared)
    assert second.draft_length(dear) == 0 and second.paused == config.retry_after and second.drafted == 0
    won: deque[tuple[int, int]] = deque([(8, 8)] * 4, maxlen=config.window)
    assert DraftState(config, won).draft_length(dear) >= 6 > DraftState(config).draft_length(dear)


def test_acceptance_counts_the_tokens_the_target_judged() -> None:
    """A draft's tokens after its first miss were never tried: 5 of 8 kept is 5 agreements in 6
    tries, so a long draft's miss does not look like three more."""
    state = DraftState(DraftConfig(window=4))
    state.record(8, 5)
    assert state.rate == (5 + 1) / (6 + 2)
    state.record(4, 4)  # all kept: four tries, no miss
    assert state.rate == (9 + 1) / (10 + 2)
    assert (state.drafted, state.accepted) == (12, 9)  # what timings report stays every drafted token


def test_the_sampling_rule_keeps_the_samplers_distribution() -> None:
    """A drafted token x is kept with probability p(x); a rejection draws from p without x,
    renormalised; so every token's overall frequency is p. Chi-square on 20,000 draws, with
    p the sampler's own final distribution (after penalties, top-k, top-p, min-p, temperature)."""
    rng = np.random.default_rng(7)
    logits = rng.normal(0, 2, 64).astype(np.float32)
    params = SamplingParams(temperature=0.9, top_k=20, top_p=0.95, min_p=0.02, repeat_penalty=1.3, seed=11)
    history = [3, 5, 8]
    ids, probs = Sampler(params).distribution(logits.copy(), history, [])
    drafted = int(ids[1])  # not the likeliest: rejections happen often
    sampler = Sampler(params)
    kept, counts = 0, dict.fromkeys(ids.tolist(), 0)
    n = 20_000
    for _ in range(n):
        token = sampler.sample(logits.copy(), history, [])  # what the engine does with a drafted row
        kept += token == drafted
        counts[token] += 1
    p_x = probs[1]
    assert abs(kept / n - p_x) < 4 * np.sqrt(p_x * (1 - p_x) / n)
    observed = np.array(list(counts.values()))
    assert fits(observed, probs)
    rest = np.arange(len(ids)) != 1
    assert fits(observed[rest], probs[rest])  # the rejections alone: p without x, renormalised
    skewed = probs.copy()
    skewed[1] *= 1.1  # a rule that kept drafts 10 % too often
    assert not fits(observed, skewed)  # would be caught: the test cannot pass by luck


def fits(observed: np.ndarray, p: np.ndarray) -> bool:
    """Pearson's chi-square at the 0.1 % level (Wilson-Hilferty's critical value; no scipy)."""
    expected = p / p.sum() * observed.sum()
    stat = float(((observed - expected) ** 2 / expected).sum())
    df = len(observed) - 1
    critical = df * (1 - 2 / (9 * df) + 3.09 * np.sqrt(2 / (9 * df))) ** 3
    return stat < critical


@pytest.mark.parametrize("prompt", GROUNDED + OPEN)
def test_greedy_speculation_is_token_for_token_plain_decoding(engines, prompt: str) -> None:
    plain, spec = engines
    tokens = chat(plain, prompt)
    a, b = plain.complete(tokens, GREEDY), spec.complete(tokens, GREEDY)
    assert b.tokens == a.tokens and b.finish_reason == a.finish_reason and b.text == a.text
    if prompt in GROUNDED:
        assert b.timings.accepted > 0 and b.timings.tokens_per_forward > 1.0


def test_every_way_a_draft_can_end(engines) -> None:
    """Partial and full acceptance, end of generation inside a draft (the copied text is
    followed by <|im_end|> in the prompt too), a stop string and max_tokens inside a run
    of accepted drafts: each ends at the token plain decoding ends at."""
    plain, spec = engines
    tokens = chat(plain, "Repeat exactly: the cat sat on the mat, the cat sat on the mat.")
    params = SamplingParams(temperature=0, max_tokens=200, repeat_penalty=1.0)
    whole, fast = plain.complete(tokens, params), spec.complete(tokens, params)
    assert fast.tokens == whole.tokens and fast.finish_reason == whole.finish_reason == "stop"
    ending = spec_outcomes(spec, tokens, params)
    drafted, kept = ending[-1]
    assert kept < drafted, ending  # the last verification ended at <|im_end|> with drafted tokens after it
    outcomes = ending + spec_outcomes(spec, chat(plain, GROUNDED[0]), GREEDY)
    assert any(0 < kept < drafted for drafted, kept in outcomes), outcomes  # a partial accept
    assert any(kept == drafted > 0 for drafted, kept in outcomes), outcomes  # a full accept
    stop = whole.text[len(whole.text) // 2 :][:6]
    with_stop = SamplingParams(temperature=0, max_tokens=200, repeat_penalty=1.0, stop=(stop,))
    a, b = plain.complete(tokens, with_stop), spec.complete(tokens, with_stop)
    assert b.text == a.text and b.finish_reason == a.finish_reason == "stop" and stop not in b.text
    for n in range(1, len(whole.tokens) + 1, 3):
        cut = SamplingParams(temperature=0, max_tokens=n, repeat_penalty=1.0)
        assert spec.complete(tokens, cut).tokens == whole.tokens[:n]


def spec_outcomes(engine: Engine, tokens: list[int], params: SamplingParams) -> list[tuple[int, int]]:
    """(drafted, kept) of every verification of one request."""
    seen: list[tuple[int, int]] = []
    record = DraftState.record

    def spy(self, drafted: int, accepted: int) -> None:
        seen.append((drafted, accepted))
        record(self, drafted, accepted)

    DraftState.record = spy  # type: ignore[method-assign]
    try:
        engine.complete(tokens, params)
    finally:
        DraftState.record = record  # type: ignore[method-assign]
    return seen


def test_the_cache_after_rollbacks_is_the_one_plain_decoding_builds(engines, backend) -> None:
    """Same tokens in the slot, and the same logits from it for the next token, as after plain
    decoding (to float rounding: a verify forward rounds unlike a 1-row one; a rejected draft
    left in the cache would move them by whole units)."""
    plain, spec = engines
    tokens = chat(plain, GROUNDED[0])
    held, logits = [], []
    for engine in (plain, spec):
        out = engine.complete(tokens, GREEDY)
        slot = next(s for s, cached in enumerate(engine.slots.tokens) if cached)
        held.append(engine.slots.tokens[slot])
        logits.append(backend.forward(Batch.for_sequence([out.tokens[-1]], len(held[-1]), slot))[0].copy())
        backend.kv_clear(slot)
        engine.slots.tokens[slot] = []
    assert out.timings.drafted > out.timings.accepted > 0  # some drafts held, some were rolled back
    assert held[0] == held[1]
    assert np.abs(logits[0] - logits[1]).max() < 0.1 and logits[0].argmax() == logits[1].argmax()


class CountingForwards:
    """The backend, with its forwards counted: what stands between a prompt and its first token."""

    def __init__(self, backend) -> None:
        self.inner, self.forwards = backend, 0

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def forward(self, batch):
        self.forwards += 1
        return self.inner.forward(batch)

    def forward_transient(self, batch):  # the engine's own forward
        self.forwards += 1
        return self.inner.forward_transient(batch)


def test_nothing_is_timed_before_the_first_token(backend) -> None:
    """Speculation's costs are learnt from the steps the engine takes anyway: with it on, the
    first token comes after the same forwards (the prompt's) as with it off, on a new engine."""
    prompt_tokens = None
    before_first = []
    for draft in (None, DraftConfig()):
        counted = CountingForwards(backend)
        engine = Engine(counted, slots=2, draft=draft)
        engine.slots.forget_all()
        prompt_tokens = prompt_tokens or engine.tokenize_prompt("The capital of France is")
        for event in engine.generate(prompt_tokens, SamplingParams(temperature=0, max_tokens=16)):
            before_first.append(counted.forwards)
            break
    assert before_first[0] == before_first[1] == 1


def test_the_first_steps_are_plain_and_time_the_costs(engines) -> None:
    """A new engine drafts nothing until it has timed plain steps (two of them: the first
    after a prefill touches the cache first); then its costs are what it measured."""
    _, spec = engines
    engine = Engine(spec.backend, slots=2, draft=DraftConfig())
    engine.slots.forget_all()
    assert engine.drafting.verify_cost(1) is None
    out = engine.complete(chat(engine, GROUNDED[0]), GREEDY)
    assert engine.drafting.clock.seconds(1) is not None and engine.drafting.verify_cost(1)[0] == 1.0
    assert len(out.tokens) > 3 and out.timings.drafted > 0  # it drafted once it knew what a step costs


def test_the_step_clock_interpolates_what_it_timed_and_extends_it() -> None:
    clock = StepClock()
    clock.observe(1, 0.010)
    assert clock.costs(1, 4) is None  # one sample: a first step may be a first touch
    clock.observe(1, 0.010)
    prior = clock.costs(1, 4)
    assert np.allclose(prior, 1 + PRIOR_ROW_COST * np.arange(5))  # before any verify was timed
    for _ in range(CLOCK_REFRESH):  # the curve is worked out again every CLOCK_REFRESH steps
        clock.observe(3, 0.012)
    assert np.allclose(clock.costs(1, 4), [1.0, 1.1, 1.2, 1.3, 1.4])  # 1 -> 3 rows: +0.1 a row, then the same slope
    clock.observe(1, 0.500)  # a slow spell: the median of recent steps holds
    for _ in range(CLOCK_REFRESH):
        clock.observe(3, 0.012)
    assert clock.costs(1, 4)[2] == pytest.approx(1.2)


@pytest.mark.parametrize("acceptance", [0.3, 0.5])
def test_a_draft_model_that_costs_more_than_it_yields_stops_within_a_few_steps(acceptance: float) -> None:
    """At the adversarial pair's numbers (a draft step 0.45 of a plain one, a third to a half of
    its tokens kept) no K pays: drafting stops once `evidence` tokens were judged and retries
    once in `retry_after` steps, so the answer comes at no less than 0.97 of plain decoding's
    speed (tokens over time, a plain step costing 1)."""
    config = DraftConfig()
    verify = 1.0 + 0.05 * np.arange(config.max_draft + 1)
    cost = verify + 0.45 * np.arange(config.max_draft + 1)
    rng = np.random.default_rng(3)
    state, drafting_steps, tokens, seconds = DraftState(config), 0, 0, 0.0
    for _ in range(2000):
        k = state.draft_length(cost)
        kept = 0
        while kept < k and rng.random() < acceptance:
            kept += 1
        if k:
            state.record(k, kept)
            drafting_steps += 1
        tokens, seconds = tokens + kept + 1, seconds + cost[k]
    assert drafting_steps < 2000 * 0.1  # a few steps each time it tries
    assert tokens / seconds >= 0.97
