"""The backend interface: the only things the runtime asks of an inference engine.

A backend loads weights, tokenizes, runs a batched forward pass and manages its KV
cache per sequence. Everything else (sampling, stops, chat templates, speculative
decoding, scheduling, timings) lives above it in `localinfer.engine`, written once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from localinfer.errors import BackendError, UserError
from localinfer.kvtypes import position_bytes

MEDIA_MARKER = "<__media__>"  # where an image stands in a prompt's text (mtmd's default marker)

if TYPE_CHECKING:
    from localinfer.modelfile import GGUFInfo


@dataclass
class LoadParams:
    """How to load a model; a backend ignores what it cannot use."""

    n_ctx: int = 4096  # tokens one sequence may hold, prompt and answer together
    n_threads: int | None = None  # None: the backend's default (physical cores)
    n_gpu_layers: int = 0
    n_seq_max: int = 1  # how many sequences may share the KV cache at once
    n_batch: int = 512  # most tokens one forward() call may carry
    verbose: bool = False  # let the engine print its own log
    kernels: str | None = None  # native engine: auto | c | numba (None: $LOCALINFER_KERNELS, else auto)
    cache_types: tuple[str, str] = ("f16", "f16")  # the KV cache's K and V element types (kvtypes.KV_TYPES)
    # RPC workers (HOST:PORT) in llama.cpp's device order, each with how many of the
    # n_gpu_layers offloaded layers it holds (the output layer counted on the last)
    rpc_split: tuple[tuple[str, int], ...] = ()
    # a mixture of experts: the experts of the first n_cpu_moe layers stay in RAM beside a
    # GPU (llama.cpp's --n-cpu-moe); -1: every layer's (--cpu-moe)
    n_cpu_moe: int = 0
    # an embedding model's pooling (modelfile.POOLINGS) where --pooling overrides the file's;
    # None: the file's. Only "rank" changes what the backend computes (rank()); the others
    # are applied above it to embed()'s rows
    pooling: str | None = None
    # a vision model's projector (llama.cpp's mmproj GGUF), for a backend that reads images
    # (Capabilities.vision); None: text only
    mmproj: Path | None = None


@dataclass(frozen=True)
class Capabilities:
    """What a backend can run, as data: the loader picks and checks an engine with it and
    `doctor` prints it, so nothing above the backends asks which engine it is."""

    architectures: frozenset[str] | None  # GGUF general.architecture values; None: whatever its library loads
    weight_types: frozenset[str] | None  # ggml type names of the tensors it reads; None: any
    kv_types: tuple[str, ...]  # KV-cache element types it keeps (kvtypes.KV_TYPES names)
    gpu_offload: bool  # can put layers on a GPU
    kv_layout: str  # "shared": one pool that sequences take cells of; "per-sequence": a cache each
    kernel_sets: tuple[str, ...] = ()  # what --kernels chooses between (none: the engine has one)
    rpc: bool = False  # can split a model's layers across other machines' RPC workers (--rpc)
    # Architectures and tensor types it runs but where another engine measured faster
    # (docs/benchmarks.md): `--engine auto` passes it over for them.
    slower: frozenset[str] = frozenset()
    # the architectures whose rerankers it runs (rank pooling: a classifier head, Backend.rank); None: any
    ranks: frozenset[str] | None = frozenset()
    vision: bool = False  # reads images through a projector (LoadParams.mmproj; media_chunks, forward_media)

    def refusal(self, architecture: str, tensor_types: Iterable[str], auto: bool = False, pooling: str = "none") -> str | None:
        """Why this backend cannot run a model of this architecture, tensor types and
        pooling (one line), or, for `auto`, should not be chosen for it; None if it can."""
        if (rank := self.rank_refusal(architecture, pooling)) is not None:
            return rank
        types = set(tensor_types)
        if self.architectures is not None and architecture not in self.architectures:
            return f"the '{architecture}' architecture (it runs {', '.join(sorted(self.architectures))})"
        missing = sorted(types - self.weight_types) if self.weight_types is not None else []
        if missing:
            return f"{', '.join(missing)} tensors"
        slow = sorted(({architecture} | types) & self.slower) if auto else []
        if slow:
            return f"{', '.join(slow)} as fast as another engine does (docs/benchmarks.md)"
        return None

    def rank_refusal(self, architecture: str, pooling: str) -> str | None:
        """Why this backend cannot rank with a model of this architecture (one line), or None."""
        if pooling == "rank" and self.ranks is not None and architecture not in self.ranks:
            return f"'{architecture}' rerankers (rank pooling)" if self.ranks else "rerankers (rank pooling)"
        return None


@dataclass
class Batch:
    """Tokens for one forward pass, across one or more sequences.

    Row i is token `tokens[i]` at position `positions[i]` of sequence `seq_ids[i]`;
    logits come back for the rows where `want_logits[i]` is true, in row order.
    """

    tokens: np.ndarray  # [n] int32
    positions: np.ndarray  # [n] int32
    seq_ids: np.ndarray  # [n] int32
    want_logits: np.ndarray  # [n] bool

    @classmethod
    def for_sequence(cls, tokens: list[int], start_pos: int, seq_id: int = 0, all_logits: bool = False) -> Batch:
        """One sequence's tokens from `start_pos`, with logits for the last (or every) token."""
        n = len(tokens)
        want = np.ones(n, dtype=bool) if all_logits else np.arange(n) == n - 1
        return cls(
            tokens=np.asarray(tokens, dtype=np.int32),
            positions=np.arange(start_pos, start_pos + n, dtype=np.int32),
            seq_ids=np.full(n, seq_id, dtype=np.int32),
            want_logits=want,
        )

    @classmethod
    def of_rows(cls, rows: Iterable[tuple[int, list[int], int, int]]) -> Batch:
        """Rows of several sequences, each (seq_id, tokens, start position, how many of its
        last tokens want logits), in one batch, in that order."""
        rows = list(rows)
        if len(rows) == 1:  # a lone decode step, the most common batch: four arrays made directly
            seq_id, chunk, start, n_logits = rows[0]
            n = len(chunk)
            want = np.zeros(n, dtype=bool)
            want[n - n_logits :] = n_logits > 0
            return cls(np.array(chunk, dtype=np.int32), np.arange(start, start + n, dtype=np.int32), np.full(n, seq_id, dtype=np.int32), want)
        tokens: list[int] = []
        positions: list[int] = []
        seq_ids: list[int] = []
        want: list[bool] = []
        for seq_id, chunk, start, n_logits in rows:
            tokens += chunk
            positions += range(start, start + len(chunk))
            seq_ids += [seq_id] * len(chunk)
            want += [False] * (len(chunk) - n_logits) + [True] * n_logits
        return cls(np.array(tokens, dtype=np.int32), np.array(positions, dtype=np.int32), np.array(seq_ids, dtype=np.int32), np.array(want, dtype=bool))

    def __len__(self) -> int:
        return len(self.tokens)


@dataclass(frozen=True)
class MediaChunk:
    """An image as the text model reads it: a run of cells that one forward_media call fills
    whole. `key` names its pixels (a hash of the file's bytes), so the same image twice makes
    the same prompt. It fills n_tokens cells but moves the position on by n_pos: fewer where
    the model lays an image out in 2-D positions (Qwen-VL's M-RoPE)."""

    key: str
    n_tokens: int
    n_pos: int
    handle: object  # the backend's own form of it, valid while that backend is


@dataclass
class VocabInfo:
    """Facts about the tokenizer the runtime needs for chat and stopping."""

    n_vocab: int
    bos_id: int | None
    eos_id: int | None
    eog_ids: frozenset[int]  # end-of-generation tokens: eos, eot, <|im_end|>, ...
    add_bos: bool
    bos_text: str = ""
    eos_text: str = ""
    special: dict[int, bytes] = field(default_factory=dict)  # control tokens and their text: never output text
    # what a reranker's pair of texts is joined with (llama-server's format_rerank): the
    # separator token, and whether the vocabulary adds an EOS / a separator
    sep_id: int | None = None
    add_eos: bool = False
    add_sep: bool = False
    # the GGUF's "rerank" chat template (tokenizer.chat_template.rerank, as llama.cpp's
    # converter writes Qwen3-Reranker's): a reranker's prompt with {query} and {document}
    rerank_template: str | None = None


@dataclass
class ModelFacts:
    """What the loaded model is, for timings, memory checks and `show`."""

    path: Path
    architecture: str
    n_params: int
    n_ctx_train: int
    n_ctx: int  # tokens one sequence may hold (its share, where the cache is one shared pool)
    n_seq_max: int
    n_layer: int
    n_embd: int
    chat_template: str | None
    extra: dict[str, str] = field(default_factory=dict)
    pooling: str = "none"  # modelfile.POOLINGS: "none" for a generative model, else how its rows become one vector
    n_batch: int = 512  # tokens a forward takes at once: an encoder's at most, each sequence whole in it
    causal: bool = True  # False for an encoder: its forward cannot be cut into chunks, nor a sequence continued


class Backend(ABC):
    """An inference engine behind localinfer's runtime."""

    name: ClassVar[str]

    @classmethod
    @abstractmethod
    def capabilities(cls) -> Capabilities:
        """What this backend runs, on this machine and build."""

    @classmethod
    def kv_cache_bytes(cls, info: GGUFInfo, n_ctx: int, n_seq: int, cache_types: tuple[str, str]) -> int:
        """The most its KV cache takes for n_seq sequences of n_ctx tokens of this model (the
        memory check before loading): here every layer's every position; none for an encoder."""
        if not info.causal:
            return 0
        return int(info.n_layer * n_ctx * n_seq * position_bytes(info.n_head_kv, info.head_dim, cache_types))

    @classmethod
    @abstractmethod
    def load(cls, path: Path, params: LoadParams) -> Backend:
        """Load weights and allocate a KV cache for `params.n_seq_max` sequences."""

    # --- tokenizer -------------------------------------------------------------
    @property
    @abstractmethod
    def vocab(self) -> VocabInfo: ...

    @property
    @abstractmethod
    def facts(self) -> ModelFacts: ...

    @abstractmethod
    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Text to token ids; `add_special` adds BOS where the model wants one."""

    @abstractmethod
    def token_bytes(self, token: int) -> bytes:
        """The raw bytes of one token. Bytes, not str: a token can end mid-character."""

    # --- compute ---------------------------------------------------------------
    @abstractmethod
    def forward(self, batch: Batch) -> np.ndarray:
        """Run the batch through the model; returns [n_wanted, n_vocab] float32 logits."""

    def forward_transient(self, batch: Batch) -> np.ndarray:
        """forward(), for a caller done with the logits before it next calls this backend (the
        engine's step): the logits may be a view of the backend's own output buffer, valid only
        until then, instead of a copy. Every other caller keeps forward()'s own array."""
        return self.forward(batch)

    @abstractmethod
    def embed(self, batch: Batch) -> np.ndarray:
        """As forward, but returns the final-norm hidden states [n_wanted, n_embd] of the
        rows that want them, instead of logits (embeddings are pooled above the backend)."""

    def rank(self, batch: Batch) -> np.ndarray:
        """A reranker's (pooling "rank") score of each sequence of the batch, in the order
        they first appear in it: [n_sequences] float32. Each sequence is whole in the batch."""
        raise BackendError(f"the {self.name} engine cannot rank")

    # --- images (Capabilities.vision) ----------------------------------------------
    def media_chunks(self, text: str, images: list[bytes]) -> list[list[int] | MediaChunk]:
        """A prompt in which MEDIA_MARKER stands for each of `images` (an image file's bytes),
        cut into its text's tokens and its images' chunks, in order, the model's own tokens
        around each image added. BOS as tokenize() adds it."""
        raise UserError(f"the {self.name} engine reads no images: a vision model needs its projector (--mmproj FILE, or an mmproj-*.gguf beside it) and the llama.cpp engine")

    def forward_media(self, chunk: MediaChunk, seq_id: int, position: int) -> None:
        """Encode an image chunk with the projector and put its embeddings into a sequence at
        `position` (the next free one): the sequence then holds position + chunk.n_pos. No
        logits: a prompt's logits come from the text after its last image."""
        raise BackendError(f"the {self.name} engine cannot read images")

    # --- KV cache, per sequence -------------------------------------------------
    @abstractmethod
    def kv_clear(self, seq_id: int) -> None:
        """Forget everything cached for a sequence."""

    @abstractmethod
    def kv_truncate(self, seq_id: int, n_keep: int) -> int:
        """Keep positions [0, n_keep) of a sequence and drop the rest (speculative rollback,
        prefix reuse). Returns n_keep, or 0 where the cache no longer holds what that prefix
        needs (a sliding-window layer that let old positions go): the sequence is then empty."""

    @abstractmethod
    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        """Share positions [0, n_tokens) of `src_seq` with an empty `dst_seq` (prefix reuse).
        Returns how many it shared: n_tokens, or 0 as kv_truncate."""

    @abstractmethod
    def kv_read(self, seq_id: int, start: int, end: int) -> bytes:
        """Positions [start, end) of a sequence's KV cache as bytes, in this backend's own
        layout (the prompt cache keeps them; nothing above reads them). The sequence holds them."""

    @abstractmethod
    def kv_write(self, seq_id: int, start: int, data: bytes) -> int:
        """Put back bytes kv_read gave, at the positions they were read from, into a sequence
        that holds exactly its first `start` positions. Returns how many positions it holds
        after: `start` where the bytes do not fit this cache (another layout, type or
        context), which is then unchanged."""

    def runtime_report(self) -> dict[str, object]:
        """Engine-specific facts for --verbose (kernels, memory); empty when there are none."""
        return {}

    def close(self) -> None:
        """Free native memory; safe to call twice."""

    def __enter__(self) -> Backend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
