"""Prompt-lookup speculative decoding, written once above the backends.

Drafting. The last n tokens of a request (n from `ngram_max` down to `ngram_min`) are looked
up earlier in its prompt and answer; the K tokens that followed their latest occurrence are
the draft. Summaries, extractions and code edits repeat their input, so drafts often hold.

Verification. The engine feeds [pending, d1..dK] in the step's one batched forward with
logits for every row, samples the rows in order with the request's own sampler, exactly as
it would without speculation, and keeps d(j+1) while the token sampled from row j equals it.
The first mismatch (or the bonus token after a fully accepted draft) becomes the next
pending token; the rejected tail is rolled back with `kv_truncate`.

Why sample-and-compare is the speculative-sampling rule. The draft is a point mass on x, so
the rule accepts x with probability min(1, p(x)) = p(x) and on rejection draws from p with x
removed, renormalised, p being the distribution the sampler draws from (after penalties,
top-k, top-p, min-p and temperature). A draw t ~ p with "accept iff t == x" does exactly
that: P(t = x) = p(x), and t given t != x follows p without x, renormalised. It also spends
the request's RNG as plain decoding does, one draw a token, and leaves greedy decoding
unchanged. (A seeded sampled run is the same in distribution, not token for token: a
many-row forward rounds differently from a 1-row one, ~1e-4 in a probability, which moves a
draw that lands that close to a boundary.)

Adaptive. With a per-token acceptance rate a, a K-token draft yields (1 - a^(K+1)) / (1 - a)
tokens per forward, for a forward that costs c(K) times a 1-row one (`verify_cost`, measured
once at load on this backend and machine). Each request drafts the K that maximises
tokens/cost for the acceptance it has seen lately, so K grows while drafts hold and shrinks
when they do not; when no K beats plain decoding, it stops drafting and retries later.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import Backend, Batch


@dataclass(frozen=True)
class DraftConfig:
    ngram_min: int = 2
    ngram_max: int = 4
    max_draft: int = 10  # K at most
    window: int = 16  # verifications the acceptance rate is measured over
    evidence: int = 8  # drafted tokens seen before drafting may be switched off
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


def measure_verify_cost(backend: Backend, slot: int, max_draft: int, repeats: int = 2) -> np.ndarray:
    """cost[k] = time of a (k+1)-row forward of one sequence over that of a 1-row forward,
    k = 0..max_draft, measured on `slot` (left empty) and interpolated between the row counts tried."""
    rows = sorted({n for n in (1, 2, 3, 5, 9) if n <= max_draft} | {max_draft + 1})
    token = backend.vocab.bos_id if backend.vocab.bos_id is not None else 0
    best: list[float] = []
    for n in rows:
        times = []
        for _ in range(repeats):
            backend.kv_clear(slot)
            t0 = time.perf_counter()
            backend.forward(Batch.for_sequence([token] * n, 0, slot, all_logits=True))
            times.append(time.perf_counter() - t0)
        best.append(min(times))
    backend.kv_clear(slot)
    curve = np.interp(np.arange(1, max_draft + 2), rows, best)
    return np.maximum(curve / curve[0], 1.0)


class DraftState:
    """One request's speculation: how long a draft to try, and its counts for timings and metrics."""

    def __init__(self, config: DraftConfig, cost: np.ndarray) -> None:
        self.config = config
        self.cost = cost  # cost[k]: a k-token verification against plain decoding
        self.recent: deque[tuple[int, int]] = deque(maxlen=config.window)  # (drafted, accepted)
        self.paused = 0  # decode steps left before drafting again
        self.drafted = 0
        self.accepted = 0

    def draft_length(self) -> int:
        """K for this step: the best tokens per cost at the recent acceptance rate; 0 while paused."""
        if self.paused:
            self.paused -= 1
            return 0
        drafted = sum(d for d, _ in self.recent)
        accepted = sum(a for _, a in self.recent)
        rate = (accepted + 1) / (drafted + 2)  # Laplace: one of each before any evidence
        gains = [expected_tokens(rate, k) / self.cost[k] for k in range(1, self.config.max_draft + 1)]
        best = int(np.argmax(gains))
        if gains[best] <= 1.0 and drafted >= self.config.evidence:
            self.paused, self.recent = self.config.retry_after, deque(maxlen=self.config.window)
            return 0
        return best + 1

    def record(self, drafted: int, accepted: int) -> None:
        self.recent.append((drafted, accepted))
        self.drafted += drafted
        self.accepted += accepted
