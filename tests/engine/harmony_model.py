"""A scripted gpt-oss for the harmony tests: no gpt-oss runs offline, so its replies are
scripts written token by token through the embedded model's real tokenizer, under gpt-oss's
real chat template (tests/data/openai-gpt-oss-120b.jinja, llama.cpp's copy).

Two vocabularies: the embedded one as it is, in which every harmony marker is plain text of
several tokens (so each arrives split across tokens), and `MarkedTokenizer`, the same with
harmony's seven markers added as single special tokens, rendered as llama.cpp renders a
gpt-oss vocabulary's (`<|channel|>`, `<|message|>`, `<|start|>`, `<|constrain|>` as their
text; `<|end|>`, `<|return|>`, `<|call|>`, control tokens, as nothing) and listed as
end-of-generation as a gpt-oss GGUF's raw list has them (`<|end|>` too, which llama.cpp
drops from the list and the engine must not end at).
"""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import numpy as np

from localinfer.backends.base import Backend, Batch

from .scripted import OverTokenizer

TEMPLATE = (Path(__file__).parents[1] / "data" / "openai-gpt-oss-120b.jinja").read_text()
MARKERS = ("<|start|>", "<|channel|>", "<|message|>", "<|constrain|>", "<|end|>", "<|return|>", "<|call|>")
UNRENDERED = {"<|end|>", "<|return|>", "<|call|>"}  # control tokens: llama.cpp writes them as nothing
MODEL = "gpt-oss-scripted"
KEY_TOKENS = 64  # a script's key is the end of a prompt, shorter than this
SURE = 100.0  # the scripted token's logit (the others' are 0): drawn whatever the sampling settings


class MarkedTokenizer:
    """A tokenizer backend's vocabulary with harmony's markers as single tokens after its own."""

    def __init__(self, base: Backend) -> None:
        self.base, n = base, base.vocab.n_vocab
        self.ids = {marker: n + i for i, marker in enumerate(MARKERS)}
        self.text = {i: marker for marker, i in self.ids.items()}
        ends = {self.ids[m] for m in UNRENDERED}
        self.vocab = replace(base.vocab, n_vocab=n + len(MARKERS), eog_ids=base.vocab.eog_ids | ends,
                             special={**base.vocab.special, **{i: m.encode() for i, m in self.text.items()}})  # fmt: skip
        self.facts = base.facts
        self._split = re.compile("(" + "|".join(map(re.escape, MARKERS)) + ")")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        if not parse_special:
            return self.base.tokenize(text, add_special, parse_special)
        out = [self.base.vocab.bos_id] if add_special and self.base.vocab.add_bos and self.base.vocab.bos_id is not None else []
        for piece in self._split.split(text):
            out += [self.ids[piece]] if piece in self.ids else self.base.tokenize(piece, False, True) if piece else []
        return out

    def token_bytes(self, token: int) -> bytes:
        if token in self.text:
            return b"" if self.text[token] in UNRENDERED else self.text[token].encode()
        return self.base.token_bytes(token)


def strip_end(text: str) -> str:
    return text.replace("<|end|>", "")


class Replay(OverTokenizer):
    """Replies by script: after a prompt whose text ends with one of `scripts`' keys, forward's
    logits write that key's script token by token (then end of generation), at any sampling settings. It keeps each
    sequence's tokens as the engine feeds them (prefix reuse, copies and truncation included),
    and every prompt it was asked to answer, as text (`prompts`)."""

    name = "replay"

    def __init__(self, tokenizer, scripts: dict[str, str], template: str = TEMPLATE) -> None:  # type: ignore[no-untyped-def]
        super().__init__(tokenizer, template, n_seq_max=2)
        self.seqs, self.prompts = {}, []
        self.answering: dict[int, tuple[int, list[int]]] = {}  # sequence -> (its prompt's length, the script it answers with)
        self.scripts = {strip_end(key): tokenizer.tokenize(script, add_special=False) for key, script in scripts.items()}

    def text(self, tokens: list[int]) -> str:
        return strip_end(b"".join(map(self.token_bytes, tokens)).decode("utf-8", "replace"))

    def forward(self, batch: Batch) -> np.ndarray:
        logits = np.zeros((int(batch.want_logits.sum()), self.vocab.n_vocab), np.float32)
        out = 0
        for token, pos, seq_id, wanted in zip(batch.tokens, batch.positions, batch.seq_ids, batch.want_logits):
            seq = self.seqs.setdefault(int(seq_id), [])
            del seq[int(pos) :]
            seq.append(int(token))
            if wanted:
                logits[out, self._next(int(seq_id), seq)] = SURE
                out += 1
        return logits

    def _next(self, seq_id: int, tokens: list[int]) -> int:
        """The script's next token after the prompt it answers, or end of generation. A row
        whose text ends with a key is a prompt's last (a script never writes a key)."""
        tail = self.text(tokens[-KEY_TOKENS:])
        key = next((k for k in self.scripts if tail.endswith(k)), None)
        if key is not None:
            self.answering[seq_id] = (len(tokens), self.scripts[key])
            self.prompts.append(self.text(tokens))
        start, script = self.answering.get(seq_id, (len(tokens), []))
        done = tokens[start:]
        return script[len(done)] if done == script[: len(done)] and len(done) < len(script) else self.vocab.eos_id

    def embed(self, batch: Batch) -> np.ndarray:  # pragma: no cover
        raise NotImplementedError

    def kv_clear(self, seq_id: int) -> None:
        self.seqs.pop(seq_id, None)

    def kv_truncate(self, seq_id: int, n_keep: int) -> int:
        del self.seqs.setdefault(seq_id, [])[n_keep:]
        return n_keep

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        self.seqs[dst_seq] = list(self.seqs.get(src_seq, [])[:n_tokens])
        return n_tokens

    def kv_read(self, seq_id: int, start: int, end: int) -> bytes:  # pragma: no cover
        raise NotImplementedError

    def kv_write(self, seq_id: int, start: int, data: bytes) -> int:  # pragma: no cover
        raise NotImplementedError
