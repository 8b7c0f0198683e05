"""How many prompt tokens a step may carry while other requests are decoding.

A step that only decodes costs about one read of the weights. Prompt tokens add compute,
and a token deep into a long prompt adds attention over everything before it: on 2 cores a
16-token chunk at position 2,000 costs 4 to 8 decode steps. A fixed chunk size therefore
cannot bound the running streams' inter-token latency. The chunk is sized by time instead:
a step carrying prompt tokens may take at most `slowdown` times a decode-only step, a
latency budget in the spirit of Sarathi-Serve's, fitted online rather than profiled offline.
With nobody decoding there is no latency to protect, and a prompt gets the whole chunk.
"""

from __future__ import annotations

import math

DEFAULT_SLOWDOWN = 2.0
SPAN = 1024  # positions at which a prompt token's attention costs about its matmuls; the fitted scale corrects it
DECODE_WEIGHT = 0.1  # EMA weights: decode-only steps are many and steady, chunk costs change as a prompt grows
CHUNK_WEIGHT = 0.3
FIRST_GUESS = 8.0  # before any chunk was timed: a prompt token costs 1/8 of a decode step (measured: 1/8 to 1/14)


def work(start: int, n: int) -> float:
    """Cost units of prefilling positions start..start+n-1: one per token, plus attention."""
    return n * (1.0 + (start + n / 2) / SPAN)


class PrefillBudget:
    def __init__(self, slowdown: float = DEFAULT_SLOWDOWN) -> None:
        self.slowdown = slowdown  # 0: no limit, every chunk is the token limit; at most 1: one token a step
        self.decode_s: float | None = None  # EMA of a decode-only step's time
        self.unit_s: float | None = None  # EMA of the extra seconds per work unit in a step with prompt tokens

    def seconds(self, decoding: bool) -> float:
        """The time this step may spend on prompt tokens (inf: no limit)."""
        if not decoding or self.slowdown <= 0 or self.decode_s is None:
            return math.inf
        return (self.slowdown - 1.0) * self.decode_s

    def take(self, start: int, wanted: int, seconds: float) -> int:
        """Tokens of a prompt at `start` that fit in `seconds` (at least 1: every step makes progress)."""
        if math.isinf(seconds) or wanted <= 1:
            return wanted
        unit = self._unit()
        lo, hi = 1, wanted  # the largest n with work(start, n) * unit <= seconds; work grows with n
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if work(start, mid) * unit <= seconds else (lo, mid - 1)
        return lo

    def cost(self, start: int, n: int) -> float:
        return work(start, n) * self._unit()

    def _unit(self) -> float:
        """Seconds per work unit: as fitted, or a first guess from the decode step's time."""
        return self.unit_s if self.unit_s is not None else (self.decode_s or 0.0) / FIRST_GUESS

    def observe(self, seconds: float, decoded: int, chunks: list[tuple[int, int]]) -> None:
        """Learn from a step's time: `decoded` decode rows and prompt `chunks` (start, tokens)."""
        if not chunks:
            if decoded:
                self.decode_s = seconds if self.decode_s is None else self.decode_s + DECODE_WEIGHT * (seconds - self.decode_s)
            return
        if self.decode_s is None:
            return  # the part that is the weights' read is unknown yet
        units = sum(work(start, n) for start, n in chunks)
        sample = max(seconds - self.decode_s, 0.0) / units
        self.unit_s = sample if self.unit_s is None else self.unit_s + CHUNK_WEIGHT * (sample - self.unit_s)
