"""The engine: owns the decode loop for every backend.

One `step()` is schedule -> forward -> sample -> update, as in vLLM: every running request
decodes one token and waiting prompts are prefilled in chunks of at most `prefill_chunk`
tokens, all in one batched forward, so a long new prompt never freezes the streams already
running. While others decode, a chunk is also cut to a time budget (budget.py), so that a
step carrying prompt tokens stays within a few decode steps' time. The CLI, the TUI and the
server are thin clients of this object.

One owner. Only the thread that runs `step()` touches the backend and the scheduler's
state. Without `start()` that is whoever calls `generate()` (the CLI); after `start()` it
is the engine's own thread. Either way, `submit()` and `abort()` may be called from any
thread: they become messages that the owner applies at the top of its next step.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np

from localinfer.backends.base import Backend, Batch
from localinfer.engine.budget import DEFAULT_SLOWDOWN, PrefillBudget
from localinfer.engine.constraints import GrammarVocab, TokenMask
from localinfer.engine.detokenize import StreamDetokenizer
from localinfer.engine.draft_model import DraftModel, Proposal
from localinfer.engine.drafting import Drafting, RequestDrafts
from localinfer.engine.filewatch import ModelFileWatch
from localinfer.engine.reasoning import BUDGET_CLOSE, ReasoningSplitter, ThinkSyntax
from localinfer.engine.prefix import common_prefix
from localinfer.engine.prompt_cache import PromptCache
from localinfer.engine.sampler import Sampler
from localinfer.engine.speculative import DraftConfig, speculative_choice
from localinfer.engine.stops import StopMatcher
from localinfer.engine.stream import Event, RequestStream
from localinfer.engine.templates import Message, render_chat
from localinfer.engine.types import CompletionOutput, EngineChoice, SamplingParams, Timings, TokenEvent
from localinfer.errors import BackendError, BackendLost, ContextOverflow, UserError
from localinfer.memory import MemoryPlan, kv_cache_bytes
from localinfer.modelfile import GGUFInfo

DEFAULT_PREFILL_CHUNK = 512
MAX_BACKLOG = 256  # unread events after which a request waits for its reader
Ending = tuple[str, bool, "Exception | None"]  # how a request ends: _finish's reason, flush, error


@dataclass
class _Sequence:
    """A request in flight: its tokens, its place in the KV cache, and its clocks."""

    request_id: int
    prompt: list[int]
    params: SamplingParams
    sampler: Sampler
    detok: StreamDetokenizer
    stops: StopMatcher
    stream: RequestStream
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
    cached_tokens: int = 0  # prompt tokens found in the KV cache, not prefilled again
    cached_from: dict[str, int] = field(default_factory=dict)  # those tokens by where they came from: slot, ram, disk
    block_keys: list[str] = field(default_factory=list)  # the prompt cache's keys of its whole blocks so far
    blocks_stored: int = 0  # of those, how many the prompt cache has been given
    tail_stored: bool = False  # the prompt's last, partial block given (or put back) too
    spec: RequestDrafts | None = None  # its speculation, when the engine drafts (drafting.py)
    mask: TokenMask | None = None  # structured output: the grammar's state
    n_forwards: int = 0  # decode forwards this request took part in (tokens per forward = answer / this)
    splitter: ReasoningSplitter | None = None  # a reasoning model's: thinking apart from the answer
    reasoning: list[str] = field(default_factory=list)
    reasoning_end: int = 0  # answer tokens up to the one that closed the think block (0: none closed)
    forced: deque[int] = field(default_factory=deque)  # tokens the engine writes itself (a thinking budget's close)

    @property
    def prefilling(self) -> bool:
        return self.n_past < len(self.prompt)


def token_logprobs(logits: np.ndarray, token: int, k: int) -> tuple[float, list[tuple[int, float]]]:
    """log softmax of the model's own logits (before penalties and temperature, as OpenAI
    and vLLM report them): the chosen token's value and the k largest."""
    m = float(logits.max())
    lse = m + float(np.log(np.exp(logits - m, dtype=np.float64).sum()))
    top = np.argpartition(logits, -k)[-k:] if 0 < k < len(logits) else np.arange(len(logits) if k else 0)
    top = top[np.argsort(-logits[top], kind="stable")]
    return float(logits[token]) - lse, [(int(t), float(logits[t]) - lse) for t in top]


@dataclass
class StepStats:
    """What the last step() did: for tests and metrics, so chunking is checked through the
    engine, not a timer."""

    decoded: int = 0  # sequences that decoded one token
    prefilled: dict[int, int] = field(default_factory=dict)  # request id -> prompt tokens prefilled


class Engine:
    def __init__(self, backend: Backend, *, slots: int = 1, defaults: SamplingParams | None = None, load_ms: float = 0.0, prefill_chunk: int = DEFAULT_PREFILL_CHUNK,
                 decode_slowdown: float = DEFAULT_SLOWDOWN, draft: DraftConfig | None = None, drafter: DraftModel | None = None, name: str | None = None,
                 info: GGUFInfo | None = None, memory: MemoryPlan | None = None, choice: EngineChoice | None = None, warnings: list[str] | None = None,
                 prompt_cache: PromptCache | None = None) -> None:  # fmt: skip
        """`slots`: sequences decoded at once, each a KV-cache sequence id below the
        n_seq_max the backend was loaded with. `draft`: speculation's settings (None: none);
        `drafter`: a draft model beside prompt lookup. `name`: the reference the model was opened
        by (default: its file's name); `info`, `memory` and `choice`: what the loader read,
        planned and chose, for reports; `warnings`, what it warns of (the memory plan's, a
        draft model it could not use). `prompt_cache`: KV blocks kept across requests and
        restarts (prompt_cache.py); None: only what the slots hold is reused."""
        self.backend = backend
        self.prompt_cache = prompt_cache
        self.defaults = defaults or SamplingParams()
        self.load_ms = load_ms
        self.prefill_chunk = max(1, prefill_chunk)
        self.budget = PrefillBudget(decode_slowdown)  # sizes chunks by time while others decode; see budget.py
        self.name = name or backend.facts.path.name
        self.info, self.memory, self.choice = info, memory, choice
        self.warnings = list(warnings if warnings is not None else memory.warnings if memory is not None else [])
        self.last_step = StepStats()
        self._ids = itertools.count()
        self._free_slots = list(range(slots - 1, -1, -1))  # KV-cache sequence ids
        self._slot_tokens: list[list[int]] = [[] for _ in range(slots)]  # what each slot's cache holds
        self._waiting: deque[_Sequence] = deque()
        self._running: dict[int, _Sequence] = {}
        self._inbox: deque[tuple[str, object]] = deque()  # ("submit", seq) | ("abort", request id) | ("call", (fn, future))
        self._calls: deque[tuple[object, concurrent.futures.Future]] = deque()  # work that needs a free slot (embeddings)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        # Speculation (None: none). Its costs are measured once, by the owner thread (start() has
        # its thread do it at once): measured on another thread, they would leave that thread's
        # OpenMP team spinning beside the owner's, and every later forward slower.
        self.drafting = Drafting(draft, backend, drafter) if draft is not None else None
        self._eog = np.array(sorted(backend.vocab.eog_ids), dtype=np.intp)
        self._watch = ModelFileWatch(backend.facts.path)
        self.broken: str | None = None  # why the model can no longer run (its file was truncated)
        self._grammar_vocab: GrammarVocab | None = None  # built when a request first asks for structured output
        self._grammar_lock = threading.Lock()
        self.think = ThinkSyntax.detect(backend.facts.chat_template, lambda tag: backend.tokenize(tag, add_special=False, parse_special=True))

    @property
    def draft(self) -> DraftConfig | None:
        """Speculation's settings; None: the engine does not speculate."""
        return self.drafting.config if self.drafting is not None else None

    @property
    def drafter(self) -> DraftModel | None:
        """The draft model, if speculation has one."""
        return self.drafting.drafter if self.drafting is not None else None

    @property
    def n_ctx(self) -> int:
        """Tokens one request may hold: prompt and answer together."""
        return self.backend.facts.n_ctx

    # --- prompts -------------------------------------------------------------------
    def render_chat(self, messages: list[Message], add_generation_prompt: bool = True, tools: list[dict] | None = None, think: bool = True) -> str:
        """The prompt for a conversation. A reasoning model thinks first unless `think` is
        False: its template's `enable_thinking` off, or where the template opens the think
        block itself and cannot, the block closed right after it opens."""
        v, syntax = self.backend.vocab, self.think
        prompt = render_chat(
            self.backend.facts.chat_template,
            messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=v.bos_text,
            eos_token=v.eos_text,
            tools=tools,
            enable_thinking=think if syntax is not None else None,
        )
        if syntax is not None and not think and add_generation_prompt and syntax.starts_open(prompt):
            prompt += syntax.close + "\n\n"
        return prompt

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens for a prompt, with BOS where the model wants it but never twice."""
        v = self.backend.vocab
        add_bos = v.add_bos and not (v.bos_text and text.startswith(v.bos_text))
        tokens = self.backend.tokenize(text, add_special=add_bos, parse_special=True)
        if not tokens and v.bos_id is not None:
            tokens = [v.bos_id]
        return tokens

    # --- requests (any thread) ------------------------------------------------------
    def submit(self, prompt_tokens: list[int], params: SamplingParams | None = None) -> RequestStream:
        """Queue a request; its events arrive on the returned stream."""
        if self._closed or self.broken:
            raise BackendError(self.broken or "the engine is closed")
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
        mask = self.grammar_vocab().matcher(params.constraint) if params.constraint is not None else None  # a bad one fails here, not mid-stream
        rid = next(self._ids)  # atomic: safe from any thread
        stream = RequestStream(rid)
        seq = _Sequence(
            request_id=rid,
            prompt=list(prompt_tokens),
            params=params,
            sampler=Sampler(params),
            detok=StreamDetokenizer(self.backend.token_bytes),
            stops=StopMatcher(params.stop),
            stream=stream,
            history=list(prompt_tokens),
            t_submit=time.perf_counter(),
            mask=mask,
            splitter=self._splitter(prompt_tokens) if params.reasoning else None,
        )
        self._post(("submit", seq))
        return stream

    def _splitter(self, prompt_tokens: list[int]) -> ReasoningSplitter | None:
        """A reasoning model's splitter, started inside the think block if the prompt opens it."""
        if self.think is None:
            return None
        tail = b"".join(self.backend.token_bytes(t) for t in prompt_tokens[-8:]).decode("utf-8", errors="replace")
        return ReasoningSplitter(self.think, inside=self.think.starts_open(tail))

    def grammar_vocab(self) -> GrammarVocab:
        """The vocabulary as the grammar engine sees it, built once (any thread)."""
        with self._grammar_lock:
            if self._grammar_vocab is None:
                self._grammar_vocab = GrammarVocab(self.backend)
            return self._grammar_vocab

    def abort(self, request_id: int) -> None:
        """Stop a request (Ctrl-C, a client that went away): its stream ends with
        finish_reason "abort" and its KV cache is freed, at the owner's next step."""
        self._post(("abort", request_id))

    @property
    def free_slots(self) -> int:
        """KV-cache sequences no request holds (for metrics and tests)."""
        return len(self._free_slots)

    @property
    def kv_cells_used(self) -> int:
        """KV-cache cells holding tokens: the running requests' and the cached prefixes kept for reuse."""
        return sum(len(tokens) for tokens in self._slot_tokens)

    @property
    def cache_types(self) -> tuple[str, str]:
        """The KV cache's K and V types, as the loader planned them."""
        return self.memory.cache_types if self.memory is not None else ("f16", "f16")

    def kv_bytes_used(self) -> int | None:
        """Bytes the KV cells in use hold (None without the model's header to size a cell)."""
        return kv_cache_bytes(self.info, self.kv_cells_used, self.cache_types) if self.info is not None else None

    @property
    def kv_cells_cached(self) -> int:
        """KV-cache cells that free slots keep for prefix reuse (a read from another thread may be a step old)."""
        return sum(len(self._slot_tokens[s]) for s in list(self._free_slots))

    @property
    def kv_cells_total(self) -> int:
        return self.n_ctx * len(self._slot_tokens)

    @property
    def n_running(self) -> int:
        return len(self._running)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting) + sum(1 for kind, _ in list(self._inbox) if kind == "submit")

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._inbox or self._calls)

    def embed(self, tokens: list[int]) -> np.ndarray:
        """One vector for a text: the mean of its tokens' final-norm hidden states,
        L2-normalised, on any backend. Runs on the owner's thread, in a slot of its own,
        so it never races a decode step; from another thread it blocks until done."""
        if not tokens:
            raise UserError("the input is empty")
        if len(tokens) > self.n_ctx:
            raise ContextOverflow(f"the input is {len(tokens)} tokens but the context holds {self.n_ctx}; raise --ctx")
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._post(("call", (lambda: self._embed_now(tokens), future)))
        if self._thread is None:  # the caller is the owner
            self._apply_inbox()
            while not future.done():
                self.step()
        return future.result()

    def _embed_now(self, tokens: list[int]) -> np.ndarray:
        slot = min(self._free_slots, key=lambda s: len(self._slot_tokens[s]))  # the emptiest: least reuse lost
        self._free_slots.remove(slot)
        total = np.zeros(self.backend.facts.n_embd, dtype=np.float64)
        try:
            self._slot_tokens[slot] = []
            self.backend.kv_clear(slot)
            for start in range(0, len(tokens), self.prefill_chunk):
                part = tokens[start : start + self.prefill_chunk]
                total += self.backend.embed(Batch.for_sequence(part, start, slot, all_logits=True)).sum(axis=0, dtype=np.float64)
        finally:
            self.backend.kv_clear(slot)
            self._free_slots.append(slot)
        mean = total / len(tokens)
        return (mean / (np.linalg.norm(mean) or 1.0)).astype(np.float32)

    def _run_calls(self) -> None:
        while self._calls and self._free_slots:
            fn, future = self._calls.popleft()
            try:
                future.set_result(fn())  # type: ignore[operator]
            except Exception as e:  # noqa: BLE001 - the caller gets it from the future
                future.set_exception(e)

    def _post(self, message: tuple[str, object]) -> None:
        with self._wake:
            self._inbox.append(message)
            self._wake.notify()
        if self._thread is None and message[0] == "abort":
            self._apply_inbox()  # no engine thread: the caller is the owner, free the cache now

    # --- the loop (the owner's thread) ------------------------------------------------
    def step(self) -> None:
        """One iteration: apply messages, admit waiting requests to free slots, then one
        forward of every decoding request's next token plus up to `prefill_chunk` prompt tokens."""
        t0 = time.perf_counter()  # the whole step is what a running stream waits between tokens
        self._apply_inbox()
        if self.broken or (self._running or self._waiting or self._calls) and self._check_file():
            return
        if (self.drafting is not None and self.drafting.verify_cost is None and len(self._free_slots) == len(self._slot_tokens)
                and (not self._waiting or any(self.drafting.may_draft(seq.params) for seq in self._waiting))):
            self._calibrate()
        self._run_calls()
        while self._waiting and self._free_slots:
            seq = self._waiting.popleft()
            seq.t_prefill = time.perf_counter()
            if self.drafting is not None:
                seq.spec = self.drafting.admit(seq.params)
            self._place(seq)
            self._running[seq.request_id] = seq
        stats = StepStats()
        rows: list[tuple[_Sequence, list[int], int, int]] = []  # (seq, tokens, start position, rows wanting logits)
        decoding = [seq for seq in self._running.values() if seq.pending is not None and seq.stream.backlog < MAX_BACKLOG]
        stats.decoded = len(decoding)
        tokens, seconds = self.prefill_chunk, self.budget.seconds(decoding=bool(decoding))
        for seq in self._running.values():
            if seq.prefilling and tokens > 0 and (seconds > 0 or not stats.prefilled):
                n = self.budget.take(seq.n_past, min(tokens, len(seq.prompt) - seq.n_past), seconds)
                chunk = seq.prompt[seq.n_past : seq.n_past + n]
                rows.append((seq, chunk, seq.n_past, int(seq.n_past + n == len(seq.prompt))))
                stats.prefilled[seq.request_id] = n
                tokens, seconds = tokens - n, seconds - self.budget.cost(seq.n_past, n)
        drafts = self.drafting.drafts(decoding, rows, self.n_ctx) if self.drafting is not None and self.drafting.verify_cost is not None else {}
        fed = [[seq.pending, *drafts.get(seq.request_id, ())] for seq in decoding]
        rows[:0] = [(seq, tokens, seq.n_past, len(tokens)) for seq, tokens in zip(decoding, fed)]  # decode rows first, as stats.decoded counts them
        self.last_step = stats
        if rows:
            self._forward(rows)
            chunks = [(start, len(part)) for seq, part, start, _ in rows[stats.decoded :]]
            self.budget.observe(time.perf_counter() - t0, stats.decoded, chunks)

    def _check_file(self) -> bool:
        """Before the next forward touches the mapped weights: has the file been truncated?
        If so every request ends with that error, and new ones are refused."""
        problem = self._watch.problem()
        if problem:
            self._break(BackendError(problem))
        return self.broken is not None

    def _break(self, error: BackendError) -> None:
        """The model cannot run any more (its file truncated, its engine's process gone):
        every request ends with that error, and new ones are refused with it."""
        self.broken = str(error)
        for seq in [*self._running.values(), *self._waiting]:
            self._finish(seq, "error", flush=False, error=error)
        self._waiting.clear()
        while self._calls:
            self._calls.popleft()[1].set_exception(error)

    def _place(self, seq: _Sequence) -> None:
        """Prefix reuse. A finished request leaves its cache in its slot; a new request takes
        the free slot whose cache shares the longest prefix with its prompt, which is cut to
        that prefix, so only the rest is prefilled (the second turn of a chat does not
        recompute the first). If a busy slot holds a longer prefix (a long system prompt
        shared by many requests), it is copied with kv_copy instead of recomputed."""
        limit = len(seq.prompt) - 1  # at least one token is fed, for the logits of the next
        prefix = {s: common_prefix(tokens, seq.prompt, limit) for s, tokens in enumerate(self._slot_tokens)}
        slot = max(self._free_slots, key=lambda s: (prefix[s], -len(self._slot_tokens[s])))
        self._free_slots.remove(slot)
        reuse = prefix[slot]
        donor = max((r.seq_id for r in self._running.values()), key=prefix.__getitem__, default=None)
        shared = prefix[donor] if donor is not None else 0
        if shared > reuse:
            self.backend.kv_clear(slot)
            reuse = self.backend.kv_copy(donor, slot, shared)  # type: ignore[arg-type]
            self._slot_tokens[slot] = seq.prompt[:reuse]
        else:
            reuse = self.backend.kv_truncate(slot, reuse)
            del self._slot_tokens[slot][reuse:]
        seq.seq_id, seq.cached_from = slot, {"slot": reuse} if reuse else {}
        if self.prompt_cache is not None and self.prompt_cache.ready:
            reuse = self._restore(seq, reuse, limit)
        seq.n_past = seq.cached_tokens = reuse

    def _restore(self, seq: _Sequence, reuse: int, limit: int) -> int:
        """Put back the prompt cache's blocks past what the slot holds: the slot keeps its
        whole blocks, the rest comes from the cache, block by block, while the chain of keys
        holds. Returns the prompt tokens the slot then holds."""
        cache, slot = self.prompt_cache, seq.seq_id
        assert cache is not None
        block = cache.block
        seq.block_keys = cache.keys(seq.prompt[:limit])
        first, found = reuse // block, []
        for key in seq.block_keys[reuse // block :]:
            if (got := cache.get(key)) is None:
                break
            found.append((key, *got))
        tail = seq.prompt[len(seq.block_keys) * block : limit]  # after the last whole block: the partial one
        if tail and first + len(found) == len(seq.block_keys) and (got := cache.get(key := cache.tail(seq.block_keys, tail))) is not None:
            found.append((key, *got))
        if min(limit, (first + len(found)) * block) <= reuse:
            return reuse
        pos = self.backend.kv_truncate(slot, first * block)
        if pos != first * block:  # a cache that cannot resume there (a sliding window let it go)
            self._slot_tokens[slot], seq.cached_from = [], {}
            return 0
        seq.cached_from = {"slot": pos} if pos else {}
        for key, data, tier in found:
            size = min(block, limit - pos)  # the tail's is shorter
            after = self.backend.kv_write(slot, pos, data)
            if after != pos + size:  # bytes this backend does not take: never offered again
                cache.discard(key)
                self.backend.kv_truncate(slot, pos)
                break
            pos = after
            seq.cached_from[tier] = seq.cached_from.get(tier, 0) + size
        self._slot_tokens[slot] = seq.prompt[:pos]
        seq.blocks_stored, seq.tail_stored = pos // block, pos == limit
        return pos

    def _store_blocks(self, seq: _Sequence) -> None:
        """Give the prompt cache the whole blocks the sequence's slot now holds that it was
        not given yet (prompt and answer alike: the next turn of a chat starts with both)."""
        cache = self.prompt_cache
        if cache is None or not cache.ready or seq.seq_id < 0:
            return
        tokens, block = self._slot_tokens[seq.seq_id], cache.block
        whole = len(tokens) // block
        if whole > seq.blocks_stored:
            seq.block_keys = cache.keys(tokens[: whole * block], seq.block_keys)
            for j in range(seq.blocks_stored, whole):
                if not cache.has(seq.block_keys[j]):
                    cache.put(seq.block_keys[j], block, self.backend.kv_read(seq.seq_id, j * block, (j + 1) * block))
            seq.blocks_stored = whole
        limit = len(seq.prompt) - 1  # what _restore looks for: the prompt but its last token
        start = limit // block * block
        if not seq.tail_stored and start < limit <= len(tokens) and seq.blocks_stored >= limit // block:
            keys = seq.block_keys[: limit // block]
            cache.put(cache.tail(keys, seq.prompt[start:limit]), limit - start, self.backend.kv_read(seq.seq_id, start, limit))
            seq.tail_stored = True

    def _calibrate(self) -> None:
        slot = min(self._free_slots, key=lambda s: len(self._slot_tokens[s]))  # the emptiest: least reuse lost
        self._slot_tokens[slot] = []
        self.drafting.calibrate(slot)  # type: ignore[union-attr]

    def _forward(self, rows: list[tuple[_Sequence, list[int], int, int]]) -> None:
        """One batched forward; if it fails, each sequence alone, so that a failure ends only
        the request it belongs to (with an error event) and never stalls the others."""
        try:
            logits = self.backend.forward(self._batch(rows))
        except BackendLost as e:
            return self._break(e)
        except Exception as e:  # noqa: BLE001 - a failure is a request's outcome, reported on its stream
            if len(rows) == 1:
                return self._finish(rows[0][0], "error", error=e)
            for row in rows:
                if row[0].seq_id >= 0:  # not already ended by an earlier row's failure
                    self._forward([row])
            return
        out = 0
        for seq, tokens, start, n_logits in rows:
            if seq.pending is not None:  # a decode row: the token sampled last step, then any draft
                self._verify(seq, tokens, start, logits[out : out + n_logits])
                out += n_logits
                continue
            seq.n_past += len(tokens)
            self._slot_tokens[seq.seq_id] += tokens
            self._store_blocks(seq)
            if not seq.prefilling:
                seq.prompt_ms = (time.perf_counter() - seq.t_prefill) * 1e3
            if n_logits:
                self._accept(seq, logits[out])
                out += 1

    def _verify(self, seq: _Sequence, fed: list[int], start: int, logits: np.ndarray) -> None:
        """Sample row by row as plain decoding would (a draft model's token by the
        speculative-sampling rule); keep each drafted token that comes out, then roll the
        KV cache back past the first one that did not. The draft is judged before the
        request may finish, so a request's last step counts in its timings."""
        slot, seq.n_forwards = seq.seq_id, seq.n_forwards + 1
        kept, proposals, ending = 0, seq.spec.proposals if seq.spec else None, None
        for row in range(len(fed)):
            kept += 1  # fed[row] is now a valid part of the cache
            seq.n_past = start + kept
            self._slot_tokens[slot].append(fed[row])
            ending = self._sample(seq, logits[row], (fed[row + 1], proposals[row]) if proposals and row + 1 < len(fed) else None)
            if ending is not None or row + 1 == len(fed) or seq.pending != fed[row + 1]:
                break  # finished, the bonus token, or the draft's first miss
        if seq.spec is not None and seq.spec.source is not None and len(fed) > 1:
            seq.spec.source.record(len(fed) - 1, kept - 1)
        if kept < len(fed):
            self.backend.kv_truncate(slot, start + kept)
        if ending is not None:
            self._finish(seq, *ending)

    @staticmethod
    def _batch(rows: list[tuple[_Sequence, list[int], int, int]]) -> Batch:
        return Batch.of_rows((seq.seq_id, chunk, start, n_logits) for seq, chunk, start, n_logits in rows)

    def _apply_inbox(self) -> None:
        while True:
            with self._wake:
                if not self._inbox:
                    return
                kind, payload = self._inbox.popleft()
            if kind == "submit":
                self._waiting.append(payload)  # type: ignore[arg-type]
            elif kind == "call":
                self._calls.append(payload)  # type: ignore[arg-type]
            else:
                self._apply_abort(payload)  # type: ignore[arg-type]

    def _apply_abort(self, request_id: int) -> None:
        seq = self._running.get(request_id)
        if seq is None:
            seq = next((s for s in self._waiting if s.request_id == request_id), None)
            if seq is None:
                return  # already finished
            self._waiting.remove(seq)
        self._finish(seq, "abort", flush=False)

    def _accept(self, seq: _Sequence, logits: np.ndarray) -> None:
        """Sample the next token of a sequence, and finish it if that ends it."""
        if (ending := self._sample(seq, logits)) is not None:
            self._finish(seq, *ending)

    def _sample(self, seq: _Sequence, logits: np.ndarray, drafted: tuple[int, Proposal] | None = None) -> Ending | None:
        """Sample the next token of a sequence and emit it; how the sequence ends, if it
        does (`_finish`'s arguments). `drafted`: the draft model's token for this row and
        the q it came from, kept or replaced by the speculative-sampling rule (prompt
        lookup's drafts need no rule: see speculative.py)."""
        k = seq.params.logprobs
        raw = logits.copy() if k is not None else None  # the sampler edits logits in place
        if seq.params.ignore_eos:
            logits[self._eog] = -np.inf
        thinking = seq.splitter is not None and seq.splitter.thinking
        mask = None if thinking else seq.mask  # a constraint shapes the answer, not the thinking
        allowed = mask.apply(logits) if mask is not None else None  # before every other step of the sampler
        if allowed is not None and not len(allowed):
            return "error", True, UserError(mask.error)  # type: ignore[union-attr]
        if seq.forced:  # the engine writes this token itself: the only one left to draw
            forced = seq.forced.popleft()
            logits.fill(-np.inf)
            logits[forced] = 0.0
            allowed = np.array([forced])
        if drafted is None:
            token = seq.sampler.sample(logits, seq.history, seq.generated, allowed)
        else:
            token = speculative_choice(*seq.sampler.distribution(logits, seq.history, seq.generated, allowed), *drafted[1], drafted[0], seq.sampler.rng)
        seq.t_last = time.perf_counter()
        seq.n_sampled += 1
        if not seq.t_first:
            seq.t_first = seq.t_last
        seq.pending = None
        if token in self.backend.vocab.eog_ids:
            return "stop", True, None
        seq.generated.append(token)
        seq.history.append(token)
        if mask is not None and not mask.advance(token):
            return "error", True, UserError(mask.error)
        reasoning, text, hit_stop = self._text(seq, seq.detok.push(token))
        if seq.splitter is not None:
            self._watch_thinking(seq)
        self._emit(seq, token, text, *(token_logprobs(raw, token, k) if raw is not None else ()), reasoning=reasoning)
        if hit_stop:
            return "stop", False, None
        if seq.mask is not None and seq.mask.finished:  # the grammar is complete: only end of generation may follow
            return "stop", True, None
        if seq.params.max_tokens is not None and len(seq.generated) >= seq.params.max_tokens:
            return "length", True, None
        if seq.n_past + 1 >= self.n_ctx:
            return "length", True, None
        seq.pending = token
        return None

    def _watch_thinking(self, seq: _Sequence) -> None:
        """Note where the think block closed, and close it for the model once its budget of
        tokens is spent (the tags count: they are the model's tokens too)."""
        splitter, budget = seq.splitter, seq.params.think_budget
        if splitter.closed and not seq.reasoning_end:  # type: ignore[union-attr]
            seq.reasoning_end = len(seq.generated)
        elif splitter.thinking and budget is not None and len(seq.generated) >= budget and not seq.forced:  # type: ignore[union-attr]
            seq.forced.extend(self.backend.tokenize(BUDGET_CLOSE, add_special=False, parse_special=True))

    @staticmethod
    def _text(seq: _Sequence, piece: str, final: bool = False) -> tuple[str, str, bool]:
        """New text of a sequence as (thinking, answer safe to emit, whether a stop string was
        hit): a reasoning model's thinking is split off first, so stops apply to the answer."""
        reasoning, answer = seq.splitter.push(piece) if seq.splitter is not None else ("", piece)
        if final and seq.splitter is not None:
            held_reasoning, held_answer = seq.splitter.flush()
            reasoning, answer = reasoning + held_reasoning, answer + held_answer
        text, hit_stop = seq.stops.push(answer)
        if final and not hit_stop:
            text += seq.stops.flush()
        return reasoning, text, hit_stop

    def _emit(self, seq: _Sequence, token: int, text: str, logprob: float | None = None, top: list[tuple[int, float]] | None = None, reasoning: str = "") -> None:
        if text:
            seq.text.append(text)
        if reasoning:
            seq.reasoning.append(reasoning)
        seq.stream.put(TokenEvent(seq.request_id, token, text, logprob, top, reasoning))

    def _finish(self, seq: _Sequence, reason: str, flush: bool = True, error: Exception | None = None) -> None:
        if flush and error is None:
            reasoning, tail, _ = self._text(seq, seq.detok.flush(), final=True)
            if tail or reasoning:
                self._emit(seq, -1, tail, reasoning=reasoning)
        self._running.pop(seq.request_id, None)
        if error is None:
            self._store_blocks(seq)
        self._release(seq, keep_cache=error is None)
        seq.stream.put(
            CompletionOutput(
                request_id=seq.request_id,
                text="".join(seq.text),
                finish_reason=reason,
                prompt_tokens=len(seq.prompt),
                completion_tokens=len(seq.generated),
                timings=self._timings(seq),
                tokens=list(seq.generated),
                seed=int(seq.params.seed or 0),
                error=error,
                cached_tokens=seq.cached_tokens,
                cached_from=dict(seq.cached_from),
                reasoning="".join(seq.reasoning),
                reasoning_tokens=seq.reasoning_end or (len(seq.generated) if seq.splitter is not None and seq.splitter.thinking else 0),
                stop_sequence=seq.stops.hit,
            )
        )

    def _release(self, seq: _Sequence, keep_cache: bool = True) -> None:
        """Give the slot back. Its cache stays for prefix reuse, unless the request failed
        (then what the cache holds is not known, so it is cleared)."""
        if seq.seq_id < 0:
            return
        slot, seq.seq_id = seq.seq_id, -1
        try:
            if not keep_cache:
                self._slot_tokens[slot] = []
                if not self.broken:  # a backend that is gone holds nothing to clear
                    self.backend.kv_clear(slot)
        finally:
            self._free_slots.append(slot)

    def _timings(self, seq: _Sequence) -> Timings:
        n_decode = seq.n_sampled - 1  # decode steps after the first token
        tpot = (seq.t_last - seq.t_first) * 1e3 / n_decode if n_decode > 0 else 0.0
        return Timings(
            load_ms=self.load_ms,
            prompt_ms=seq.prompt_ms,
            ttft_ms=(seq.t_first - seq.t_submit) * 1e3 if seq.t_first else 0.0,
            tpot_ms=tpot,
            tokens_per_s=1e3 / tpot if tpot else 0.0,
            prompt_tokens_per_s=(len(seq.prompt) - seq.cached_tokens) * 1e3 / seq.prompt_ms if seq.prompt_ms else 0.0,
            **(seq.spec.counts() if seq.spec else {}),
            tokens_per_forward=(seq.n_sampled - 1) / seq.n_forwards if seq.n_forwards else 0.0,
        )

    # --- the engine's own thread --------------------------------------------------------
    def start(self) -> None:
        """Run step() on a thread of the engine's own, for clients that submit from many
        threads (the server). From then on only that thread touches the backend."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="localinfer-engine", daemon=True)
        self._thread.start()
        if self.drafting is not None and self.drafting.verify_cost is None:
            self._post(("call", (lambda: None, concurrent.futures.Future())))  # a first step now: it measures the verify cost

    def stop(self) -> None:
        """Finish the requests in flight, then end the engine's thread."""
        thread = self._thread
        if thread is None:
            return
        with self._wake:
            self._stopping = True
            self._wake.notify()
        thread.join()
        self._thread = None

    def _loop(self) -> None:
        while True:
            with self._wake:
                self._wake.wait_for(lambda: self._inbox or self._waiting or self._running or self._calls or self._stopping)
                if self._stopping and not self.has_work():
                    return
            self.step()
            if self._running and not self.last_step.decoded and not self.last_step.prefilled:
                time.sleep(0.001)  # every reader is behind: let them catch up

    # --- conveniences for clients -----------------------------------------------------
    def generate(self, prompt_tokens: list[int], params: SamplingParams | None = None) -> Iterator[Event]:
        """Stream one request: TokenEvents, then its CompletionOutput. Closing the
        iterator early (Ctrl-C, a dropped client) aborts the request and frees its cache."""
        stream = self.submit(prompt_tokens, params)
        done = False
        try:
            while not done:
                if self._thread is None:
                    event = stream.get_nowait()
                    if event is None:
                        self.step()
                        continue
                else:
                    event = stream.get()
                done = isinstance(event, CompletionOutput)
                yield event
        finally:
            if not done:
                self.abort(stream.request_id)

    def chat(self, messages: list[Message], params: SamplingParams | None = None) -> Iterator[Event]:
        return self.generate(self.tokenize_prompt(self.render_chat(messages)), params)

    def complete(self, prompt_tokens: list[int], params: SamplingParams | None = None) -> CompletionOutput:
        """Run a request to the end and return only its result; a failed request raises."""
        for event in self.generate(prompt_tokens, params):
            if isinstance(event, CompletionOutput):
                event.raise_error()
                return event
        raise AssertionError("generate() ended without a CompletionOutput")

    def close(self) -> None:
        self.stop()
        self._closed = True
        self._watch.close()
        if self.drafting is not None:
            self.drafting.close()
        if self.prompt_cache is not None:
            self.prompt_cache.close()  # the blocks still queued reach the disk
        self.backend.close()
