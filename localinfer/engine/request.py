"""One request in flight, as the engine's step sees it: its tokens and place in the KV
cache, its sampler and what it drafted, its text as it streams, its events and its clocks.

The engine decides what runs in a step and owns the backend; a `Request` decides what its
own rows of logits mean. `sample` turns one row into the next token (and its text, stop and
ending), `verify` judges a speculated draft row by row, `output` builds the result. The
per-token path is kept lean: a GPU step takes a few milliseconds, and every microsecond the
loop spends here is a microsecond the device waits (bench/loop_cost.py measures it).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass, field

import numpy as np

from localinfer.backends.base import MediaChunk
from localinfer.engine.constraints import TokenMask
from localinfer.engine.detokenize import StreamDetokenizer
from localinfer.engine.media import extra_cells
from localinfer.engine.reasoning import Splitter
from localinfer.engine.sampler import Sampler
from localinfer.engine.speculative import Proposal, RequestDrafts, speculative_choice
from localinfer.engine.stops import StopMatcher
from localinfer.engine.stream import RequestStream
from localinfer.engine.types import CompletionOutput, SamplingParams, Timings, TokenEvent
from localinfer.errors import UserError

Ending = tuple[str, bool, "Exception | None"]  # how a request ends: its finish reason, whether to flush held text, its error


@dataclass(frozen=True)
class RequestContext:
    """What every request of one engine needs to know of its model, built once."""

    eog_ids: frozenset[int]  # end-of-generation tokens
    eog: np.ndarray  # the same, as an index array (ignore_eos bans them)
    n_ctx: int  # one sequence's context
    budget_close: tuple[int, ...]  # the tokens that close a think block (harmony: its analysis) whose budget is spent
    load_ms: float  # the model's load time, reported in every request's timings


def token_logprobs(logits: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """log softmax of the model's own logits (before penalties and temperature, as OpenAI
    and vLLM report them): the chosen token's value and the k largest."""
    m = float(logits.max())
    lse = m + float(np.log(np.exp(logits - m, dtype=np.float64).sum()))
    top = np.argpartition(logits, -k)[-k:] if 0 < k < len(logits) else np.arange(len(logits) if k else 0)
    top = top[np.argsort(-logits[top], kind="stable")]
    return float(logits[token]) - lse, [(int(t), float(logits[t]) - lse) for t in top]


@dataclass(eq=False)
class Request:
    """A request in flight: its tokens, its place in the KV cache, and its clocks."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    context: RequestContext
    sampler: Sampler
    detok: StreamDetokenizer
    stops: StopMatcher
    stream: RequestStream
    history: list[int]  # prompt + generated, for the repetition penalty
    seq_id: int = -1  # its slot: a KV-cache sequence id; -1 while it holds none
    n_past: int = 0  # tokens already in the KV cache
    pending: int | None = None  # sampled but not yet fed back through the model
    generated: list[int] = field(default_factory=list)
    text: list[str] = field(default_factory=list)
    t_submit: float = 0.0
    t_prefill: float = 0.0  # prefill start
    t_first: float = 0.0
    t_last: float = 0.0
    n_sampled: int = 0  # samples drawn, the end-of-generation one included
    prompt_ms: float = 0.0
    cached_tokens: int = 0  # prompt tokens found in the KV cache, not prefilled again
    cached_from: dict[str, int] = field(default_factory=dict)  # those tokens by where they came from: slot, ram, disk
    spec: RequestDrafts | None = None  # its speculation, when the engine drafts (drafting.py)
    mask: TokenMask | None = None  # structured output: the grammar's state
    n_forwards: int = 0  # decode forwards this request took part in (tokens per forward = answer / this)
    splitter: Splitter | None = None  # a reasoning model's: thinking apart from the answer
    reasoning: list[str] = field(default_factory=list)
    reasoning_end: int = 0  # answer tokens up to the one that closed the think block (0: none closed)
    forced: deque[int] = field(default_factory=deque)  # tokens the engine writes itself (a thinking budget's close)
    media: dict[int, MediaChunk] = field(default_factory=dict)  # its prompt's images, by where each one's placeholders start (media.py)

    @property
    def n_cells(self) -> int:
        """KV-cache cells this request's sequence fills: a cell a position, but for an image
        laid out in 2-D (media.extra_cells)."""
        return self.n_past + extra_cells(self.media, self.n_past)

    @property
    def prefilling(self) -> bool:
        return self.n_past < len(self.prompt)

    @property
    def thinking(self) -> bool:
        """Inside a reasoning model's think block (a constraint shapes the answer, not the thinking)."""
        return self.splitter is not None and self.splitter.thinking

    def prefilled(self, n: int) -> None:
        """`n` more prompt tokens are in the cache."""
        self.n_past += n
        if not self.prefilling:
            self.prompt_ms = (time.perf_counter() - self.t_prefill) * 1e3

    def draft_room(self) -> int:
        """Most tokens this step may draft: k drafted is k + 1 out, within the answer's and
        the slot's room and the request's own draft_max; 0 while the engine writes tokens itself."""
        if self.forced:
            return 0
        room = self.context.n_ctx - 2 - self.n_cells
        if self.params.max_tokens is not None:
            room = min(room, self.params.max_tokens - len(self.generated) - 1)
        if self.params.draft_max is not None:
            room = min(room, self.params.draft_max)
        return room

    # --- a row of logits -> the next token ---------------------------------------------
    def verify(self, fed: list[int], start: int, logits: np.ndarray) -> tuple[int, Ending | None]:
        """Sample row by row as plain decoding would (a draft model's token by the
        speculative-sampling rule) and keep each drafted token that comes out: how many of
        `fed` (the pending token, then the draft) are now valid in the cache, and how the
        request ends, if it does. The draft is judged before the request may finish, so a
        request's last step counts in its timings."""
        self.n_forwards += 1
        kept, ending = 0, None
        proposals = self.spec.proposals if self.spec is not None else None
        for row in range(len(fed)):
            kept += 1  # fed[row] is now a valid part of the cache
            self.n_past = start + kept
            last = row + 1 == len(fed)
            ending = self.sample(logits[row], (fed[row + 1], proposals[row]) if proposals and not last else None)
            if ending is not None or last or self.pending != fed[row + 1]:
                break  # finished, the bonus token, or the draft's first miss
        if self.spec is not None and self.spec.source is not None and len(fed) > 1:
            self.spec.source.record(len(fed) - 1, kept - 1)
        return kept, ending

    def sample(self, logits: np.ndarray, drafted: tuple[int, Proposal] | None = None) -> Ending | None:
        """Sample the next token and emit it; how the request ends, if it does. `drafted`:
        the draft model's token for this row and the q it came from, kept or replaced by the
        speculative-sampling rule (prompt lookup's drafts need no rule: see speculative.py).
        `logits` may be edited in place."""
        params = self.params
        k = params.logprobs
        raw = logits.copy() if k is not None else None  # the sampler edits logits in place
        if params.ignore_eos:
            logits[self.context.eog] = -np.inf
        mask = None if self.thinking else self.mask
        allowed = mask.apply(logits) if mask is not None else None  # before every other step of the sampler
        if allowed is not None and not len(allowed):
            return "error", True, UserError(mask.error)  # type: ignore[union-attr]
        if self.forced:  # the engine writes this token itself: the only one left to draw
            forced = self.forced.popleft()
            logits.fill(-np.inf)
            logits[forced] = 0.0
            allowed = np.array([forced])
        if drafted is None:
            token = self.sampler.sample(logits, self.history, self.generated, allowed)
        else:
            token = speculative_choice(*self.sampler.distribution(logits, self.history, self.generated, allowed), *drafted[1], drafted[0], self.sampler.rng)
        return self._take(token, mask, token_logprobs(raw, token, k) if raw is not None else None)

    def _take(self, token: int, mask: TokenMask | None, logprobs: tuple[float, list[tuple[int, float]]] | None) -> Ending | None:
        """The token is drawn: count it, stream its text, and say whether it ends the request."""
        self.t_last = time.perf_counter()
        self.n_sampled += 1
        if not self.t_first:
            self.t_first = self.t_last
        self.pending = None
        if token in self.context.eog_ids:
            return "stop", True, None
        self.generated.append(token)
        self.history.append(token)
        if mask is not None and not mask.advance(token):
            return "error", True, UserError(mask.error)
        reasoning, text, hit_stop = self._text(self.detok.push(token))
        if self.splitter is not None:
            self._watch_thinking()
        self.emit(token, text, *(logprobs or ()), reasoning=reasoning)
        if hit_stop:
            return "stop", False, None
        if self.splitter is not None and self.splitter.ended:  # harmony's <|return|> or <|call|>, written as text
            return "stop", True, None
        if self.mask is not None and self.mask.finished:  # the grammar is complete: only end of generation may follow
            return "stop", True, None
        if self.params.max_tokens is not None and len(self.generated) >= self.params.max_tokens:
            return "length", True, None
        if self.n_cells + 1 >= self.context.n_ctx:
            return "length", True, None
        self.pending = token
        return None

    def _watch_thinking(self) -> None:
        """Note where the think block closed, and close it for the model once its budget of
        tokens is spent (the tags count: they are the model's tokens too)."""
        splitter, budget = self.splitter, self.params.think_budget
        if splitter.closed and not self.reasoning_end:  # type: ignore[union-attr]
            self.reasoning_end = len(self.generated)
        elif splitter.can_close and budget is not None and len(self.generated) >= budget and not self.forced:  # type: ignore[union-attr]
            self.forced.extend(self.context.budget_close)

    # --- text and events -----------------------------------------------------------------
    def _text(self, piece: str, final: bool = False) -> tuple[str, str, bool]:
        """New text as (thinking, answer safe to emit, whether a stop string was hit): a
        reasoning model's thinking is split off first, so stops apply to the answer."""
        if self.splitter is None:
            reasoning, answer = "", piece
        else:
            reasoning, answer = self.splitter.push(piece)
            if final:
                held_reasoning, held_answer = self.splitter.flush()
                reasoning, answer = reasoning + held_reasoning, answer + held_answer
        text, hit_stop = self.stops.push(answer)
        if final and not hit_stop:
            text += self.stops.flush()
        return reasoning, text, hit_stop

    def emit(self, token: int, text: str, logprob: float | None = None, top: list[tuple[int, float]] | None = None, reasoning: str = "") -> None:
        if text:
            self.text.append(text)
        if reasoning:
            self.reasoning.append(reasoning)
        self.stream.put(TokenEvent(self.request_id, token, text, logprob, top, reasoning))

    def flush(self) -> None:
        """Emit the text held back (a partial character, a possible stop string's start)."""
        reasoning, tail, _ = self._text(self.detok.flush(), final=True)
        if tail or reasoning:
            self.emit(-1, tail, reasoning=reasoning)

    def output(self, reason: str, error: Exception | None = None) -> CompletionOutput:
        """The request's result, as its stream's last event."""
        return CompletionOutput(
            request_id=self.request_id,
            text="".join(self.text),
            finish_reason=reason,
            prompt_tokens=len(self.prompt) + extra_cells(self.media, len(self.prompt)),  # an image's tokens, however it moves the position
            completion_tokens=len(self.generated),
            timings=self.timings(),
            tokens=list(self.generated),
            seed=int(self.params.seed or 0),
            error=error,
            cached_tokens=self.cached_tokens,
            cached_from=dict(self.cached_from),
            reasoning="".join(self.reasoning),
            reasoning_tokens=self.reasoning_end or (len(self.generated) if self.thinking else 0),
            stop_sequence=self.stops.hit,
        )

    def timings(self) -> Timings:
        n_decode = self.n_sampled - 1  # decode steps after the first token
        tpot = (self.t_last - self.t_first) * 1e3 / n_decode if n_decode > 0 else 0.0
        return Timings(
            load_ms=self.context.load_ms,
            prompt_ms=self.prompt_ms,
            ttft_ms=(self.t_first - self.t_submit) * 1e3 if self.t_first else 0.0,
            tpot_ms=tpot,
            tokens_per_s=1e3 / tpot if tpot else 0.0,
            prompt_tokens_per_s=(len(self.prompt) - self.cached_tokens) * 1e3 / self.prompt_ms if self.prompt_ms else 0.0,
            **(self.spec.counts() if self.spec else {}),
            tokens_per_forward=(self.n_sampled - 1) / self.n_forwards if self.n_forwards else 0.0,
        )
