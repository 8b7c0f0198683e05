"""The engine: owns the decode loop for every backend.

One `step()` is schedule -> forward -> sample -> update, as in vLLM: every running request
decodes one token and waiting prompts are prefilled in chunks of at most `prefill_chunk`
tokens, all in one batched forward, so a long new prompt never freezes the streams already
running. While others decode, a chunk is also cut to a time budget (budget.py), so that a
step carrying prompt tokens stays within a few decode steps' time. The CLI, the TUI and the
server are thin clients of this object.

What is decided here is what runs in a step. What a request's rows of logits mean (the next
token, its text, whether it ends) is request.py's; which slot a request takes and what its
cache already holds is slots.py's; what is drafted is drafting.py's.

One owner. Only the thread that runs `step()` touches the backend and the scheduler's
state. Without `start()` that is whoever calls `generate()` (the CLI); after `start()` it
is the engine's own thread. Either way, `submit()` and `abort()` may be called from any
thread: they become messages that the owner applies at the top of its next step.
"""

from __future__ import annotations

import concurrent.futures
import itertools
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterator

import numpy as np

from localinfer.backends.base import Backend, Batch, MediaChunk
from localinfer.engine.budget import DEFAULT_SLOWDOWN, PrefillBudget
from localinfer.engine.constraints import GrammarVocab
from localinfer.engine.detokenize import StreamDetokenizer
from localinfer.engine.draft_model import DraftModel
from localinfer.engine.drafting import Drafting
from localinfer.engine.embedding import embed_inputs, fit_inputs, rank_inputs, rerank_tokens
from localinfer.engine.filewatch import ModelFileWatch
from localinfer.engine.media import extra_cells, media_prompt, text_until
from localinfer.engine.prompt_cache import PromptCache
from localinfer.engine.reasoning import Splitter, syntax_of
from localinfer.engine.request import Ending, Request, RequestContext
from localinfer.engine.sampler import Sampler
from localinfer.engine.slots import Slots
from localinfer.engine.speculative import DraftConfig
from localinfer.engine.stops import StopMatcher
from localinfer.engine.stream import Event, RequestStream
from localinfer.engine.templates import Message, render_chat
from localinfer.engine.types import CompletionOutput, EngineChoice, SamplingParams, Think
from localinfer.engine.yes_no import TEMPLATE as YES_NO_TEMPLATE
from localinfer.engine.yes_no import YesNo, yes_no_inputs
from localinfer.errors import BackendError, BackendLost, ContextOverflow, UserError
from localinfer.memory import MemoryPlan, kv_cache_bytes
from localinfer.modelfile import GGUFInfo
from localinfer.projector import Projector

DEFAULT_PREFILL_CHUNK = 512
MAX_BACKLOG = 256  # unread events after which a request waits for its reader
PROMPT_TAIL = 64  # a prompt's last tokens, read for where its reasoning syntax leaves the model (a required call's harmony header)
Row = tuple[Request, list[int], int, int]  # one request's part of a step's batch: (request, tokens, start position, rows wanting logits)


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
                 prompt_cache: PromptCache | None = None, pooling: str | None = None, projector: Projector | None = None) -> None:  # fmt: skip
        """`slots`: sequences decoded at once, each a KV-cache sequence id below the
        n_seq_max the backend was loaded with. `draft`: speculation's settings (None: none);
        `drafter`: a draft model beside prompt lookup. `name`: the reference the model was opened
        by (default: its file's name); `info`, `memory` and `choice`: what the loader read,
        planned and chose, for reports; `warnings`, what it warns of (the memory plan's, a
        draft model it could not use). `prompt_cache`: KV blocks kept across requests and
        restarts (prompt_cache.py); None: only what the slots hold is reused. `pooling`: what
        was asked of the model (--pooling, a catalog's default): "rank" where the backend's
        facts say the model is generative makes it a yes/no reranker (yes_no.py). `projector`:
        the vision projector the backend was loaded with, for reports."""
        self.backend = backend
        # A generative model asked to rank scores by its "yes" and "no" logits; a reranker's
        # prompt is the file's rerank template, for that one else Qwen's card's
        self.yes_no = YesNo.of(backend) if pooling == "rank" and backend.facts.pooling == "none" else None
        self.rerank_template = backend.vocab.rerank_template or (YES_NO_TEMPLATE if self.yes_no is not None else None)
        self.prompt_cache = prompt_cache
        self.defaults = defaults or SamplingParams()
        self.load_ms = load_ms
        self.prefill_chunk = max(1, prefill_chunk)
        self.budget = PrefillBudget(decode_slowdown)  # sizes chunks by time while others decode; see budget.py
        self.name = name or backend.facts.path.name
        self.info, self.memory, self.choice, self.projector = info, memory, choice, projector
        self.warnings = list(warnings if warnings is not None else memory.warnings if memory is not None else [])
        self.last_step = StepStats()
        self._ids = itertools.count()
        self.slots = Slots(backend, slots, prompt_cache)  # KV-cache sequence ids, what each holds, prefix reuse
        self._waiting: deque[Request] = deque()
        self._running: dict[int, Request] = {}
        self._inbox: deque[tuple[str, object]] = deque()  # ("submit", request) | ("abort", request id) | ("call", (fn, future))
        self._calls: deque[tuple[object, concurrent.futures.Future]] = deque()  # work that needs a free slot (embeddings)
        self._wake = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stopping = False
        self._closed = False
        # Speculation (None: none); what its steps cost is timed on the steps themselves.
        self.drafting = Drafting(draft, backend, drafter) if draft is not None else None
        self._watch = ModelFileWatch(backend.facts.path)
        self.broken: str | None = None  # why the model can no longer run (its file was truncated)
        self._grammar_vocab: GrammarVocab | None = None  # built when a request first asks for structured output
        self._grammar_lock = threading.Lock()
        special = lambda text: backend.tokenize(text, add_special=False, parse_special=True)  # noqa: E731
        self.think = syntax_of(backend.facts.chat_template, special)  # how the model reasons: <think> or harmony's channels
        eog = frozenset(backend.vocab.eog_ids)
        if self.think is not None:  # harmony's reply ends at <|return|> or <|call|>, never at <|end|>
            eog = self.think.end_tokens(eog, lambda text: ids[0] if len(ids := special(text)) == 1 else None)
        self._context = RequestContext(
            eog_ids=eog,
            eog=np.array(sorted(eog), dtype=np.intp),
            n_ctx=backend.facts.n_ctx,
            budget_close=tuple(special(self.think.budget_close)) if self.think is not None else (),
            load_ms=load_ms,
        )

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
    def render_chat(self, messages: list[Message], add_generation_prompt: bool = True, tools: list[dict] | None = None, think: Think = True) -> str:
        """The prompt for a conversation. A reasoning model thinks first unless `think` is
        False: its template's `enable_thinking` off, or where the template opens the think
        block itself and cannot, the block closed right after it opens (gpt-oss, which always
        reasons, is asked for its least: "low"). An effort ("low", "medium", "high") reaches
        templates that read `reasoning_effort`. Earlier turns' reasoning goes where the
        template reads it."""
        v, syntax = self.backend.vocab, self.think
        on, effort = think is not False, (think if isinstance(think, str) else None)
        prompt = render_chat(
            self.backend.facts.chat_template,
            syntax.history(messages) if syntax is not None else messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=v.bos_text,
            eos_token=v.eos_text,
            tools=tools,
            variables=syntax.variables(on, effort) if syntax is not None else None,
        )
        if syntax is not None and add_generation_prompt:
            prompt += syntax.prompt_suffix(prompt, on)
        return prompt

    def tokenize_input(self, text: str) -> list[int]:
        """Tokens of an input to embed, with the marks the model adds (BERT's [CLS] and [SEP]),
        as llama-server tokenizes one."""
        return self.backend.tokenize(text, add_special=True, parse_special=True)

    def tokenize_pair(self, query: str, document: str) -> list[int]:
        """A reranker's input: the query and one document in its rerank template, or joined
        as llama-server joins them where it has none."""
        return rerank_tokens(self.backend, query, document, self.rerank_template)

    def _bos_written(self, text: str) -> bool:
        """The template already wrote the BOS the model wants added: it must not come twice."""
        v = self.backend.vocab
        return v.add_bos and bool(v.bos_text) and text.startswith(v.bos_text)

    def tokenize_prompt(self, text: str) -> list[int]:
        """Tokens for a prompt, with BOS where the model wants it but never twice."""
        v = self.backend.vocab
        tokens = self.backend.tokenize(text, add_special=v.add_bos and not self._bos_written(text), parse_special=True)
        if not tokens and v.bos_id is not None:
            tokens = [v.bos_id]
        return tokens

    def tokenize_media(self, text: str, images: list[bytes]) -> tuple[list[int], dict[int, MediaChunk]]:
        """A prompt whose MEDIA_MARKERs stand for `images` (image files' bytes): its tokens,
        each image a run of placeholders (media.py), and each image's chunk by where its run
        starts, for submit(). BOS as tokenize_prompt adds it."""
        if not images:
            return self.tokenize_prompt(text), {}
        if self._bos_written(text):  # the backend adds it
            text = text[len(self.backend.vocab.bos_text) :]
        return media_prompt(self.backend.media_chunks(text, images))

    # --- requests (any thread) ------------------------------------------------------
    def submit(self, prompt_tokens: list[int], params: SamplingParams | None = None, media: dict[int, MediaChunk] | None = None) -> RequestStream:
        """Queue a request; its events arrive on the returned stream. `media`: the images
        of a prompt made by tokenize_media."""
        if self._closed or self.broken:
            raise BackendError(self.broken or "the engine is closed")
        params = params or self.defaults
        if params.seed is None or params.seed < 0:  # -1 is llama.cpp's and Ollama's "random"
            params = replace(params, seed=secrets.randbits(32))
        if not prompt_tokens:
            raise UserError("the prompt is empty")
        if prompt_tokens[-1] < 0:
            raise UserError("the prompt ends with an image: the model answers from the text after it")
        if (why := self.text_refusal()) is not None:
            raise UserError(why)
        if (cells := len(prompt_tokens) + extra_cells(media or {}, len(prompt_tokens))) >= self.n_ctx:
            raise ContextOverflow(
                f"the prompt is {cells} tokens but the context holds {self.n_ctx}; "
                f"raise --ctx (this model was trained on {self.backend.facts.n_ctx_train})"
            )
        mask = self.grammar_vocab().matcher(params.constraint) if params.constraint is not None else None  # a bad one fails here, not mid-stream
        rid = next(self._ids)  # atomic: safe from any thread
        stream = RequestStream(rid)
        req = Request(
            request_id=rid,
            prompt=list(prompt_tokens),
            params=params,
            context=self._context,
            sampler=Sampler(params),
            detok=StreamDetokenizer(self.backend.token_bytes),
            stops=StopMatcher(params.stop),
            stream=stream,
            history=[t for t in prompt_tokens if t >= 0],  # an image's placeholders are no token to penalise
            t_submit=time.perf_counter(),
            mask=mask,
            splitter=self._splitter(prompt_tokens) if params.reasoning else None,
            media=dict(media or {}),
        )
        self._post(("submit", req))
        return stream

    def _splitter(self, prompt_tokens: list[int]) -> Splitter | None:
        """A reasoning model's splitter, started where the prompt's end leaves the model:
        inside a think block the prompt opens, in the header or body of a harmony message."""
        if self.think is None:
            return None
        tail = b"".join(self.backend.token_bytes(t) for t in prompt_tokens[-PROMPT_TAIL:] if t >= 0).decode("utf-8", errors="replace")
        return self.think.splitter(tail)

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
        return len(self.slots.free)

    @property
    def kv_cells_used(self) -> int:
        """KV-cache cells holding tokens: the running requests' and the cached prefixes kept for reuse."""
        return self.slots.cells_used

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
        return self.slots.cells_cached

    @property
    def kv_cells_total(self) -> int:
        return self.n_ctx * len(self.slots)

    @property
    def n_running(self) -> int:
        return len(self._running)

    @property
    def n_waiting(self) -> int:
        return len(self._waiting) + sum(1 for kind, _ in list(self._inbox) if kind == "submit")

    def has_work(self) -> bool:
        return bool(self._waiting or self._running or self._inbox or self._calls)

    def text_refusal(self) -> str | None:
        """Why this model writes no text (an embedding or reranking model), in one line; None
        for a chat model. submit() refuses with it, and a client may ask before it starts."""
        if self.kind == "rerank":
            return f"{self.name} is a reranking model: it scores documents against a query (/v1/rerank); it does not write text"
        if self.kind == "embedding":
            return f"{self.name} is an embedding model: it gives vectors (/v1/embeddings, /api/embed, `localinfer embed`); it does not write text"
        return None

    @property
    def kind(self) -> str:
        """What the model answers: "chat" (text), "embedding" (vectors) or "rerank" (scores)."""
        pooling = "rank" if self.yes_no is not None else self.backend.facts.pooling
        return "chat" if pooling == "none" else "rerank" if pooling == "rank" else "embedding"

    @property
    def pooling(self) -> str:
        """How embed() makes one vector of an input's rows: the model's pooling, or for a
        generative model their mean; "rank" for a reranker, which makes none."""
        pooling = "rank" if self.yes_no is not None else self.backend.facts.pooling
        return "mean" if pooling == "none" else pooling

    def embed(self, inputs: list[list[int]], truncate: bool = False) -> np.ndarray:
        """One pooled vector per input ([n, n_embd], not normalised: embedding.finish), many
        inputs to a forward. Runs on the owner's thread with every free slot (a sequence id
        each), so it never races a decode step; from another thread it blocks until done."""
        if self.pooling == "rank":
            raise UserError("this is a reranking model: it scores documents against a query (/v1/rerank), it gives no vectors")
        fitted = fit_inputs(inputs, self.embed_limit, truncate)
        return self._with_slots(lambda slots: embed_inputs(self.backend, fitted, slots, self.backend.facts.n_batch, self.pooling))

    def rank(self, inputs: list[list[int]], truncate: bool = False) -> np.ndarray:
        """A reranker's score of each input (tokenize_pair's query and document): its rank
        head's, or a generative reranker's P(yes)."""
        if self.pooling != "rank":
            raise UserError("this model cannot rank documents: it is not a reranker (rank pooling, or a yes/no model such as Qwen3-Reranker with --pooling rank)")
        fitted = fit_inputs(inputs, self.embed_limit, truncate, what="document")
        n_batch, yes_no = self.backend.facts.n_batch, self.yes_no
        if yes_no is not None:
            return self._with_slots(lambda slots: yes_no_inputs(self.backend, fitted, slots, n_batch, yes_no))
        return self._with_slots(lambda slots: rank_inputs(self.backend, fitted, slots, n_batch))

    @property
    def embed_limit(self) -> int:
        """The most tokens one embedding input takes: a sequence's context, and for an encoder
        what one forward takes and its position table holds (a causal model's forward goes in
        chunks; llama.cpp aborts on an encoder's batch past its ubatch)."""
        facts = self.backend.facts
        return self.n_ctx if facts.causal else min(self.n_ctx, facts.n_batch, facts.n_ctx_train or facts.n_batch)

    def _with_slots(self, work: Callable[[list[int]], np.ndarray]) -> np.ndarray:
        """work(slots) on the owner's thread, with the slots free when it runs (one at least), given back after."""

        def run() -> np.ndarray:
            slots = [self.slots.take_emptiest() for _ in list(self.slots.free)]
            try:
                return work(slots)
            finally:
                for slot in slots:
                    self.slots.give_back(slot, keep_cache=False)

        future: concurrent.futures.Future = concurrent.futures.Future()
        self._post(("call", (run, future)))
        if self._thread is None:  # the caller is the owner
            self._apply_inbox()
            while not future.done():
                self.step()
        return future.result()

    def _run_calls(self) -> None:
        while self._calls and self.slots.free:
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
        forward of every decoding request's next token (and its draft) plus up to
        `prefill_chunk` prompt tokens."""
        t0 = time.perf_counter()  # the whole step is what a running stream waits between tokens
        self._apply_inbox()
        if self.broken or (self._running or self._waiting or self._calls) and self._check_file():
            return
        self._run_calls()
        self._admit()
        decoding = [req for req in self._running.values() if req.pending is not None and req.stream.backlog < MAX_BACKLOG]
        stats = StepStats(decoded=len(decoding))
        self._prefill_image(stats)
        rows = self._prefill_rows(bool(decoding), stats)
        drafts = self.drafting.drafts(decoding, rows) if self.drafting is not None else {}
        fed = [[req.pending, *drafts.get(req.request_id, ())] for req in decoding]
        rows[:0] = [(req, tokens, req.n_past, len(tokens)) for req, tokens in zip(decoding, fed)]  # decode rows first, as stats.decoded counts them
        self.last_step = stats
        if rows:
            t_forward = time.perf_counter()
            self._forward(rows)
            if self.drafting is not None and decoding and not stats.prefilled and all(len(req.generated) > 1 for req in decoding):
                # what speculation's choice of K rests on; not a request's first decode step,
                # which pays for the cache its prefill left cold (20 ms where later ones took 10)
                self.drafting.observe(sum(map(len, fed)), time.perf_counter() - t_forward)
            chunks = [(start, len(part)) for _, part, start, _ in rows[stats.decoded :]]
            self.budget.observe(time.perf_counter() - t0, stats.decoded, chunks)

    def _admit(self) -> None:
        """Waiting requests take the free slots, each where most of its prompt is cached."""
        while self._waiting and self.slots.free:
            req = self._waiting.popleft()
            req.t_prefill = time.perf_counter()
            if self.drafting is not None and not req.media:  # an image's placeholders are nothing to draft from
                req.spec = self.drafting.admit(req.params)
            self.slots.place(req, list(self._running.values()))
            self._running[req.request_id] = req

    def _prefill_rows(self, decoding: bool, stats: StepStats) -> list[Row]:
        """This step's prompt chunks: up to `prefill_chunk` tokens in all, cut by the time
        budget while others decode (budget.py), at least one chunk a step."""
        rows: list[Row] = []
        tokens, seconds = self.prefill_chunk, self.budget.seconds(decoding=decoding)
        for req in self._running.values():
            if req.prefilling and tokens > 0 and (seconds > 0 or not stats.prefilled) and req.request_id not in stats.prefilled:
                n = self.budget.take(req.n_past, text_until(req.media, req.n_past, min(tokens, len(req.prompt) - req.n_past)), seconds)
                if n <= 0:  # an image comes first: _prefill_image's, next step
                    continue
                rows.append((req, req.prompt[req.n_past : req.n_past + n], req.n_past, int(req.n_past + n == len(req.prompt))))
                stats.prefilled[req.request_id] = n
                tokens, seconds = tokens - n, seconds - self.budget.cost(req.n_past, n)
        return rows

    def _prefill_image(self, stats: StepStats) -> None:
        """At most one image a step, whole, for the first request whose prompt has reached
        one: encoded by the projector into its sequence, like a prefill chunk. A failure ends
        that request alone."""
        for req in self._running.values():
            chunk = req.media.get(req.n_past) if req.prefilling else None
            if chunk is None:
                continue
            try:
                self.backend.forward_media(chunk, req.seq_id, req.n_past)
            except BackendLost as e:
                return self._break(e)
            except Exception as e:  # noqa: BLE001 - a failure is a request's outcome, reported on its stream
                return self._finish(req, "error", error=e)
            self.slots.fed(req.seq_id, req.prompt[req.n_past : req.n_past + chunk.n_pos])
            req.prefilled(chunk.n_pos)
            stats.prefilled[req.request_id] = chunk.n_pos
            return

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
        for req in [*self._running.values(), *self._waiting]:
            self._finish(req, "error", flush=False, error=error)
        self._waiting.clear()
        while self._calls:
            self._calls.popleft()[1].set_exception(error)

    def _forward(self, rows: list[Row]) -> None:
        """One batched forward; if it fails, each request alone, so that a failure ends only
        the request it belongs to (with an error event) and never stalls the others."""
        try:
            logits = self.backend.forward_transient(Batch.of_rows((req.seq_id, chunk, start, n_logits) for req, chunk, start, n_logits in rows))  # read before the next forward
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
        for req, tokens, start, n_logits in rows:
            ending: Ending | None = None
            if req.pending is not None:  # a decode row: the token sampled last step, then any draft
                kept, ending = req.verify(tokens, start, logits[out : out + n_logits])
                self.slots.verified(req.seq_id, tokens, start, kept)
            else:
                req.prefilled(len(tokens))
                self.slots.fed(req.seq_id, tokens)
                self.slots.store_blocks(req)
                if n_logits:
                    ending = req.sample(logits[out])
            out += n_logits
            if ending is not None:
                self._finish(req, *ending)

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
        req = self._running.get(request_id)
        if req is None:
            req = next((r for r in self._waiting if r.request_id == request_id), None)
            if req is None:
                return  # already finished
            self._waiting.remove(req)
        self._finish(req, "abort", flush=False)

    def _finish(self, req: Request, reason: str, flush: bool = True, error: Exception | None = None) -> None:
        if flush and error is None:
            req.flush()
        self._running.pop(req.request_id, None)
        if error is None:
            self.slots.store_blocks(req)
        self._release(req, keep_cache=error is None)
        req.stream.put(req.output(reason, error))

    def _release(self, req: Request, keep_cache: bool = True) -> None:
        """Give the slot back. Its cache stays for prefix reuse, unless the request failed
        (then what the cache holds is not known, so it is cleared)."""
        if req.seq_id < 0:
            return
        slot, req.seq_id = req.seq_id, -1
        if self.broken:  # a backend that is gone holds nothing to clear
            self.slots.forget(slot)
            keep_cache = True
        self.slots.give_back(slot, keep_cache)

    # --- the engine's own thread --------------------------------------------------------
    def start(self) -> None:
        """Run step() on a thread of the engine's own, for clients that submit from many
        threads (the server). From then on only that thread touches the backend."""
        if self._thread is not None:
            return
        self._stopping = False
        self._thread = threading.Thread(target=self._loop, name="localinfer-engine", daemon=True)
        self._thread.start()

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
            try:
                self.step()
            except Exception as e:  # noqa: BLE001 - a bug in a step ends the requests in it, never the thread, which readers would wait on forever
                logging.getLogger(__name__).exception("an engine step failed")
                for req in list(self._running.values()):
                    self._finish(req, "error", flush=False, error=BackendError(f"the engine failed: {type(e).__name__}: {e}"))
            if self._running and not self.last_step.decoded and not self.last_step.prefilled:
                time.sleep(0.001)  # every reader is behind: let them catch up

    # --- conveniences for clients -----------------------------------------------------
    def generate(self, prompt_tokens: list[int], params: SamplingParams | None = None, media: dict[int, MediaChunk] | None = None) -> Iterator[Event]:
        """Stream one request: TokenEvents, then its CompletionOutput. Closing the
        iterator early (Ctrl-C, a dropped client) aborts the request and frees its cache."""
        stream = self.submit(prompt_tokens, params, media)
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

    def complete(self, prompt_tokens: list[int], params: SamplingParams | None = None, media: dict[int, MediaChunk] | None = None) -> CompletionOutput:
        """Run a request to the end and return only its result; a failed request raises."""
        for event in self.generate(prompt_tokens, params, media):
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
