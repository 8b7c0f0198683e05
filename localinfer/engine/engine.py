"""The engine: owns the decode loop for every backend.

One `step()` is schedule -> forward -> sample -> update, as in vLLM, run in-process:
prefill one waiting request, then decode every running request in one batched forward.
The CLI, the TUI and the server are thin clients of this object.
"""

from __future__ import annotations

import secrets
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np

from localinfer.backends.base import Backend, Batch
from localinfer.engine.detokenize import StreamDetokenizer
from localinfer.engine.sampler import Sampler
from localinfer.engine.stops import StopMatcher
from localinfer.engine.templates import Message, render_chat
from localinfer.engine.types import CompletionOutput, SamplingParams, Timings, TokenEvent
from localinfer.errors import ContextOverflow, UserError

Event = TokenEvent | CompletionOutput


@dataclass
class _Sequence:
    """A request in flight: its tokens, its place in the KV cache, and its clocks."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    sampler: Sampler
    detok: StreamDetokenizer
    stops: StopMatcher
    history: list[int]  # prompt + generated, for the repetition penalty
    seq_id: int = -1
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


class Engine:
    def __init__(self, backend: Backend, defaults: SamplingParams | None = None, load_ms: float = 0.0) -> None:
        self.backend = backend
        self.defaults = defaults or SamplingParams()
        self.load_ms = load_ms
        self.name = str(backend.facts.path.name)  # set by the loader to the reference used
        self.info: object | None = None  # the GGUFInfo the loader read, if any
        self.memory: object | None = None  # the loader's MemoryPlan, if any
        self._next_id = 0
        self._free_slots = list(range(backend.facts.n_seq_max - 1, -1, -1))  # KV-cache sequence ids
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[int, _Sequence] = {}
        self._outbox: dict[int, deque[Event]] = {}

    @property
    def n_ctx(self) -> int:
        return self.backend.facts.n_ctx

    # --- prompts -------------------------------------------------------------------
    def render_chat(self, messages: list[Message], add_generation_prompt: bool = True) -> str:
        v = self.backend.vocab
        return render_chat(
            self.backend.facts.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=v.bos_text,
            eos_token=v.eos_text,
        )

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens for a prompt, with BOS where the model wants it but never twice."""
        v = self.backend.vocab
        add_bos = v.add_bos and not (v.bos_text and text.startswith(v.bos_text))
        tokens = self.backend.tokenize(text, add_special=add_bos, parse_special=True)
        if not tokens and v.bos_id is not None:
            tokens = [v.bos_id]
        return tokens

    # --- requests ------------------------------------------------------------------
    def submit(self, prompt_tokens: list[int], params: SamplingParams | None = None) -> int:
        """Queue a request; its events come out of step()."""
        params = params or self.defaults
        if params.seed is None or params.seed < 0:  # -1 is llama.cpp's and Ollama's "random"
            params = replace(params, seed=secrets.randbits(32))
        if not prompt_tokens:
            raise UserError("the prompt is empty")
        if len(prompt_tokens) >= self.n_ctx:
            raise ContextOverflow(
                f"the prompt is {len(prompt_tokens)} tokens but the context holds {self.n_ctx}; "
                f"raise --ctx (this model was trained on {self.backend.facts.n_ctx_train})"
            )
        rid = self._next_id
        self._next_id += 1
        seq = _Sequence(
            request_id=rid,
            prompt=list(prompt_tokens),
            params=params,
            sampler=Sampler(params),
            detok=StreamDetokenizer(self.backend.token_bytes),
            stops=StopMatcher(params.stop),
            history=list(prompt_tokens),
            t_submit=time.perf_counter(),
        )
        self._waiting.append(seq)
        self._outbox[rid] = deque()
        return rid

    def abort(self, request_id: int) -> None:
        """Stop a request now (Ctrl-C, a client that went away) and free its KV cache."""
        self._waiting = deque(s for s in self._waiting if s.request_id != request_id)
        seq = self._running.pop(request_id, None)
        if seq is not None:
            self._release(seq)
        self._outbox.pop(request_id, None)

    def has_work(self) -> bool:
        return bool(self._waiting or self._running)

    # --- the loop ------------------------------------------------------------------
    def step(self) -> None:
        """One iteration: prefill at most one waiting request, then decode all the others."""
        decoding = [s for s in self._running.values() if s.pending is not None]
        if self._waiting and self._free_slots:
            seq = self._waiting.popleft()
            seq.seq_id = self._free_slots.pop()
            self._running[seq.request_id] = seq
            seq.t_prefill = time.perf_counter()
            logits = self.backend.forward(Batch.for_sequence(seq.prompt, 0, seq.seq_id))  # [1, vocab]
            seq.n_past = len(seq.prompt)
            seq.prompt_ms = (time.perf_counter() - seq.t_prefill) * 1e3
            self._accept(seq, logits[0])
        if decoding:
            batch = Batch(
                tokens=np.array([s.pending for s in decoding], dtype=np.int32),
                positions=np.array([s.n_past for s in decoding], dtype=np.int32),
                seq_ids=np.array([s.seq_id for s in decoding], dtype=np.int32),
                want_logits=np.ones(len(decoding), dtype=bool),
            )
            logits = self.backend.forward(batch)  # [n_running, vocab]
            for row, seq in enumerate(decoding):
                seq.n_past += 1
                self._accept(seq, logits[row])

    def _accept(self, seq: _Sequence, logits: np.ndarray) -> None:
        """Sample the next token of a sequence and decide whether it is finished."""
        token = seq.sampler.sample(logits, seq.history)
        seq.t_last = time.perf_counter()
        seq.n_sampled += 1
        if not seq.t_first:
            seq.t_first = seq.t_last
        seq.pending = None
        if token in self.backend.vocab.eog_ids:
            return self._finish(seq, "stop")
        seq.generated.append(token)
        seq.history.append(token)
        text, hit_stop = seq.stops.push(seq.detok.push(token))
        self._emit(seq, token, text)
        if hit_stop:
            return self._finish(seq, "stop", flush=False)
        if seq.params.max_tokens is not None and len(seq.generated) >= seq.params.max_tokens:
            return self._finish(seq, "length")
        if seq.n_past + 1 >= self.n_ctx:
            return self._finish(seq, "length")
        seq.pending = token

    def _emit(self, seq: _Sequence, token: int, text: str) -> None:
        if text:
            seq.text.append(text)
        self._outbox[seq.request_id].append(TokenEvent(seq.request_id, token, text))

    def _finish(self, seq: _Sequence, reason: str, flush: bool = True) -> None:
        if flush:
            tail, _ = seq.stops.push(seq.detok.flush())
            tail += seq.stops.flush()
            if tail:
                self._emit(seq, -1, tail)
        self._running.pop(seq.request_id, None)
        self._release(seq)
        self._outbox[seq.request_id].append(
            CompletionOutput(
                request_id=seq.request_id,
                text="".join(seq.text),
                finish_reason=reason,
                prompt_tokens=len(seq.prompt),
                completion_tokens=len(seq.generated),
                timings=self._timings(seq),
                tokens=list(seq.generated),
                seed=int(seq.params.seed or 0),
            )
        )

    def _release(self, seq: _Sequence) -> None:
        if seq.seq_id >= 0:
            self.backend.kv_clear(seq.seq_id)
            self._free_slots.append(seq.seq_id)
            seq.seq_id = -1

    def _timings(self, seq: _Sequence) -> Timings:
        n_decode = seq.n_sampled - 1  # decode steps after the first token
        tpot = (seq.t_last - seq.t_first) * 1e3 / n_decode if n_decode > 0 else 0.0
        return Timings(
            load_ms=self.load_ms,
            prompt_ms=seq.prompt_ms,
            ttft_ms=(seq.t_first - seq.t_submit) * 1e3,
            tpot_ms=tpot,
            tokens_per_s=1e3 / tpot if tpot else 0.0,
            prompt_tokens_per_s=len(seq.prompt) * 1e3 / seq.prompt_ms if seq.prompt_ms else 0.0,
        )

    # --- conveniences for clients -----------------------------------------------------
    def generate(self, prompt_tokens: list[int], params: SamplingParams | None = None) -> Iterator[Event]:
        """Stream one request: TokenEvents, then its CompletionOutput. Closing the
        iterator early (Ctrl-C, a dropped client) aborts the request and frees its cache."""
        rid = self.submit(prompt_tokens, params)
        done = False
        try:
            while not done:
                box = self._outbox.get(rid)
                if not box:
                    self.step()
                    continue
                event = box.popleft()
                done = isinstance(event, CompletionOutput)
                yield event
        finally:
            if done:
                self._outbox.pop(rid, None)
            else:
                self.abort(rid)

    def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Iterator[Event]:
        return self.generate(self.tokenize_prompt(self.render_chat(messages)), params)

    def complete(self, prompt_tokens: list[int], params: SamplingParams | None = None) -> CompletionOutput:
        """Run a request to the end and return only its result."""
        for event in self.generate(prompt_tokens, params):
            if isinstance(event, CompletionOutput):
                return event
        raise AssertionError("generate() ended without a CompletionOutput")

    def close(self) -> None:
        self.backend.close()
