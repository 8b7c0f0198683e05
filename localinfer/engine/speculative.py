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

Adaptive, from what it measures while it runs. With a per-token acceptance rate a, a
K-token draft yields (1 - a^(K+1)) / (1 - a) tokens per target forward, for a cost of c(K)
plain steps: the step that verifies K+1 rows plus, for a draft model, K of its steps. Both
are timed on the steps the engine takes anyway (`StepClock`; the draft model times its own),
so nothing is measured before a first token and the costs follow the machine as it is now
(a cost timed once on an empty slot at load misjudged real pairs by 10-30 %). Each request
and source drafts the K that maximises tokens/cost for the acceptance it has seen lately, so
K grows while drafts hold and shrinks when they do not; once `evidence` drafted tokens were
judged and no K gains `MIN_GAIN`, that source stops for the request and retries after
`retry_after` plain steps: a draft that loses costs a few steps, then one retry now and then.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np

from localinfer.engine.sampler import Sampler, draw

Proposal = tuple[np.ndarray, np.ndarray]  # q, the distribution a drafted token was drawn from: (ids, probs)


@dataclass(frozen=True)
class DraftConfig:
    ngram_min: int = 2
    ngram_max: int = 4
    max_draft: int = 10  # K at most
    window: int = 16  # verifications the acceptance rate is measured over
    evidence: int = 8  # drafted tokens judged before drafting may be switched off
    retry_after: int = 128  # decode steps a request waits before drafting again once switched off
    # Costs to assume instead of timing them (tests and benchmarks whose draft lengths must not
    # depend on the machine's load): cost[k] of verifying k drafted tokens in plain steps, and
    # one draft-model step in plain steps.
    assumed_costs: tuple[float, ...] | None = None
    assumed_draft_step: float | None = None


MIN_GAIN = 1.03  # expected speed-up below which a judged source stops: the estimate's own error is a few %
PRIOR_ROW_COST = 0.1  # before a verify of that many rows was timed: each row adds 10 % of a plain step
CLOCK_SAMPLES = 8  # recent steps per row count whose median is the cost (memory speed drifts over seconds)
CLOCK_REFRESH = 16  # steps timed before the cost curve is worked out again (~10 µs; memory speed drifts over seconds)


def median(values: Iterable[float]) -> float:
    """The median, without the statistics module (it imports decimal and fractions: 2.5 MB
    of the native engine's resident-memory bound)."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    return ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2


class StepClock:
    """What a decode step costs by the rows it feeds, learned from the steps the engine takes
    anyway: the forward and the sampling of every row, not the drafting before it."""

    def __init__(self) -> None:
        self._recent: dict[int, deque[float]] = {}
        self._observed = 0  # steps timed so far
        self._curves: dict[tuple[int, int], tuple[int, np.ndarray | None]] = {}  # (base, k_max) -> (when, costs)

    def observe(self, rows: int, seconds: float) -> None:
        self._recent.setdefault(rows, deque(maxlen=CLOCK_SAMPLES)).append(seconds)
        self._observed += 1

    def seconds(self, rows: int) -> float | None:
        """The median of the recent steps that fed `rows` rows; None before two were timed
        (a first step after a prefill pays for the cache it touches first)."""
        recent = self._recent.get(rows)
        if not recent or len(recent) < 2:
            return None
        return median(recent)

    def costs(self, base: int, k_max: int) -> np.ndarray | None:
        """cost[k], k = 0..k_max: a step feeding base + k rows over a plain one feeding base
        rows, interpolated between the row counts timed and extended past the last at its
        slope (PRIOR_ROW_COST before any); None until a plain step of base rows was timed.
        Worked out again every CLOCK_REFRESH steps, or at once while it is None."""
        when, curve = self._curves.get((base, k_max), (-CLOCK_REFRESH, None))
        if curve is None or self._observed - when >= CLOCK_REFRESH:
            curve = self._curve(base, k_max)
            self._curves[base, k_max] = (self._observed, curve)
        return curve

    def _curve(self, base: int, k_max: int) -> np.ndarray | None:
        plain = self.seconds(base)
        if plain is None:
            return None
        known = [(n, t) for n in sorted(self._recent) if n >= base and (t := self.seconds(n)) is not None]
        xs, ys = np.array([n for n, _ in known], dtype=float), np.array([t for _, t in known])
        rows = np.arange(base, base + k_max + 1, dtype=float)
        slope = (ys[-1] - plain) / (xs[-1] - base) if xs[-1] > base else PRIOR_ROW_COST * plain
        seconds = np.where(rows <= xs[-1], np.interp(rows, xs, ys), ys[-1] + (rows - xs[-1]) * max(slope, 0.0))
        return np.maximum(seconds / plain, 1.0)


class NgramIndex:
    """Prompt lookup over one request's history (prompt, then answer): for each n from
    ngram_min to ngram_max, where each n-gram last ended (the position of the token that
    followed it), kept as tokens arrive. A draft is then a few dict lookups, the longest
    suffix n-gram first, instead of a scan of the whole context every step (60 µs at 3k
    tokens, 600 at 30k, paid even when nothing matches)."""

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        self.sizes = range(ngram_max, ngram_min - 1, -1)  # longest first
        self._last: dict[int, dict[tuple[int, ...], int]] = {n: {} for n in self.sizes}
        self._indexed = 0  # positions j of the history whose preceding n-grams are in _last

    def draft(self, history: list[int], k: int) -> list[int]:
        """The up to k tokens that followed the latest earlier occurrence of the longest
        suffix n-gram of `history`; [] when there is none. `history` only ever grows."""
        size = len(history)
        for j in range(self._indexed, size):  # history[j] follows each n-gram that ends before it
            for n, last in self._last.items():
                if j >= n:
                    last[tuple(history[j - n : j])] = j
        self._indexed = size
        for n in self.sizes:
            if n < size and (start := self._last[n].get(tuple(history[size - n :]))) is not None:
                return history[start : start + k]
        return []


def expected_tokens(accept: float, k: int) -> float:
    """Tokens one forward yields from a k-token draft at per-token acceptance `accept`."""
    if accept >= 1.0:
        return k + 1.0
    return (1.0 - accept ** (k + 1)) / (1.0 - accept)


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

    def __init__(self, config: DraftConfig, shared: deque[tuple[int, int]] | None = None) -> None:
        """`shared`: the source's verdicts over the engine's earlier requests, which a new
        request starts from (and adds to) instead of knowing nothing."""
        self.config = config
        self.recent: deque[tuple[int, int]] = deque(shared or (), maxlen=config.window)  # (drafted, accepted)
        self._shared = shared
        self.paused = 0  # decode steps left before drafting again
        self._chosen: tuple[np.ndarray, int, int] | None = None  # (the costs, drafted so far, K) of the last choice
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
        in target forwards) at the recent acceptance rate; 0 while paused. Worked out again
        only when a draft was judged or the costs changed (steps without a draft are many)."""
        if self.paused:
            self.paused -= 1
            return 0
        if self._chosen is not None and self._chosen[0] is cost and self._chosen[1] == self.drafted:
            return self._chosen[2]
        k = self._best_length(cost)
        self._chosen = None if self.paused else (cost, self.drafted, k)
        return k

    def gain(self, cost: np.ndarray) -> float:
        """The expected tokens per cost of this source's best K now (0 while paused): what two
        sources are compared by, since a draft model's step costs what prompt lookup's does not."""
        return 0.0 if self.paused else float(self._gains(cost).max())

    def _gains(self, cost: np.ndarray) -> np.ndarray:
        """gains[k - 1]: expected tokens over cost for a K of k (rate < 1: Laplace)."""
        rate = self.rate
        ks = np.arange(1, min(self.config.max_draft, len(cost) - 1) + 1)
        return (1.0 - rate ** (ks + 1)) / (1.0 - rate) / cost[ks]

    def _best_length(self, cost: np.ndarray) -> int:
        """The best K; 0, and drafting paused, once the recent acceptance is known to lose, or
        at once where the costs alone lose: even if every drafted token were kept (a draft
        model whose step costs as much as the target's, as an F16 draft for an F32 target does
        on a compute-bound CPU), no trial is paid for."""
        gains = self._gains(cost)
        best = int(gains.argmax())
        if gains[best] < MIN_GAIN and (self.judged >= self.config.evidence or self._hopeless(cost, len(gains))):
            self.paused, self.recent = self.config.retry_after, deque(maxlen=self.config.window)
            return 0
        return best + 1

    @staticmethod
    def _hopeless(cost: np.ndarray, k_max: int) -> bool:
        """No K up to k_max gains MIN_GAIN even with every drafted token kept."""
        ks = np.arange(1, k_max + 1)
        return float(((ks + 1) / cost[ks]).max()) < MIN_GAIN

    def record(self, drafted: int, accepted: int) -> None:
        self.recent.append((drafted, accepted))
        if self._shared is not None:
            self._shared.append((drafted, accepted))
        self.drafted += drafted
        self.accepted += accepted


@dataclass
class RequestDrafts:
    """One request's speculation: each source's record, and this step's draft."""

    lookup: DraftState
    model: DraftState | None = None  # None: no draft model, or the request asked for none
    sampler: Sampler | None = None  # draws the draft model's tokens, with an RNG apart from the request's
    source: DraftState | None = None  # where this step's draft came from
    proposals: list[Proposal] | None = None  # q of each token the draft model drafted this step
    ngrams: NgramIndex | None = None  # prompt lookup's index of the request's history

    def counts(self) -> dict[str, int]:
        """Drafted and accepted tokens, in all and per source (Timings' fields)."""
        model = self.model or DraftState(self.lookup.config)
        return {"drafted": self.lookup.drafted + model.drafted, "accepted": self.lookup.accepted + model.accepted,
                "lookup_drafted": self.lookup.drafted, "lookup_accepted": self.lookup.accepted,
                "model_drafted": model.drafted, "model_accepted": model.accepted}  # fmt: skip
