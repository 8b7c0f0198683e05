"""How much of a cached token sequence a new one can reuse."""

from __future__ import annotations


def common_prefix(a: list[int], b: list[int], limit: int) -> int:
    """How many leading tokens `a` and `b` share, at most `limit`."""
    n = min(len(a), len(b), limit)
    if a[:n] == b[:n]:  # the usual case, at C speed: a cache one step behind its sequence
        return n
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i
