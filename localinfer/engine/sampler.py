"""Token sampling on one row of logits, in llama.cpp's order:
penalties (repetition, presence, frequency) -> top-k -> top-p -> min-p -> temperature -> draw.

Kept in numpy above the backends, so every backend samples the same way.
"""

from __future__ import annotations

import numpy as np

from localinfer.engine.types import SamplingParams


class Sampler:
    """Samples for one request; owns the request's seeded RNG, so a seed reproduces a run."""

    def __init__(self, params: SamplingParams) -> None:
        self.params = params
        seed = params.seed if params.seed is not None and params.seed >= 0 else None  # -1: a fresh one
        self.rng = np.random.default_rng(seed)

    def sample(self, logits: np.ndarray, history: list[int], generated: list[int] | None = None, allowed: np.ndarray | None = None) -> int:
        """Pick the next token. `logits` is [n_vocab] float32 and may be modified in place;
        `history` is prompt + answer (repetition penalty), `generated` the answer alone
        (presence and frequency penalties, as OpenAI defines them); `allowed`, the only ids
        a grammar permits (their logits alone are finite)."""
        if self.params.temperature <= 0:  # the argmax alone, without building its one-token distribution
            self._penalize(logits, history, generated)
            return int(logits.argmax())
        ids, probs = self.distribution(logits, history, generated, allowed)
        return int(ids[draw(probs, self.rng)])

    def _penalize(self, logits: np.ndarray, history: list[int], generated: list[int] | None) -> None:
        p = self.params
        if p.repeat_penalty != 1.0 and p.repeat_last_n != 0 and history:
            apply_repeat_penalty(logits, history[-p.repeat_last_n :] if p.repeat_last_n > 0 else history, p.repeat_penalty)
        if (p.presence_penalty or p.frequency_penalty) and generated:
            apply_presence_frequency(logits, generated, p.presence_penalty, p.frequency_penalty)

    def distribution(self, logits: np.ndarray, history: list[int], generated: list[int] | None = None, allowed: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The distribution a draw is made from, after every filter: token ids and their
        probabilities (greedy: the argmax alone). Speculation is lossless against this."""
        p = self.params
        self._penalize(logits, history, generated)
        if p.temperature <= 0:
            return np.array([int(np.argmax(logits))]), np.ones(1)

        ids, vals = top_k(logits, p.top_k, allowed)  # sorted by logit, descending
        probs = softmax(vals)
        keep = len(probs)
        if p.top_p < 1.0:
            # smallest prefix whose mass reaches top_p, at least one token
            keep = min(keep, int(np.searchsorted(np.cumsum(probs), p.top_p)) + 1)
        if p.min_p > 0.0:
            keep = min(keep, max(1, int(np.count_nonzero(probs[:keep] >= p.min_p * probs[0]))))
        return ids[:keep], softmax(vals[:keep] / p.temperature)


def draw(probs: np.ndarray, rng: np.random.Generator) -> int:
    """An index drawn with these (not necessarily normalised) weights."""
    target = rng.random() * probs.sum()
    return min(int(np.searchsorted(np.cumsum(probs), target, side="right")), len(probs) - 1)


def apply_repeat_penalty(logits: np.ndarray, recent: list[int], penalty: float) -> None:
    """CTRL-style penalty as llama.cpp applies it: divide positive logits, multiply negative ones."""
    ids = np.unique(np.asarray(recent, dtype=np.int64))
    ids = ids[ids < len(logits)]  # a draft model's vocabulary may stop short of its target's padding
    vals = logits[ids]
    logits[ids] = np.where(vals > 0, vals / penalty, vals * penalty)


def apply_presence_frequency(logits: np.ndarray, generated: list[int], presence: float, frequency: float) -> None:
    """logit[t] -= count[t] * frequency + (count[t] > 0) * presence (OpenAI's definition)."""
    ids, counts = np.unique(np.asarray(generated, dtype=np.int64), return_counts=True)
    counts, ids = counts[ids < len(logits)], ids[ids < len(logits)]
    logits[ids] -= (counts * frequency + presence).astype(logits.dtype)


def top_k(logits: np.ndarray, k: int, among: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The k largest logits and their ids, sorted descending; k <= 0 keeps all. `among`:
    the only ids that can be chosen (the rest are -inf)."""
    if among is not None:
        ids = among[np.argpartition(logits[among], -k)[-k:]] if 0 < k < len(among) else among
    elif 0 < k < len(logits):
        ids = largest(logits, k)
    else:
        ids = np.arange(len(logits))
    order = np.argsort(-logits[ids], kind="stable")
    ids = ids[order]
    return ids, logits[ids]


PREFILTER_STRIDE = 64  # every 64th logit is sampled for a threshold before the k largest are sought


def largest(logits: np.ndarray, k: int) -> np.ndarray:
    """Ids of the k largest logits, in no order. A partition of a 152k vocabulary costs ~1 ms,
    an eighth of a CPU's token; so the k-th largest of every 64th logit is taken first as a
    threshold. The whole vocabulary holds at least k logits at or above it (the sample does),
    so the k largest are among those, and only they are partitioned (~80 µs). Exact."""
    if len(logits) >= 4 * PREFILTER_STRIDE * k:
        sample = logits[::PREFILTER_STRIDE]
        above = np.flatnonzero(logits >= np.partition(sample, -k)[-k])
        if len(above) >= k:  # fewer only with NaN logits
            return above[np.argpartition(logits[above], -k)[-k:]]
    return np.argpartition(logits, -k)[-k:]


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()
