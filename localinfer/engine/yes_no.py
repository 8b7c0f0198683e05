"""A generative reranker: Qwen3-Reranker as a plain causal LM (a GGUF converted before
llama.cpp gave it a rank head, or any model asked to rank with --pooling rank).

Qwen's model card scores a query and a document by the next-token logits of "yes" and "no"
at the prompt's last position: P(yes) = exp(yes) / (exp(yes) + exp(no)). llama.cpp's
converter makes a rank head (cls.output) of those same two rows of the LM head and applies
that softmax in its graph, so a converted file and a plain one give the same score. Here it
is computed above the backends from Backend.forward's logits, so it runs on every engine.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import Backend
from localinfer.engine.embedding import run_groups
from localinfer.errors import UserError
from localinfer.modelfile import GGUFInfo

# Qwen's model card (Qwen/Qwen3-Reranker-*): its system prompt, its default instruction, the
# <Instruct>/<Query>/<Document> layout and the empty think block the answer follows, with
# {query} and {document} where a GGUF's rerank template has them (llama.cpp's converter
# writes this same text). For a file that carries no template of its own.
SYSTEM = 'Judge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be "yes" or "no".'
INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
TEMPLATE = (
    f"<|im_start|>system\n{SYSTEM}<|im_end|>\n"
    f"<|im_start|>user\n<Instruct>: {INSTRUCTION}\n<Query>: {{query}}\n<Document>: {{document}}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
HEAD = "cls.output.weight"  # a classifier's output rows: llama.cpp's rank pooling applies them


def ranks_by_logits(info: GGUFInfo) -> bool:
    """Whether rank pooling asked of this file is scored here, from its logits: a causal
    model without a classifier head of its own (llama.cpp would pool its last hidden state
    through nothing, and return the softmax of that)."""
    return info.causal and not any(t.name == HEAD for t in info.tensors)


@dataclass(frozen=True)
class YesNo:
    """The two tokens a generative reranker answers with, and its score from their logits."""

    yes: int
    no: int

    @classmethod
    def of(cls, backend: Backend) -> YesNo:
        """The vocabulary's own "yes" and "no" (the card's convert_tokens_to_ids), one token each."""
        found = [backend.tokenize(word, add_special=False, parse_special=False) for word in ("yes", "no")]
        if any(len(ids) != 1 for ids in found):
            raise UserError('this model cannot rank documents by its answer: "yes" and "no" are not one token each in its vocabulary (Qwen3-Reranker\'s are)')
        return cls(found[0][0], found[1][0])

    def scores(self, logits: np.ndarray) -> np.ndarray:
        """P(yes) of each row of next-token logits [n, n_vocab] -> [n]: the softmax over the
        two, as 1 / (1 + exp(no - yes)) in float64 (no overflow for any gap)."""
        gap = logits[:, self.no].astype(np.float64) - logits[:, self.yes]
        return np.exp(-np.logaddexp(0.0, gap)).astype(np.float32)


def yes_no_inputs(backend: Backend, inputs: list[list[int]], slots: list[int], n_tokens: int, yes_no: YesNo) -> np.ndarray:
    """The score of each input (a rerank prompt) [n]: many to a forward, each its own
    sequence, only its last row's logits asked for."""
    parts = run_groups(backend, inputs, slots, n_tokens, lambda batch, lengths: yes_no.scores(backend.forward(batch)), last_only=True)
    return np.concatenate(parts)
