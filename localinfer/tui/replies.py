"""Where the chat app's replies come from: our own Engine, in-process (the default), or any
OpenAI-compatible endpoint through the `openai` client (`--url`: our serve, Ollama,
llama-server). The app sees one shape for both: a Reply to iterate for (thinking, answer)
pieces, with live figures while it streams and the final ones after, and cancel() from any
thread.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from localinfer.backends.base import MEDIA_MARKER
from localinfer.engine.constraints import Constraint
from localinfer.engine.conversation import answer_room, fit_conversation
from localinfer.engine.engine import Engine
from localinfer.engine.templates import Message
from localinfer.engine.types import CompletionOutput, SamplingParams
from localinfer.errors import UserError
from localinfer.store.refs import is_path_ref
from localinfer.tui.attachments import data_url


@dataclass
class ReplyFigures:
    """What the status line shows and each reply stores. Live while streaming (counted
    here as tokens arrive); from the engine's own Timings once the reply ends."""

    ttft_ms: float = 0.0
    tokens_per_s: float = 0.0
    tokens: int = 0
    prompt_tokens: int | None = None
    n_ctx: int | None = None
    kv_cells: int | None = None  # KV-cache cells in use (all slots) and in all
    kv_cells_total: int | None = None
    kv_bytes: int | None = None
    cache_types: tuple[str, str] | None = None
    drafted: int = 0  # speculation: drafted and accepted tokens, both sources
    accepted: int = 0
    sources: list[tuple[str, int, int]] = field(default_factory=list)  # ... and per source: (name, drafted, accepted)
    tokens_per_forward: float = 0.0
    finish_reason: str | None = None  # None while streaming
    error: str | None = None
    reasoning_tokens: int | None = None  # a reasoning model's thinking: its tokens and how long it took
    reasoning_ms: float | None = None

    def stored(self) -> dict[str, object]:
        """The columns a saved reply keeps."""
        keys = ("ttft_ms", "tokens_per_s", "tokens", "prompt_tokens", "n_ctx", "kv_cells", "kv_cells_total", "finish_reason", "reasoning_tokens", "reasoning_ms")
        return {k: getattr(self, k) for k in keys}


Piece = tuple[str, str]  # (thinking, answer) text, either possibly empty


class Reply:
    """One reply in flight. Iterate it (on a worker thread) for (thinking, answer) pieces."""

    figures: ReplyFigures
    dropped: int = 0  # oldest messages left out so the conversation fits the context

    def __iter__(self) -> Iterator[Piece]:
        raise NotImplementedError

    def cancel(self) -> None:
        raise NotImplementedError


@dataclass
class _Clock:
    """Live TTFT and tokens/s from token arrival times, as a client sees them."""

    t_start: float = field(default_factory=time.perf_counter)
    t_first: float = 0.0
    n: int = 0

    def tick(self, figures: ReplyFigures) -> None:
        now = time.perf_counter()
        self.n += 1
        if self.n == 1:
            self.t_first = now
            figures.ttft_ms = (now - self.t_start) * 1e3
        elif now > self.t_first:
            figures.tokens_per_s = (self.n - 1) / (now - self.t_first)
        figures.tokens = self.n

    def think(self, figures: ReplyFigures, thinking: bool) -> None:
        """Time the thinking: from the reply's start to its last piece of thinking."""
        if thinking:
            figures.reasoning_ms = (time.perf_counter() - self.t_start) * 1e3


class LocalModel:
    """A model loaded in this process, on the same Engine `run` and `serve` use."""

    def __init__(self, engine: Engine, think: bool | str = True, think_budget: int | None = None) -> None:
        self.engine = engine
        self.think, self.think_budget = think, think_budget  # a reasoning model thinks before it answers (or how hard), at most this many tokens
        self.name = display_name(engine)
        self.engine_name = engine.backend.name  # the one --engine auto chose, for the status line
        self.engine_reason = f"{engine.choice.name}: {engine.choice.reason}" if engine.choice else ""  # its tooltip
        self.reads_images: bool | None = engine.projector is not None
        engine.start()  # an owner thread: the UI and worker threads only submit and abort

    @property
    def defaults(self) -> SamplingParams:
        return self.engine.defaults

    @property
    def n_ctx(self) -> int | None:
        return self.engine.n_ctx

    def reply(self, messages: list[Message], settings: dict[str, object]) -> Reply:
        """A reply to `messages`, sampled with the model's defaults overridden by `settings`
        (`json_mode`: the reply is a JSON object, under the engine's structured output)."""
        settings = dict(settings)
        constraint = Constraint("json_object") if settings.pop("json_mode", None) else None
        return _LocalReply(self, messages, self.engine.defaults.with_overrides(**settings, constraint=constraint, think_budget=self.think_budget))

    def check_image(self, image: bytes, name: str) -> None:
        """Decode `image` as a reply will, so that a damaged file is said when it is attached,
        not after it is saved with a message every later reply would fail on."""
        try:
            self.engine.tokenize_media(MEDIA_MARKER, [image])
        except UserError as e:
            raise UserError(f"{name}: {e}") from None

    def close(self) -> None:
        self.engine.close()


def display_name(engine: Engine) -> str:
    """How the status line names a model: a catalog or pulled model by the name the user
    typed, a file given by path by the name it gives itself (GGUF `general.name`, which
    `show` prints too), else its file name: a path is long and says little."""
    if not is_path_ref(engine.name):
        return engine.name
    own = engine.info.name if engine.info is not None else None
    return own or Path(engine.name).name


class _LocalReply(Reply):
    def __init__(self, model: LocalModel, messages: list[Message], params: SamplingParams) -> None:
        engine = self.engine = model.engine
        fitted = fit_conversation(engine, messages, answer_room(engine.n_ctx, params.max_tokens), model.think)  # ContextOverflow if it cannot
        self.dropped = fitted.dropped
        self.figures = ReplyFigures(prompt_tokens=len(fitted.tokens), n_ctx=engine.n_ctx, cache_types=engine.cache_types)
        self.clock = _Clock()  # from the submit, as the engine counts TTFT
        self.stream = engine.submit(fitted.tokens, params, fitted.media)
        self.request_id = self.stream.request_id

    def __iter__(self) -> Iterator[Piece]:
        clock, f = self.clock, self.figures
        while True:
            event = self.stream.get()
            if isinstance(event, CompletionOutput):
                t = event.timings
                f.ttft_ms, f.tokens, f.finish_reason = t.ttft_ms, event.completion_tokens, event.finish_reason
                f.tokens_per_s = t.tokens_per_s or f.tokens_per_s  # one token has no decode rate
                f.drafted, f.accepted, f.tokens_per_forward = t.drafted, t.accepted, t.tokens_per_forward
                f.sources = t.by_source()
                f.error = str(event.error) if event.error else None
                f.reasoning_tokens = event.reasoning_tokens or None
                self._kv(f)
                return
            clock.tick(f)
            clock.think(f, bool(event.reasoning) and not event.text)
            self._kv(f)
            if event.text or event.reasoning:
                yield event.reasoning, event.text

    def _kv(self, f: ReplyFigures) -> None:
        e = self.engine
        f.kv_cells, f.kv_cells_total, f.kv_bytes = e.kv_cells_used, e.kv_cells_total, e.kv_bytes_used()

    def cancel(self) -> None:
        self.engine.abort(self.request_id)


def api_base(url: str) -> str:
    """The OpenAI base URL for what a user types: `http://host:port` means its /v1."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise UserError(f"'{url}' is not an http:// or https:// URL")
    return url.rstrip("/") if parts.path.rstrip("/").endswith("/v1") else url.rstrip("/") + "/v1"


class RemoteModel:
    """A model behind an OpenAI-compatible endpoint."""

    engine_name = "remote"
    engine_reason = "an OpenAI-compatible endpoint (--url)"

    def __init__(self, url: str, model: str | None = None, think: bool | str = True, think_budget: int | None = None) -> None:
        import openai

        self.think = think  # off: asked of the endpoint as chat_template_kwargs.enable_thinking (llama-server, vLLM, ours); an effort as reasoning_effort
        self.think_budget = think_budget  # asked as thinking_budget_tokens (ours), only when set
        self.url = url
        self.client = openai.OpenAI(base_url=api_base(url), api_key=os.environ.get("OPENAI_API_KEY", "none"), max_retries=0, timeout=600)
        self.name = model or self._first_model()
        self.defaults = SamplingParams()  # what the settings screen shows; the endpoint's own may differ
        self.n_ctx: int | None = None  # an OpenAI endpoint does not say
        self.reads_images: bool | None = None  # nor whether its model reads images: its answer to one will

    def _first_model(self) -> str:
        with remote_errors(self.url):
            models = self.client.models.list().data
        if not models:
            raise UserError(f"{self.url} serves no models")
        return models[0].id

    def reply(self, messages: list[Message], settings: dict[str, object]) -> Reply:
        """A reply to `messages`; what `settings` leaves out, the endpoint picks."""
        return _RemoteReply(self, messages, settings)

    def check_image(self, image: bytes, name: str) -> None:
        """Nothing to check here: the endpoint decodes images, and its answer says if it cannot."""

    def close(self) -> None:
        self.client.close()


class remote_errors:
    """openai's exceptions as one-line UserErrors naming the URL."""

    def __init__(self, url: str) -> None:
        self.url = url

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, tb) -> bool:
        import openai

        if isinstance(error, openai.APIStatusError):
            raise UserError(f"{self.url} answered {error.status_code}: {error.message}") from None
        if isinstance(error, openai.APIError):  # connection refused, timeouts
            raise UserError(f"cannot reach {self.url}: {error.message}") from None
        return False


def _context_overflow(error: Exception) -> bool:
    """Does an endpoint's 400 say the prompt does not fit its context? Ours, llama-server,
    vLLM and OpenAI all name the context in that message."""
    return "context" in str(getattr(error, "message", error)).lower()


def openai_message(m: Message) -> Message:
    """A message as OpenAI's chat API takes it: one with images is a list of image_url parts
    (data: URLs), then its text. `images`: the image files' bytes."""
    images = m.get("images")
    if not images:
        return m
    parts = [{"type": "image_url", "image_url": {"url": data_url(image)}} for image in images]
    return {**{k: v for k, v in m.items() if k != "images"}, "content": [*parts, {"type": "text", "text": m["content"]}]}


class _RemoteReply(Reply):
    def __init__(self, model: RemoteModel, messages: list[Message], settings: dict[str, object]) -> None:
        self.model, self.messages, self.settings = model, [openai_message(m) for m in messages], settings
        self.figures = ReplyFigures()
        self._cancelled = threading.Event()
        self._response = None

    def _create(self, given: dict[str, object], extra_body: dict[str, object] | None):
        """The streaming request. An endpoint does not say its context size, so a conversation
        it refuses as too long loses its oldest message (never the system prompt or the newest
        turn) and is sent again, as the in-process model trims before it sends."""
        import openai

        messages = list(self.messages)
        while True:
            try:
                return self.model.client.chat.completions.create(
                    model=self.model.name, messages=messages, stream=True, stream_options={"include_usage": True},
                    **given, extra_body=extra_body,
                )  # fmt: skip
            except openai.BadRequestError as e:
                oldest = next((i for i, m in enumerate(messages[:-1]) if m["role"] != "system"), None)
                if oldest is None or not _context_overflow(e):
                    raise
                del messages[oldest]
                self.dropped += 1

    def __iter__(self) -> Iterator[Piece]:
        clock, f = _Clock(), self.figures
        openai_names = {"temperature", "top_p", "max_tokens", "seed", "response_format"}
        given = {k: v for k, v in self.settings.items() if v is not None and k != "json_mode"}
        if self.settings.get("json_mode"):
            given["response_format"] = {"type": "json_object"}
        extra = {k: v for k, v in given.items() if k not in openai_names}  # top_k, min_p, repeat_penalty: llama-server's and ours
        if not self.model.think:  # only then: an endpoint that knows no such field (OpenAI's) may refuse it
            extra["chat_template_kwargs"] = {"enable_thinking": False}
        if isinstance(self.model.think, str):  # low, medium or high: OpenAI's own field
            extra["reasoning_effort"] = self.model.think
        if self.model.think_budget is not None:
            extra["thinking_budget_tokens"] = self.model.think_budget
        with remote_errors(self.model.url):
            self._response = self._create(given={k: v for k, v in given.items() if k in openai_names}, extra_body=extra or None)
            try:
                for chunk in self._response:
                    if chunk.usage is not None:
                        f.prompt_tokens, f.tokens = chunk.usage.prompt_tokens, chunk.usage.completion_tokens
                    for choice in chunk.choices[:1]:
                        if choice.finish_reason:
                            f.finish_reason = choice.finish_reason
                        delta = choice.delta
                        thought = getattr(delta, "reasoning_content", None) or getattr(delta, "reasoning", None) or ""  # llama-server's and ours, vLLM's and Ollama's
                        if delta.content or thought:
                            clock.tick(f)
                            clock.think(f, bool(thought) and not delta.content)
                            yield thought, delta.content or ""
                    if self._cancelled.is_set():
                        break
            except Exception:
                if not self._cancelled.is_set():
                    raise
            finally:
                self._response.close()
        if self._cancelled.is_set():
            f.finish_reason = "abort"
        f.finish_reason = f.finish_reason or "stop"
        f.tokens = max(f.tokens, clock.n)

    def cancel(self) -> None:
        self._cancelled.set()
