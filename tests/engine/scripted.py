"""What the tests' scripted backends share: the tokens of a real tokenizer (the embedded
model's), and a chat template and sequence count the test chooses. Each scripted backend
adds only its forward and KV operations."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from localinfer.backends.base import Backend, LoadParams


class OverTokenizer(Backend):
    """A backend that tokenizes as `tokenizer` does and reports its facts with `template`
    and `n_seq_max` in place of the tokenizer's own."""

    def __init__(self, tokenizer: Backend, template: str, n_seq_max: int) -> None:
        self.tok = tokenizer
        self._facts = replace(tokenizer.facts, chat_template=template, n_seq_max=n_seq_max)

    @classmethod
    def capabilities(cls):  # pragma: no cover - not loaded through the loader
        raise NotImplementedError

    @classmethod
    def load(cls, path: Path, params: LoadParams) -> Backend:  # pragma: no cover
        raise NotImplementedError

    vocab = property(lambda self: self.tok.vocab)
    facts = property(lambda self: self._facts)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self.tok.tokenize(text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self.tok.token_bytes(token)
