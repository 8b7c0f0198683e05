"""Speculative decoding, written once above the backends: where drafts come from, how
they are verified losslessly, and how long a draft pays.

Two sources of drafts. Prompt lookup: the last n tokens of a request (n from `ngram_max`
down to `ngram_min`) are looked up earlier in its prompt and answer, and the K tokens that
followed their latest occurrence are the draft; summaries, extractions and code edits repeat
their input, so such drafts often hold. A draft model (draft_model.py): a small model with
the target's vocabulary samples K tokens from its own distribution q.

Verification. The engine feeds [pending, d1..dK] in the step's one batched forward with
logits for every row and decides row by row, in order; the first rejection (or the bonus
token after a fully accepted draft) becomes the next pending token, and the rejected tail is
rolled back with `kv_truncate`.

The rule (the seeds' speculative sampling). With p the distribution the request's sampler
draws from (after penalties, top-k, top-p, min-p and temperature) and q the one the draft
came from, d is kept with probability min(1, p(d)/q(d)); on rejection the token is drawn from
norm(max(0, p - q)). Every token then follows p exactly, whatever q is: a bad draft costs
speed, never quality. Prompt lookup's q is a point mass on d, so the rule is "keep d with
probability p(d), else draw from p without d", which a plain draw t ~ p with "keep iff t == d"
does exactly, spending the request's RNG as plain decoding does. Greedy decoding (p a point
mass on the argmax) keeps d while it is the argmax, for either source. (A seeded sampled run
is the same in distribution, not token for token: a many-row forward rounds differently from
a 1-row one, ~1e-4 in a probability, which moves a draw that lands that close to a boundary.)

Adaptive. With a per-token acceptance rate a, a K-token draft yields (1 - a^(K+1)) / (1 - a)
tokens per target forward, for a cost of c(K) 1-row forwards: the (K+1)-row verify
(`verify_cost`, measured once at load on this backend and machine) plus, for a draft model,
K of its steps. Each request and source drafts the K that maximises tokens/cost for the
acceptance it has seen lately, so K grows while drafts hold and shrinks when they do not;
when no K beats plain decoding, that source stops for the request and retries later.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import Backend, Batch
from localinfer.engine.sampler import draw


@dataclass(frozen=True)
class DraftConfig:
    ngram_min: int = 2
    ngram_max: int = 4
    max_draft: int = 10  # K at most
    window: int = 16  # verifications the acceptance rate is measured over
    evidence: int = 8  # drafted tokens judged before drafting may be switched off
    retry_after: int = 128  # decode steps a request waits before drafting again once switched off


def lookup(context: np.ndarray, ngram_min: int, ngram_max: int, k: int) -> list[int]:
    """The up to k tokens that followed the latest earlier occurrence of the longest suffix
    n-gram of `context` (n from ngram_max down to ngram_min); [] when there is none."""
    size = len(context)
    for n in range(min(ngram_max, size - 1), ngram_min - 1, -1):
        tail = context[size - n :]
        hits = context[: size - n] == tail[0]  # candidate starts i < size - n, so i + n < size
        for t in range(1, n):
            hits &= context[t : size - n + t] == tail[t]
        found = np.flatnonzero(hits)
        if found.size:
            start = int(found[-1]) + n
            return context[start : start + k].tolist()
    return []


def expected_tokens(accept: float, k: int) -> float:
    """Tokens one forward yields from a k-token draft at per-token acceptance `accept`."""
    if accept >= 1.0:
        return k + 1.0
    return (1.0 - accept ** (k + 1)) / (1.0 - accept)


def forward_seconds(backend: Backend, slot: int, max_rows: int, repeats: int = 3) -> np.ndarray:
    """seconds[n - 1] = time of an n-row forward of one sequence, n = 1..max_rows, measured
    on `slot` (left empty) and interpolated between the row counts tried. Each count's best of
    `repeats` rounds, each round trying every count: memory speed drifts over seconds here,
    and a slow spell in one round then touches every count alike instead of a few."""
    rows = sorted({n for n in (1, 2, 3, 5, 9) if n < max_rows} | {max_rows})
    token = backend.vocab.bos_id if backend.vocab.bos_id is not None else 0
    # A model's first forward pays for first touches (pages, buffers): untimed, so that the
    # 1-row forward, timed first, does not look dear and every verify cheap.
    backend.kv_clear(slot)
    backend.forward(Batch.for_sequence([token] * max_rows, 0, slot, all_logits=True))
    best = np.full(len(rows), np.inf)
    for _ in range(repeats):
        for i, n in enumerate(rows):
            backend.kv_clear(slot)
            t0 = time.perf_counter()
            backend.forward(Batch.for_sequence([token] * n, 0, slot, all_logits=True))
            best[i] = min(best[i], time.perf_counter() - t0)
    backend.kv_clear(slot)
    return np.interp(np.arange(1, max_rows + 1), rows, best)


def verify_cost(seconds: np.ndarray) -> np.ndarray:
    """cost[k]: verifying k drafted tokens (a (k+1)-row forward) over a 1-row forward."""
    return np.maximum(seconds / seconds[0], 1.0)


def measure_verify_cost(backend: Backend, slot: int, max_draft: int, repeats: int = 3) -> np.ndarray:
    """verify_cost for k = 0..max_draft, measured on `slot`."""
    return verify_cost(forward_seconds(backend, slot, max_draft + 1, repeats))


def speculative_choice(p_ids: np.ndarray, p_probs: np.ndarray, q_ids: np.ndarray, q_probs: np.ndarray, drafted: int, rng: np.random.Generator) -> int:
    """The speculative-sampling rule: `drafted` (drawn from q) is kept with probability
    min(1, p/q), else a token is drawn from norm(max(0, p - q)); the result follows p."""
    if len(p_ids) == 1:  # a point mass (greedy, a forced token): kept iff it is the one
        return int(p_ids[0])
    p_at = float(p_probs[p_ids == drafted].sum())
    q_at = float(q_probs[q_ids == drafted].sum())
    if rng.random() * q_at < p_at:
        return drafted
    order = np.argsort(q_ids)
    where = np.minimum(np.searchsorted(q_ids[order], p_ids), len(q_ids) - 1)
    q_on_p = np.where(q_ids[order][where] == p_ids, q_probs[order][where], 0.0)
    residual = np.maximum(p_probs - q_on_p, 0.0)
    if residual.sum() <= 0.0:  # p == q to rounding: acceptance was certain but for it
        residual = p_probs
    return int(p_ids[draw(residual, rng)])


class DraftState:
    """One request's speculation from one source: its recent acceptance, and its counts for
    timings and metrics."""

    def __init__(self, config: DraftConfig) -> None:
        self.config = config
        self.recent: deque[tuple[int, int]] = deque(maxlen=config.window)  # (drafted, accepted)
        self.paused = 0  # decode steps left before drafting again
        self.drafted = 0
        self.accepted = 0

    @property
    def judged(self) -> int:
        """Recent drafted tokens the target judged: those it kept and each draft's first miss
        (the tokens after a miss were never tried)."""
        return sum(a + (a < d) for d, a in self.recent)

    @property
    def rate(self) -> float:
        """Recent per-token acceptance, over the tokens judged (Laplace: one of each before any
        evidence). Counting a long draft's untried tail as misses would make a 5-of-8 draft
        look like 62 % where the target agreed 5 times in 6, and cut K after every long draft."""
        return (sum(a for _, a in self.recent) + 1) / (self.judged + 2)

    def draft_length(self, cost: np.ndarray) -> int:
        """K for this step: the best tokens per cost (cost[k]: drafting and verifying k tokens,
        in target forwards) at the recent acceptance rate; 0 while paused."""
        if self.paused:
            self.paused -= 1
            return 0
        rate = self.rate
        gains = [expected_tokens(rate, k) / cost[k] for k in range(1, self.config.max_draft + 1)]
        best = int(np.argmax(gains))
        if gains[best] <= 1.0 and self.judged >= self.config.evidence:
            self.paused, self.recent = self.config.retry_after, deque(maxlen=self.config.window)
            return 0
        return best + 1

    def record(self, drafted: int, accepted: int) -> None:
        self.recent.append((drafted, accepted))
        self.drafted += drafted
        self.accepted += accepted
