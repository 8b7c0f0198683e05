"""Plain dataclasses the engine exchanges with its clients (CLI, TUI, server), and the
ranges of the sampling values they may send (SAMPLING)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, replace
from typing import Literal, Union

from localinfer.engine.constraints import Constraint
from localinfer.errors import UserError


Effort = Literal["low", "medium", "high"]  # how hard a reasoning model thinks (gpt-oss's reasoning_effort)
EFFORTS: tuple[Effort, ...] = ("low", "medium", "high")
# What a client asks of a reasoning model: think first (True, the default) or not (False), or
# think this hard (an Effort, for templates that read `reasoning_effort`; on for the rest).
Think = Union[bool, Effort]


@dataclass(frozen=True)
class EngineChoice:
    """The backend that runs a model, and why: --verbose, --json, /v1/models and doctor say it."""

    name: str
    reason: str


@dataclass(frozen=True)
class SamplingParams:
    """How to pick each next token. Defaults are llama.cpp's; a catalog entry may override them."""

    temperature: float = 0.8  # 0 means greedy
    top_k: int = 40  # 0 disables
    top_p: float = 0.95  # 1 disables
    min_p: float = 0.05  # 0 disables
    repeat_penalty: float = 1.0  # 1 disables
    repeat_last_n: int = 64
    presence_penalty: float = 0.0  # OpenAI's: subtracted once from every token already generated
    frequency_penalty: float = 0.0  # OpenAI's: subtracted per time a token was generated
    seed: int | None = None  # None or -1: a fresh random seed per request, reported in the result
    max_tokens: int | None = None  # None: until end of generation or a full context
    logprobs: int | None = None  # None: none; k >= 0: each token's log-probability and the k most likely
    stop: tuple[str, ...] = ()
    ignore_eos: bool = False  # never end at an end-of-generation token (benchmarks: a fixed answer length)
    constraint: Constraint | None = None  # structured output: the answer must match this schema, regex or grammar
    think_budget: int | None = None  # reasoning models: most thinking tokens before the engine closes the block itself
    draft_max: int | None = None  # most tokens drafted a step for this request (0: no speculation); None: the engine's
    reasoning: bool = True  # split a reasoning model's thinking from its answer (a raw text completion: not)

    def with_overrides(self, **changes: object) -> SamplingParams:
        """A copy with the given fields replaced; None values mean "keep"."""
        return replace(self, **{k: v for k, v in changes.items() if v is not None})


class BadSamplingValue(UserError):
    """A sampling value out of its range, or not a finite number: the message says which
    range ("must be between 0 and 1, not 1.5"), and its caller names the setting."""


def number(value: float) -> str:
    """A number as a message shows it: a whole one in full, any other short (0.95, 1e+30)."""
    return str(value) if isinstance(value, int) else f"{value:g}"


# The largest count (tokens, top-k, a window) we take: llama.cpp's int32, and far past any context.
MAX_COUNT = 2**31 - 1


@dataclass(frozen=True)
class Bounds:
    """The values one sampling setting takes: its type and a closed range (high None: no
    upper end). Every float is also finite: inf and NaN mean nothing to a sampler."""

    kind: type  # int or float
    low: float
    high: float | None = None

    def check(self, value: float) -> float:
        """`value`, if it is finite and in range; BadSamplingValue says why not."""
        if not math.isfinite(value):
            raise BadSamplingValue(f"must be a finite number, not {value}")
        if self.high is None and not value >= self.low:
            raise BadSamplingValue(f"must be at least {number(self.low)}, not {number(value)}")
        if self.high is not None and not self.low <= value <= self.high:
            raise BadSamplingValue(f"must be between {number(self.low)} and {number(self.high)}, not {number(value)}")
        return value

    def parse(self, text: str) -> float:
        """A value typed as text (`/set top_p 0.9`, the chat app's settings), checked."""
        try:
            value = self.kind(text.strip())
        except ValueError:
            raise BadSamplingValue(f"'{text}' is not {'a whole number' if self.kind is int else 'a number'}") from None
        return self.check(value)


# What each sampling setting accepts, by its SamplingParams name: the one table the command
# line's options, interactive `/set`, the chat app's settings and every API dialect's
# fields check against (a dialect may narrow a range: OpenAI's temperature stops at 2).
SAMPLING: dict[str, Bounds] = {
    "temperature": Bounds(float, 0),
    "top_k": Bounds(int, 0, MAX_COUNT),
    "top_p": Bounds(float, 0, 1),
    "min_p": Bounds(float, 0, 1),
    "repeat_penalty": Bounds(float, 0.01),
    "repeat_last_n": Bounds(int, -1, MAX_COUNT),
    "presence_penalty": Bounds(float, -2, 2),
    "frequency_penalty": Bounds(float, -2, 2),
    "seed": Bounds(int, -1, 2**64 - 1),  # -1: pick one; at most a uint64, the widest seed any engine takes
    "max_tokens": Bounds(int, 1, MAX_COUNT),
}


def sampling_value(name: str, text: str) -> float:
    """Parse and check one sampling setting given as text; BadSamplingValue says why not."""
    return SAMPLING[name].parse(text)


@dataclass
class Timings:
    """Per-request latency, in the seeds' vocabulary: TTFT = queue + prefill + first sample,
    TPOT = mean time per output token after the first."""

    load_ms: float = 0.0
    prompt_ms: float = 0.0  # prefill alone
    ttft_ms: float = 0.0
    tpot_ms: float = 0.0
    tokens_per_s: float = 0.0  # decode rate, 1000 / TPOT
    prompt_tokens_per_s: float = 0.0
    drafted: int = 0  # speculation: tokens drafted, by either source
    accepted: int = 0  # ... and kept (acceptance rate = accepted / drafted)
    lookup_drafted: int = 0  # of those, prompt lookup's
    lookup_accepted: int = 0
    model_drafted: int = 0  # ... and the draft model's
    model_accepted: int = 0
    tokens_per_forward: float = 0.0  # tokens sampled after the first, per decode forward (1 without speculation)

    def by_source(self) -> list[tuple[str, int, int]]:
        """(source, drafted, accepted) for the draft model and prompt lookup."""
        return [("model", self.model_drafted, self.model_accepted), ("lookup", self.lookup_drafted, self.lookup_accepted)]

    def as_dict(self) -> dict[str, float]:
        return {k: round(v, 3) for k, v in asdict(self).items()}


@dataclass
class TokenEvent:
    """One step of a stream: new text (possibly empty while a character or a stop is pending)."""

    request_id: int
    token: int
    text: str  # the answer's
    logprob: float | None = None  # log-probability of `token` under the model's own distribution
    top_logprobs: list[tuple[int, float]] | None = None  # the k most likely tokens at this position
    reasoning: str = ""  # a reasoning model's thinking (never in `text`)


@dataclass
class CompletionOutput:
    """What a finished request produced."""

    request_id: int
    text: str
    finish_reason: str  # "stop" (end of generation or stop string), "length", "abort", or "error"
    prompt_tokens: int
    completion_tokens: int
    timings: Timings = field(default_factory=Timings)
    tokens: list[int] = field(default_factory=list)
    seed: int = 0  # the sampler's seed, the one picked for the request if none was asked for
    error: Exception | None = None  # why a request with finish_reason "error" failed
    cached_tokens: int = 0  # prompt tokens reused from the KV cache (prefix reuse), not prefilled
    cached_from: dict[str, int] = field(default_factory=dict)  # those tokens by source: slot, ram, disk
    reasoning: str = ""  # a reasoning model's thinking, apart from the answer in `text`
    reasoning_tokens: int = 0  # of completion_tokens, those that were thinking (the tags included)
    stop_sequence: str | None = None  # the stop string that ended the answer, if one did

    def raise_error(self) -> None:
        """Raise what failed this request, if anything did (clients that want an exception)."""
        if self.error is not None:
            raise self.error

    def usage(self) -> dict[str, object]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},  # as OpenAI reports it
            "completion_tokens_details": {"reasoning_tokens": self.reasoning_tokens},
        }
