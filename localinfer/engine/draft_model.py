"""A draft model: a small model with the target's vocabulary that proposes tokens for the
target to verify (speculative.py has the rule that keeps the output the target's).

It is a second backend with one KV sequence per target slot. Its cache follows the target's
context: a prompt's chunks as the target prefills them (in time to first token, not in
decoding), and before each draft the token or two taken since the last one, all in the same
batched forward as the first draft position, so each draft position costs one draft forward
for every drafting request together.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import Backend, Batch
from localinfer.engine.prefix import common_prefix
from localinfer.engine.speculative import CLOCK_SAMPLES, Proposal, median
from localinfer.errors import UserError

# (the draft's logits at the next position, the tokens drafted so far) -> (a token, its q), or None: draft no further
Chooser = Callable[[np.ndarray, list[int]], "tuple[int, Proposal] | None"]


@dataclass
class DraftRequest:
    slot: int  # the target's sequence id, and the draft's
    context: list[int]  # every token the target has taken, the pending one (fed next) last
    k: int  # most tokens to draft; 0: only catch up with `context` (a prompt being prefilled)
    choose: Chooser | None = None


@dataclass
class Draft:
    tokens: list[int]
    proposals: list[Proposal]


def check_vocab(target: Backend, draft: Backend) -> None:
    """The draft must tokenize as the target does: the same token bytes and special tokens,
    its vocabulary the target's or a prefix of it (Qwen pads its target's). UserError if not."""
    t, d = target.vocab, draft.vocab
    if d.n_vocab > t.n_vocab:
        raise UserError(f"the draft model's vocabulary has {d.n_vocab} tokens, more than the target's {t.n_vocab}: they are not the same tokenizer")
    if (d.bos_id, d.eos_id) != (t.bos_id, t.eos_id):
        raise UserError(f"the draft model's BOS/EOS tokens are {d.bos_id}/{d.eos_id}, the target's {t.bos_id}/{t.eos_id}: they are not the same tokenizer")
    special = {i: text for i, text in t.special.items() if i < d.n_vocab}
    if d.special != special:
        differ = min(set(d.special.items()) ^ set(special.items()))[0]
        raise UserError(f"the draft model's special token {differ} is {d.special.get(differ)!r}, the target's {special.get(differ)!r}: they are not the same tokenizer")
    for i in range(d.n_vocab):
        if draft.token_bytes(i) != target.token_bytes(i):
            raise UserError(f"the draft model's token {i} is {draft.token_bytes(i)!r}, the target's {target.token_bytes(i)!r}: they are not the same tokenizer")


DRAFT_SAMPLES = 4  # draft steps timed before their cost replaces the prior (the bytes ratio)


class DraftModel:
    """The draft backend, what each of its sequences holds, and what a draft step costs."""

    def __init__(self, backend: Backend, slots: int, name: str, catch_up: int = 512) -> None:
        """`catch_up`: most context tokens one step feeds the draft (a long prompt is caught
        up over several steps, while its request decodes without drafting)."""
        self.backend, self.name, self.catch_up = backend, name, catch_up
        self._cached: list[list[int]] = [[] for _ in range(slots)]
        for slot in range(slots):  # what they hold is known from here on: nothing
            backend.kv_clear(slot)
        # Recent seconds of one request's draft position, sampling included: the first of a
        # draft (which also feeds what the target accepted since: 2 rows where the rest feed 1)
        # and the ones after it.
        self._first: deque[float] = deque(maxlen=CLOCK_SAMPLES)
        self._first_rows: deque[int] = deque(maxlen=CLOCK_SAMPLES)  # the rows a first position fed
        self._later: deque[float] = deque(maxlen=CLOCK_SAMPLES)

    def propose(self, requests: list[DraftRequest]) -> dict[int, Draft]:
        """Drafts keyed by slot. A request whose context the draft is too far behind on is
        caught up (by at most `catch_up` tokens a step) and drafts nothing yet. A failed
        forward forgets what its sequences held and raises."""
        budget, rows, wanting = self.catch_up, [], {}
        for r in requests:
            start = self._sync(r.slot, r.context, leave=1 if r.k else 0)
            missing = r.context[start:]
            if not missing or max(missing) >= self.backend.vocab.n_vocab:  # nothing new, or a token past the draft's vocabulary
                continue
            fits = len(missing) <= budget
            if fits or budget:
                rows.append((r.slot, missing if fits else missing[:budget], start, fits and r.k > 0))
                budget -= min(budget, len(missing))
            if fits and r.k > 0:
                wanting[r.slot] = r
        drafts = {slot: Draft([], []) for slot in wanting}
        first = True
        while rows:
            t0 = time.perf_counter()
            logits, out, following = self._forward(rows), 0, []
            for slot, tokens, start, want in rows:
                if not want:
                    continue
                draft, r = drafts[slot], wanting[slot]
                pick = r.choose(logits[out], draft.tokens)  # type: ignore[misc]
                out += 1
                if pick is None:
                    continue
                draft.tokens.append(pick[0])
                draft.proposals.append(pick[1])
                if len(draft.tokens) < r.k:
                    following.append((slot, [pick[0]], start + len(tokens), True))
            if out and all(len(tokens) <= 2 for _, tokens, _, _ in rows):  # not a catch-up of a whole prompt
                (self._first if first else self._later).append((time.perf_counter() - t0) / out)
                if first:
                    self._first_rows.append(sum(len(tokens) for _, tokens, _, _ in rows) // out)
            rows, first = following, False
        return {slot: draft for slot, draft in drafts.items() if draft.tokens}

    def _sync(self, slot: int, context: list[int], leave: int) -> int:
        """Cut the slot's cache back to what it shares with `context` (leaving at least
        `leave` tokens to feed: the one whose logits a draft starts from); returns how many
        tokens it keeps."""
        cached = self._cached[slot]
        keep = common_prefix(cached, context, len(context) - leave)
        if keep < len(cached):
            keep = self.backend.kv_truncate(slot, keep)
            del cached[keep:]
        return keep

    def _forward(self, rows: list[tuple[int, list[int], int, bool]]) -> np.ndarray:
        try:
            logits = self.backend.forward(Batch.of_rows((slot, chunk, start, int(wants)) for slot, chunk, start, wants in rows))
        except Exception:
            for slot, *_ in rows:
                self.forget(slot)
            raise
        for slot, chunk, _, _ in rows:
            self._cached[slot] += chunk
        return logits

    def forget(self, slot: int) -> None:
        """Empty a slot (its cache's contents are unknown after a failure)."""
        self._cached[slot] = []
        self.backend.kv_clear(slot)

    def position_seconds(self) -> tuple[float, float] | None:
        """What one request's draft positions cost: (its first, each later one), each the
        median of the recent ones; None before DRAFT_SAMPLES first positions were timed. Apart,
        because llama.cpp's forward costs by the row: the first position's 2 rows took 11.5 ms
        and a later one's 6.5 (a Q4_1 draft beside an F32 target at 9.4), and one mean of both
        made the draft look as dear as its target."""
        if len(self._first) < DRAFT_SAMPLES:
            return None
        first = median(self._first)
        # Until later positions were timed, the first's cost a row: a guess on the cheap side,
        # so that longer drafts get tried and timed (one on the dear side kept K at 1 for good).
        later = median(self._later) if len(self._later) >= 2 else first / max(1.0, median(self._first_rows))
        return first, later

    def draft_seconds(self, k: int | np.ndarray) -> np.ndarray | None:
        """What drafting k tokens for one request costs (k: a count, or an array of them): its
        first position, then k - 1 more; None before the positions were timed."""
        costs = self.position_seconds()
        return None if costs is None else np.where(np.asarray(k) > 0, costs[0] + (np.asarray(k) - 1) * costs[1], 0.0)

    def close(self) -> None:
        self.backend.close()
