"""The sampler on scripted logits: the filters do what llama.cpp's do, and seeds reproduce."""

import numpy as np
import pytest

from localinfer.engine.sampler import Sampler, apply_repeat_penalty, softmax
from localinfer.engine.types import SamplingParams


def logits_from(probs: list[float]) -> np.ndarray:
    return np.log(np.asarray(probs, dtype=np.float32))


def draws(params: SamplingParams, logits: np.ndarray, n: int = 2000) -> np.ndarray:
    sampler = Sampler(params)
    return np.array([sampler.sample(logits.copy(), []) for _ in range(n)])


def test_temperature_zero_is_argmax() -> None:
    logits = np.random.default_rng(0).normal(size=1000).astype(np.float32)
    assert Sampler(SamplingParams(temperature=0)).sample(logits.copy(), []) == int(np.argmax(logits))


def test_top_k_keeps_only_the_k_best() -> None:
    logits = logits_from([0.1, 0.4, 0.3, 0.2])
    picked = set(draws(SamplingParams(temperature=1, top_k=2, top_p=1, min_p=0), logits).tolist())
    assert picked == {1, 2}


def test_top_p_keeps_the_smallest_set_reaching_p() -> None:
    logits = logits_from([0.5, 0.3, 0.15, 0.05])
    picked = set(draws(SamplingParams(temperature=1, top_k=0, top_p=0.7, min_p=0), logits).tolist())
    assert picked == {0, 1}


def test_min_p_drops_tokens_below_a_fraction_of_the_best() -> None:
    logits = logits_from([0.5, 0.3, 0.15, 0.05])
    picked = set(draws(SamplingParams(temperature=1, top_k=0, top_p=1, min_p=0.25), logits).tolist())
    assert picked == {0, 1, 2}  # 0.05 < 0.25 * 0.5


def test_draws_follow_the_distribution() -> None:
    probs = [0.6, 0.3, 0.1]
    counts = np.bincount(draws(SamplingParams(temperature=1, top_k=0, top_p=1, min_p=0), logits_from(probs), 6000), minlength=3)
    assert np.allclose(counts / counts.sum(), probs, atol=0.03)


def test_same_seed_same_tokens_and_different_seed_differs() -> None:
    logits = np.random.default_rng(1).normal(size=500).astype(np.float32)
    p = SamplingParams(temperature=1.5, top_k=0, top_p=1, min_p=0, seed=42)
    assert list(draws(p, logits, 50)) == list(draws(p, logits, 50))
    assert list(draws(p, logits, 50)) != list(draws(p.with_overrides(seed=7), logits, 50))


def test_repeat_penalty_matches_llama_cpp_rule() -> None:
    logits = np.array([2.0, -2.0, 1.0], dtype=np.float32)
    apply_repeat_penalty(logits, [0, 1, 1], 2.0)
    assert logits.tolist() == [1.0, -4.0, 1.0]


def test_softmax_is_normalised() -> None:
    assert softmax(np.array([1000.0, 1000.0])).tolist() == pytest.approx([0.5, 0.5])


def test_seed_minus_one_is_a_fresh_seed() -> None:
    logits = np.linspace(0, 1, 100).astype(np.float32)
    draws = {Sampler(SamplingParams(seed=-1, temperature=5, top_k=0, top_p=1, min_p=0)).sample(logits.copy(), []) for _ in range(20)}
    assert len(draws) > 1  # not one fixed seed


def test_presence_and_frequency_penalties_follow_openai() -> None:
    from localinfer.engine.sampler import apply_presence_frequency

    logits = np.zeros(8, dtype=np.float32)
    apply_presence_frequency(logits, [3, 3, 3, 5], presence=0.5, frequency=0.25)
    want = np.zeros(8, dtype=np.float32)
    want[3] -= 3 * 0.25 + 0.5
    want[5] -= 1 * 0.25 + 0.5
    assert np.array_equal(logits, want)
    # greedy picks the best unpenalised token once the leader is penalised enough
    s = Sampler(SamplingParams(temperature=0, presence_penalty=2.0))
    assert s.sample(np.array([0, 3.0, 2.0], dtype=np.float32), [1], generated=[1]) == 2
    assert Sampler(SamplingParams(temperature=0)).sample(np.array([0, 3.0, 2.0], dtype=np.float32), [1], generated=[1]) == 1


def test_token_logprobs_are_log_softmax() -> None:
    from localinfer.engine.request import token_logprobs

    logits = np.random.default_rng(3).standard_normal(1000).astype(np.float32) * 5
    x = logits.astype(np.float64)
    reference = x - np.logaddexp.reduce(x)  # another route to log softmax
    lp, top = token_logprobs(logits, 17, 4)
    assert abs(lp - reference[17]) < 1e-5
    assert [t for t, _ in top] == list(np.argsort(-reference)[:4])
    assert np.allclose([v for _, v in top], np.sort(reference)[::-1][:4], atol=1e-5)
    assert token_logprobs(logits, 17, 0)[1] == []
