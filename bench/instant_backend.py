"""A backend whose forward pass costs nothing: precomputed logits, returned at once.

What an Engine spends per token beside the model (sampling, detokenizing, stop strings,
events, scheduling) hides behind a CPU's 8 ms forward and shows behind a GPU's 2 ms one.
Over this backend the forward is a microsecond or two, so a benchmark of the real Engine
measures that cost alone, on any machine (bench/loop_cost.py).

- `forward` returns a view of the next rows of a buffer made once, [n_wanted, n_vocab]
  float32: no allocation and no copy of a row per call, as a backend that hands out its
  library's own logits buffer would. By default every forward's rows start at the
  buffer's first: the same memory every step, hot in a core's cache as a CPU backend's
  logits are. With `n_rows` (e.g. 16: 9.7 MB at 152k) the rows are handed out in turn,
  read from the shared cache or memory, as logits a GPU copied back are.
- Each row is a fixed noise floor with a few clear candidates well above it, picked from
  ANSWERS precomputed sets: a forward writes the next set's candidates into its row
  and sets the last set's entries to 0, inside the floor (two numpy writes of 8 values a
  row, about a microsecond; loop_cost.py reports it), so greedy picks a different
  token each step, never repeating within ANSWERS tokens, and top-p draws among them.
  End-of-generation tokens sit far below everything, so an answer never ends unless
  `eog_after` says so.
- The engine may edit the rows it gets in place, as it may a library's buffer; `reset()`
  puts the buffer back between runs.
- Token bytes look like a byte-level BPE vocabulary's (words with and without a leading
  space, code pieces, digits, whole and split UTF-8 characters), so the streaming
  detokenizer does real work. Candidates are text pieces alone, and none holds '<', '|'
  or '#': stop strings made of them never match (STOPS).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localinfer.backends.base import Backend, Batch, Capabilities, LoadParams, ModelFacts, VocabInfo

SPECIAL = (b"<|endoftext|>", b"<|im_start|>", b"<|im_end|>")  # the vocabulary's last ids, as in Qwen2's
STOPS = ("<|user|>", "###")  # stop strings no answer over this vocabulary can contain
N_CANDIDATES = 8  # tokens per row well above the noise: what top-p chooses among
BOOSTS = np.linspace(12.0, 9.0, N_CANDIDATES, dtype=np.float32)  # their logits; the noise floor's largest is about 4.5
ANSWERS = 4096  # candidate sets: a greedy answer repeats after this many tokens
LETTERS = "etaoinshrdlcumwfgypbvkjxqz"
CODE = [b"()", b" =", b"):", b"\n", b"    ", b" +", b" -", b".", b",", b" {", b"}", b"[", b"]", b" ==", b"\n\n", b'"', b"'", b" *", b":", b";"]
WIDE = "éüñçàøßλπжщ中文字日本語한국어"  # 2- and 3-byte characters


def token_pieces(n_vocab: int, rng: np.random.Generator) -> list[bytes]:
    """A byte-level BPE-like vocabulary: the 256 bytes, then word and code pieces, then the
    special tokens. Deterministic for a given rng."""
    n_text = n_vocab - len(SPECIAL) - 256
    kinds = rng.choice(6, size=n_text, p=[0.45, 0.25, 0.1, 0.08, 0.07, 0.05])
    lengths = rng.integers(1, 9, size=n_text)
    letters = rng.integers(0, len(LETTERS), size=(n_text, 8))
    pieces = [bytes([b]) for b in range(256)]
    for kind, n, idx in zip(kinds.tolist(), lengths.tolist(), letters.tolist()):
        word = "".join(LETTERS[i] for i in idx[:n])
        if kind == 0:
            piece = (" " + word).encode()
        elif kind == 1:
            piece = word.encode()
        elif kind == 2:
            piece = CODE[idx[0] % len(CODE)] + word[:2].encode()
        elif kind == 3:
            piece = str(idx[0] * 10 + idx[1]).encode()
        elif kind == 4:
            piece = "".join(WIDE[i % len(WIDE)] for i in idx[: 1 + n % 3]).encode()
        else:  # one character split across two tokens, as byte-level BPE splits rare ones
            char = WIDE[idx[0] % len(WIDE)].encode()
            piece = char[:1] if idx[1] % 2 else char[1:]
        pieces.append(piece)
    return pieces + list(SPECIAL)


class InstantBackend(Backend):
    """Precomputed logits at once; the KV cache operations only count (see the module)."""

    name = "instant"

    def __init__(self, n_vocab: int = 151_936, n_seq: int = 1, n_ctx: int = 4096, n_rows: int | None = None, eog_after: int | None = None, seed: int = 0) -> None:
        """`n_rows`: rows in the logits buffer, handed out in turn (None: n_seq rows, each
        forward's from the first); `eog_after`: forwards after which an end-of-generation
        token tops every row (None: never)."""
        self._rng = rng = np.random.default_rng(seed)
        self._pieces = token_pieces(n_vocab, rng)
        self.eog = n_vocab - 1  # <|im_end|>
        # [ANSWERS, N_CANDIDATES] text pieces, in the order of their logits (BOOSTS)
        self.candidates = np.stack([rng.choice(np.arange(256, n_vocab - len(SPECIAL)), N_CANDIDATES, replace=False) for _ in range(ANSWERS)])
        self._sets = list(self.candidates)  # the same, one array a set (fewer numpy calls a forward)
        self._cycle = n_rows is not None
        self._allocate(max(n_rows or n_seq, n_seq), n_vocab)
        self._eog_after = eog_after
        self._next_row = 0  # the buffer row the next wanted row is
        self._answer = 0  # the candidate set the next wanted row gets
        self.forwards = 0
        self.kv_ops = {"clear": 0, "truncate": 0, "copy": 0, "read": 0, "write": 0}
        self._embeddings = np.zeros((n_ctx, 8), dtype=np.float32)
        self._vocab = VocabInfo(n_vocab=n_vocab, bos_id=None, eos_id=n_vocab - 3, eog_ids=frozenset({n_vocab - 3, n_vocab - 1}), add_bos=False,
                                special={n_vocab - len(SPECIAL) + i: s for i, s in enumerate(SPECIAL)})  # fmt: skip
        # the watched "model file" is this module: one real fstat a step, as with a real model
        self._facts = ModelFacts(path=Path(__file__), architecture="instant", n_params=0, n_ctx_train=n_ctx, n_ctx=n_ctx, n_seq_max=n_seq,
                                 n_layer=0, n_embd=8, chat_template=None)  # fmt: skip
        self.reset()

    def _allocate(self, n_rows: int, n_vocab: int) -> None:
        noise = self._rng.standard_normal((n_rows, n_vocab), dtype=np.float32)  # [n_rows, n_vocab] the floor
        noise[:, n_vocab - len(SPECIAL) :] = -30.0
        noise.flags.writeable = False
        self._noise = noise
        self._buffer = noise.copy()  # [n_rows, n_vocab] what forward hands out
        self._rows = list(self._buffer)  # views, one a row
        self._written = [0] * n_rows  # the candidate set each buffer row holds
        self._buffer[:, self.candidates[0]] = BOOSTS

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(architectures=frozenset({"instant"}), weight_types=None, kv_types=("f16",), gpu_offload=False, kv_layout="per-sequence")

    @classmethod
    def load(cls, path: Path, params: LoadParams) -> InstantBackend:
        return cls(n_seq=params.n_seq_max, n_ctx=params.n_ctx)

    def reset(self) -> None:
        """The buffer as made (the engine may have edited rows in place), the first answer next."""
        np.copyto(self._buffer, self._noise)
        self._buffer[:, self.candidates[0]] = BOOSTS
        self._written[:] = [0] * len(self._rows)
        self._next_row = self._answer = self.forwards = 0

    @property
    def vocab(self) -> VocabInfo:
        return self._vocab

    @property
    def facts(self) -> ModelFacts:
        return self._facts

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """Byte tokens: the benchmark gives the engine token ids; this serves the interface."""
        return list(text.encode())

    def token_bytes(self, token: int) -> bytes:
        return self._pieces[token]

    def forward(self, batch: Batch) -> np.ndarray:
        n = int(np.count_nonzero(batch.want_logits))
        if n > len(self._rows):  # a verify (speculation) wanting more rows than made: once, more
            self._allocate(n, self._vocab.n_vocab)
        if not self._cycle or self._next_row + n > len(self._rows):
            self._next_row = 0
        first, self._next_row = self._next_row, self._next_row + n
        for r in range(first, first + n):  # the row's last candidates down to the floor, the next set on top
            row = self._rows[r]
            row[self._sets[self._written[r]]] = 0.0
            row[self._sets[self._answer]] = BOOSTS
            self._written[r], self._answer = self._answer, (self._answer + 1) % ANSWERS
        self.forwards += 1
        if self._eog_after is not None and self.forwards > self._eog_after:
            self._buffer[first : first + n, self.eog] = BOOSTS[0] + 1.0
        return self._buffer if n == len(self._rows) else self._buffer[first : first + n]  # [n_wanted, n_vocab] a view

    def embed(self, batch: Batch) -> np.ndarray:
        return self._embeddings[: int(np.count_nonzero(batch.want_logits))]

    def kv_clear(self, seq_id: int) -> None:
        self.kv_ops["clear"] += 1

    def kv_truncate(self, seq_id: int, n_keep: int) -> int:
        self.kv_ops["truncate"] += 1
        return n_keep

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        self.kv_ops["copy"] += 1
        return n_tokens

    def kv_read(self, seq_id: int, start: int, end: int) -> bytes:
        self.kv_ops["read"] += 1
        return b""

    def kv_write(self, seq_id: int, start: int, data: bytes) -> int:
        self.kv_ops["write"] += 1
        return start  # bytes this cache does not take
