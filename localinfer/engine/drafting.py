"""Speculation's stage of a step: for each decoding request, where this step's draft comes
from (prompt lookup, or the draft model for every request at once) and how many tokens,
from its recent acceptance and what K tokens cost. `Engine.step()` calls `drafts()` between
scheduling and the forward; speculative.py has the rule that keeps the output the target's
and why, draft_model.py the draft model.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import numpy as np

from localinfer.backends.base import Backend
from localinfer.engine.draft_model import Chooser, DraftModel, DraftRequest, Proposal
from localinfer.engine.sampler import Sampler, draw
from localinfer.engine.speculative import DraftConfig, DraftState, forward_seconds, lookup, verify_cost
from localinfer.engine.types import SamplingParams

if TYPE_CHECKING:
    from localinfer.engine.engine import _Sequence


@dataclass
class RequestDrafts:
    """One request's speculation: each source's record, and this step's draft."""

    lookup: DraftState
    model: DraftState | None = None  # None: no draft model, or the request asked for none
    sampler: Sampler | None = None  # draws the draft model's tokens, with an RNG apart from the request's
    source: DraftState | None = None  # where this step's draft came from
    proposals: list[Proposal] | None = None  # q of each token the draft model drafted this step

    def counts(self) -> dict[str, int]:
        """Drafted and accepted tokens, in all and per source (Timings' fields)."""
        model = self.model or DraftState(self.lookup.config)
        return {"drafted": self.lookup.drafted + model.drafted, "accepted": self.lookup.accepted + model.accepted,
                "lookup_drafted": self.lookup.drafted, "lookup_accepted": self.lookup.accepted,
                "model_drafted": model.drafted, "model_accepted": model.accepted}  # fmt: skip


class Drafting:
    """The engine's speculation: its settings, the draft model if any, and the costs its
    choice of K rests on (measured once by the engine's owner thread, `calibrate`)."""

    def __init__(self, config: DraftConfig, target: Backend, drafter: DraftModel | None = None) -> None:
        self.config, self.target, self.drafter = config, target, drafter
        self.verify_cost: np.ndarray | None = None  # cost[k]: verifying k drafted tokens, in 1-row forwards
        self.row_seconds = 0.0  # a 1-row forward of the target, measured with verify_cost
        self.eog_ids = target.vocab.eog_ids
        self._eog = np.array(sorted(self.eog_ids), dtype=np.intp)

    def calibrate(self, slot: int) -> None:
        """Time the target's 1..K+1-row forwards and the draft's 1-row one on an empty `slot`."""
        seconds = forward_seconds(self.target, slot, self.config.max_draft + 1)
        self.verify_cost, self.row_seconds = verify_cost(seconds), float(seconds[0])
        if self.drafter is not None:
            self.drafter.forget(slot)
            self.drafter.step_seconds = float(forward_seconds(self.drafter.backend, slot, 1)[0])

    @staticmethod
    def may_draft(params: SamplingParams) -> bool:
        """Whether a request could ever take a draft: a step drafts at most max_tokens - 2
        tokens after the first (k drafted: k + 1 out), so an answer of 2 tokens or fewer never
        does, and needs no calibration (a 2-token `run` would otherwise pay it in full)."""
        return params.draft_max != 0 and (params.max_tokens is None or params.max_tokens > 2)

    def admit(self, params: SamplingParams) -> RequestDrafts:
        """A new request's speculation state (no draft model where it asked draft_max 0)."""
        spec = RequestDrafts(DraftState(self.config))
        if self.drafter is not None and params.draft_max != 0:
            spec.model, spec.sampler = DraftState(self.config), Sampler(replace(params, seed=(params.seed or 0) ^ 0x5EED))
        return spec

    def drafts(self, decoding: list[_Sequence], prefills: list[tuple[_Sequence, list[int], int, int]], n_ctx: int) -> dict[int, list[int]]:
        """This step's drafts, by request (speculative.py): prompt lookup's where it finds one
        and has lately held at least as well as the draft model, else the draft model's, for
        every request at once in draft_model.py's stage; never more than the answer's or the
        slot's room (`n_ctx`, a sequence's). The draft model also takes this step's `prefills`
        chunks (rows as step() builds them), so its prompt is not left to the first decode step."""
        drafts: dict[int, list[int]] = {}
        asks = [(seq, DraftRequest(seq.seq_id, seq.prompt[: start + len(chunk)], 0)) for seq, chunk, start, _ in prefills if seq.spec and seq.spec.model]
        for seq in decoding:
            spec = seq.spec
            spec.source, spec.proposals = None, None  # type: ignore[union-attr]
            room = n_ctx - 2 - seq.n_past
            if seq.params.max_tokens is not None:
                room = min(room, seq.params.max_tokens - len(seq.generated) - 1)  # k drafted: k + 1 tokens out
            if seq.params.draft_max is not None:
                room = min(room, seq.params.draft_max)
            if room <= 0 or seq.forced:
                continue
            if tokens := self._lookup(seq, room):
                drafts[seq.request_id], spec.source = tokens, spec.lookup  # type: ignore[union-attr]
            elif spec.model is not None and (k := min(spec.model.draft_length(self._model_cost()), room)) > 0:  # type: ignore[union-attr]
                asks.append((seq, DraftRequest(seq.seq_id, seq.history, k, self._chooser(seq))))
        if asks:
            try:
                proposed = self.drafter.propose([ask for _, ask in asks])  # type: ignore[union-attr]
            except Exception:  # noqa: BLE001 - a failed draft costs these requests their drafting, never their answer
                proposed = {}
                for seq, _ in asks:
                    seq.spec.model = None  # type: ignore[union-attr]
            for seq, _ in asks:
                if (draft := proposed.get(seq.seq_id)) is not None:
                    spec = seq.spec
                    drafts[seq.request_id], spec.source, spec.proposals = draft.tokens, spec.model, draft.proposals  # type: ignore[union-attr]
        return drafts

    def _lookup(self, seq: _Sequence, room: int) -> list[int]:
        """Prompt lookup's draft, unless the draft model has lately done better for this request."""
        state, model = seq.spec.lookup, seq.spec.model  # type: ignore[union-attr]
        if model is not None and state.rate < model.rate:
            return []
        k = min(state.draft_length(self.verify_cost), room)  # type: ignore[arg-type]
        if k <= 0:
            return []
        c = self.config
        drafted = lookup(np.asarray(seq.history, dtype=np.int32), c.ngram_min, c.ngram_max, k)  # type: ignore[union-attr]
        if seq.mask is not None and drafted:  # what the grammar would refuse could never be accepted: not worth a row
            drafted = drafted[: seq.mask.valid_prefix(drafted)]
        return drafted

    def _model_cost(self) -> np.ndarray:
        """cost[k]: k draft-model steps and a (k+1)-row verify, in 1-row target forwards."""
        step = (self.drafter.step_seconds or 0.0) / self.row_seconds if self.row_seconds else 0.0  # type: ignore[union-attr]
        return self.verify_cost + step * np.arange(len(self.verify_cost))  # type: ignore[operator]

    def _chooser(self, seq: _Sequence) -> Chooser:
        """How the draft model picks a request's tokens: the request's own sampling settings
        (and grammar, on a copy of its state) over the draft's logits, drawn with the draft's RNG."""
        thinking = seq.splitter is not None and seq.splitter.thinking
        mask = seq.mask.fork() if seq.mask is not None and not thinking else None
        sampler, eog = seq.spec.sampler, self.eog_ids  # type: ignore[union-attr]
        banned = self._eog if seq.params.ignore_eos else None

        def choose(logits: np.ndarray, drafted: list[int]) -> tuple[int, Proposal] | None:
            if drafted and drafted[-1] in eog:
                return None  # nothing follows the end
            if banned is not None:
                logits[banned[banned < len(logits)]] = -np.inf
            allowed = mask.apply(logits) if mask is not None else None
            if allowed is not None and not len(allowed):
                return None
            ids, probs = sampler.distribution(logits, seq.history + drafted, seq.generated + drafted, allowed)  # type: ignore[union-attr]
            token = int(ids[draw(probs, sampler.rng)])  # type: ignore[union-attr]
            if mask is not None and not mask.advance(token):
                return None
            return token, (ids, probs)

        return choose

    def close(self) -> None:
        if self.drafter is not None:
            self.drafter.close()
