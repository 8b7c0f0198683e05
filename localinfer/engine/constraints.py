"""Structured output: a token mask from a JSON schema, a regex or a grammar, applied to the
logits before the sampler's other steps, written once above the backends.

The grammar engine is llguidance (guidance-ai), the one llama.cpp (`--llguidance`) and vLLM
use. It compiles JSON schemas, regular expressions, Lark grammars and llama.cpp's GBNF (via
its converter) into a matcher that says, at each position, which tokens may come next. We
chose it over xgrammar because it is one wheel with no dependencies, where xgrammar pulls
in torch, transformers and triton; and it builds its tokenizer from plain token bytes, so
one `GrammarVocab` per backend serves any GGUF model on either engine.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal

import numpy as np

from localinfer.backends.base import Backend
from localinfer.errors import ConstraintError

ConstraintKind = Literal["json_schema", "json_object", "regex", "grammar"]

# JSON as most models write it unprompted ({"a": 1, "b": [2, 3]}), and no other whitespace:
# free whitespace lets a small model pad with newlines until max_tokens.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class Constraint:
    """What the output must match. `source`: the schema as JSON text, the regex, or the
    grammar (GBNF as llama.cpp writes it, or Lark)."""

    kind: ConstraintKind
    source: str = ""

    @classmethod
    def json_schema(cls, schema: dict | str) -> Constraint:
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise ConstraintError(f"the JSON schema is not valid JSON: {e}") from None
        if not isinstance(schema, dict):
            raise ConstraintError("a JSON schema must be a JSON object")
        return cls("json_schema", json.dumps(schema))

    def check(self) -> Constraint:
        """Refuse a bad schema, regex or grammar now, with a one-line ConstraintError, before any
        model is loaded (the matcher checks again against the vocabulary)."""
        from llguidance import LLMatcher

        error = LLMatcher.validate_grammar(self.grammar())
        if error:
            raise ConstraintError(f"invalid {self.label}: {one_line(error)}")
        return self

    @property
    def label(self) -> str:
        return {"json_schema": "JSON schema", "json_object": "JSON", "regex": "regex", "grammar": "grammar"}[self.kind]

    def grammar(self) -> str:
        """llguidance's grammar for this constraint (not yet checked: the matcher does that)."""
        from llguidance import LLMatcher, grammar_from

        if self.kind == "json_object":
            return LLMatcher.grammar_from_json_schema({"type": "object"}, defaults=JSON_OPTIONS)
        if self.kind == "json_schema":
            try:
                return LLMatcher.grammar_from_json_schema(self.source, defaults=JSON_OPTIONS)
            except ValueError as e:
                raise ConstraintError(f"invalid JSON schema: {e}") from None
        if self.kind == "regex":
            return LLMatcher.grammar_from_regex(self.source)
        try:
            return grammar_from("gbnf", self.source)  # GBNF, or Lark: the converter tells them apart
        except ValueError as e:
            raise ConstraintError(f"invalid grammar: {one_line(str(e))}") from None


def one_line(message: str) -> str:
    return " ".join(message.split())


class GrammarVocab:
    """llguidance's view of a backend's vocabulary: every token's bytes, with control tokens
    (<|im_end|>, ...) marked special so no grammar writes them as text, and the model's
    end-of-generation tokens as the ones that close a finished grammar. Building it reads
    the whole vocabulary (about a second), so an engine builds it once, when first asked."""

    def __init__(self, backend: Backend) -> None:
        from llguidance import LLTokenizer, TokenizerWrapper

        v = backend.vocab
        tokens = [b"\xff" + v.special[t] if t in v.special else backend.token_bytes(t) for t in range(v.n_vocab)]
        eog = sorted(v.eog_ids) or ([v.eos_id] if v.eos_id is not None else [])
        if not eog:
            raise ConstraintError("this model has no end-of-generation token, which structured output needs")

        class Source:  # the duck-typed tokenizer TokenizerWrapper reads
            eos_token_id = eog[0]
            bos_token_id = v.bos_id
            special_token_ids = sorted(v.special)

            def __init__(self) -> None:
                self.tokens = tokens

            def __call__(self, text: bytes | str) -> list[int]:
                text = text.decode("utf-8", "replace") if isinstance(text, bytes) else text
                return backend.tokenize(text, add_special=False, parse_special=False)

        self.n_vocab = v.n_vocab
        self.tokenizer = LLTokenizer(TokenizerWrapper(Source()), n_vocab=v.n_vocab, eos_token=eog)

    def matcher(self, constraint: Constraint) -> TokenMask:
        return TokenMask(self, constraint)


class TokenMask:
    """One request's grammar state: which tokens may come next, advanced token by token."""

    def __init__(self, vocab: GrammarVocab, constraint: Constraint) -> None:
        from llguidance import LLMatcher

        self._matcher = LLMatcher(vocab.tokenizer, constraint.grammar(), log_level=0)
        if self._matcher.is_error():
            raise ConstraintError(f"invalid {constraint.label}: {one_line(self._matcher.get_error())}")
        self._bits = np.zeros((vocab.n_vocab + 31) // 32, dtype=np.int32)

    def apply(self, logits: np.ndarray) -> np.ndarray:
        """Set the logits of every token the grammar forbids here to -inf, in place, and
        return the ids it allows (the sampler's candidates: a partial sort of a vocabulary
        that is mostly -inf is slow). Empty when the grammar has failed (a parser limit)."""
        self._matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        allowed = np.unpackbits(self._bits.view(np.uint8), bitorder="little", count=len(logits)).view(bool)
        logits[~allowed] = -np.inf
        return np.flatnonzero(allowed) if not self._matcher.is_error() else np.empty(0, dtype=np.intp)

    def fork(self) -> TokenMask:
        """A copy at this state, to advance over a draft while this one stays where it is."""
        twin = object.__new__(TokenMask)
        twin._matcher, twin._bits = self._matcher.deep_copy(), self._bits.copy()
        return twin

    def advance(self, token: int) -> bool:
        """Take a sampled token; False if the grammar refuses it (then `error` says why)."""
        return self._matcher.consume_token(token)

    def valid_prefix(self, tokens: list[int]) -> int:
        """How many of these tokens, from the current state on, the grammar would take."""
        return self._matcher.validate_tokens(tokens)

    @property
    def error(self) -> str:
        return "structured output failed: " + (one_line(self._matcher.get_error()) or "the grammar allows no token here")

    @property
    def finished(self) -> bool:
        """The output is complete: nothing but end of generation may follow."""
        return self._matcher.is_stopped()
