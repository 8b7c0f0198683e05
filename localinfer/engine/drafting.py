"""Speculation's stage of a step: for each decoding request, where this step's draft comes
from (prompt lookup, or the draft model for every request at once) and how many tokens,
from its recent acceptance and what K tokens cost. `Engine.step()` calls `drafts()` between
scheduling and the forward; speculative.py has the rule that keeps the output the target's
and why, draft_model.py the draft model.
"""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import numpy as np

from localinfer.backends.base import Backend
from localinfer.engine.draft_model import Chooser, DraftModel, DraftRequest
from localinfer.engine.request import Request
from localinfer.engine.sampler import Sampler, draw
from localinfer.engine.speculative import DraftConfig, DraftState, NgramIndex, Proposal, RequestDrafts, StepClock
from localinfer.engine.types import SamplingParams


def bytes_ratio(draft: Backend, target: Backend) -> float:
    """The draft's model file over the target's, in bytes (0.5 where either cannot be read)."""
    try:
        return draft.facts.path.stat().st_size / target.facts.path.stat().st_size
    except (OSError, ZeroDivisionError):
        return 0.5


class Drafting:
    """The engine's speculation: its settings, the draft model if any, and what a step costs
    (speculative.StepClock, timed on the engine's own steps: nothing before a first token)."""

    def __init__(self, config: DraftConfig, target: Backend, drafter: DraftModel | None = None) -> None:
        self.config, self.target, self.drafter = config, target, drafter
        self.clock = StepClock()
        self._assumed = np.asarray(config.assumed_costs, dtype=float) if config.assumed_costs is not None else None
        self.eog_ids = target.vocab.eog_ids
        self._eog = np.array(sorted(self.eog_ids), dtype=np.intp)
        # A draft step before the draft model timed one: its share of the target's bytes (decoding
        # reads every weight once a token, so bytes are what a step costs on a memory-bound machine).
        self._draft_prior = bytes_ratio(drafter.backend, target) if drafter is not None else 0.0
        # The draft model's latest verdicts, over requests: its acceptance is the pair's more than
        # the request's, so a new request does not pay for a trial that earlier ones just lost
        # (prompt lookup's is the request's own: it starts each request afresh).
        self._model_verdicts: deque[tuple[int, int]] = deque(maxlen=config.window)

    def observe(self, rows: int, seconds: float) -> None:
        """A decode step fed `rows` rows (no prompt chunk) and took `seconds`, sampling included."""
        self.clock.observe(rows, seconds)

    def verify_cost(self, base: int) -> np.ndarray | None:
        """cost[k]: a step where one of `base` decoding requests drafts k tokens, in plain
        steps; None while no plain step of `base` rows was timed (such steps draft nothing)."""
        if self._assumed is not None:
            return self._assumed
        return self.clock.costs(base, self.config.max_draft)

    def admit(self, params: SamplingParams) -> RequestDrafts:
        """A new request's speculation state (no draft model where it asked draft_max 0)."""
        spec = RequestDrafts(DraftState(self.config), ngrams=NgramIndex(self.config.ngram_min, self.config.ngram_max))
        if self.drafter is not None and params.draft_max != 0:
            spec.model, spec.sampler = DraftState(self.config, self._model_verdicts), Sampler(replace(params, seed=(params.seed or 0) ^ 0x5EED))
        return spec

    def drafts(self, decoding: list[Request], prefills: list[tuple[Request, list[int], int, int]]) -> dict[int, list[int]]:
        """This step's drafts, by request (speculative.py): prompt lookup's where it finds one
        and lately promised as many tokens per cost as the draft model, else the draft model's, for
        every request at once in draft_model.py's stage; never more than the request's room
        (`Request.draft_room`). The draft model also takes this step's `prefills` chunks (rows
        as step() builds them), so a long prompt is not left to the first decode step; all but
        the chunk that ends the prompt, whose step gives the first token: nothing stands
        between a prompt and its first token, and the draft catches that chunk up a step later."""
        drafts: dict[int, list[int]] = {}
        verify = self.verify_cost(len(decoding))
        asks = [(seq, DraftRequest(seq.seq_id, seq.prompt[: start + len(chunk)], 0)) for seq, chunk, start, _ in prefills if seq.spec and seq.spec.model and start + len(chunk) < len(seq.prompt)]
        model_cost = self._model_cost(verify, len(decoding)) if self.drafter is not None and verify is not None else None
        for seq in decoding:
            spec = seq.spec
            if spec is None:  # a request that does not speculate (one with images)
                continue
            spec.source, spec.proposals = None, None
            room = seq.draft_room()
            if room <= 0 or verify is None:
                continue
            if tokens := self._lookup(seq, room, verify, model_cost):
                drafts[seq.request_id], spec.source = tokens, spec.lookup  # type: ignore[union-attr]
            elif spec.model is not None and (k := min(spec.model.draft_length(model_cost), room)) > 0:  # type: ignore[union-attr, arg-type]
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

    def _lookup(self, seq: Request, room: int, verify: np.ndarray, model_cost: np.ndarray | None) -> list[int]:
        """Prompt lookup's draft, unless the draft model lately promised more tokens per cost
        for this request (at equal acceptance, lookup wins: its drafts cost no draft steps)."""
        state, model = seq.spec.lookup, seq.spec.model  # type: ignore[union-attr]
        if model is not None and model_cost is not None and state.gain(verify) < model.gain(model_cost):
            return []
        k = min(state.draft_length(verify), room)
        if k <= 0:
            return []
        drafted = seq.spec.ngrams.draft(seq.history, k)  # type: ignore[union-attr]
        if seq.mask is not None and drafted:  # what the grammar would refuse could never be accepted: not worth a row
            drafted = drafted[: seq.mask.valid_prefix(drafted)]
        return drafted

    def _model_cost(self, verify: np.ndarray, base: int) -> np.ndarray:
        """cost[k]: drafting k tokens with the draft model and verifying them, in plain steps
        (the draft's cost as timed, else assumed: the bytes ratio per token)."""
        ks = np.arange(len(verify))
        step, plain = self.config.assumed_draft_step, self.clock.seconds(base)
        measured = self.drafter.draft_seconds(ks) if step is None else None  # type: ignore[union-attr]
        if measured is None or not plain:
            return verify + (self._draft_prior if step is None else step) * ks
        return verify + measured / plain

    def _chooser(self, seq: Request) -> Chooser:
        """How the draft model picks a request's tokens: the request's own sampling settings
        (and grammar, on a copy of its state) over the draft's logits, drawn with the draft's RNG."""
        mask = seq.mask.fork() if seq.mask is not None and not seq.thinking else None
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
