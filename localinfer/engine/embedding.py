"""Embeddings and rerank scores, written once above every backend.

Many inputs go through one forward, each its own sequence, as many as there are free
sequence ids and as fit the backend's batch: an encoder's matrix products then run over
hundreds of rows at once instead of one input's. A backend gives each row's final hidden
state (embed) and the runtime pools them here, as llama.cpp's pooling does in its graph:
the mean of an input's rows, its first (CLS) or its last. A reranker's score is the one
thing the model computes after pooling (a classifier head), so the backend gives it (rank);
a generative reranker's comes from its logits (yes_no.py).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence

import numpy as np

from localinfer.backends.base import Backend, Batch
from localinfer.errors import UserError

POOLINGS = ("mean", "cls", "last")  # what the runtime applies to a backend's rows
# Tokens a forward carries, unless one input is longer. An encoder's attention runs over its
# whole forward (masked by sequence), so packing more short inputs into one only adds
# attention: on BERT-base, 32 inputs of 128 tokens went 1.18x faster than Llama.embed in
# forwards of 2,048 tokens and 1.35x in forwards of 512 (docs/benchmarks.md).
GROUP_TOKENS = 512


def forward_groups(lengths: Sequence[int], n_seq: int, n_tokens: int) -> list[list[int]]:
    """Indices of the inputs, in order, cut into groups that one forward can carry: at most
    n_seq inputs and n_tokens tokens each, or one input alone where it is longer (a causal
    model's, whose forward goes in chunks; an encoder's was refused before)."""
    groups: list[list[int]] = []
    used = 0
    for i, n in enumerate(lengths):
        if not groups or len(groups[-1]) == n_seq or used + n > n_tokens:
            groups.append([])
            used = 0
        groups[-1].append(i)
        used += n
    return groups


def pool(rows: np.ndarray, lengths: Sequence[int], pooling: str) -> np.ndarray:
    """One vector per input from its rows (rows of the inputs back to back, lengths[i] each)."""
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.intp)
    if pooling == "cls":
        return rows[starts]
    if pooling == "last":
        return rows[starts + np.asarray(lengths) - 1]
    sums = np.add.reduceat(rows, starts, axis=0, dtype=np.float64)  # float64 sums without a float64 copy of every row
    return (sums / np.asarray(lengths, dtype=np.float64)[:, None]).astype(np.float32)


def finish(vectors: np.ndarray, dimensions: int | None = None, normalize: bool = True) -> np.ndarray:
    """Vectors as a client gets them: cut to their first `dimensions` (Matryoshka models are
    trained so that a prefix is itself an embedding), then of unit length unless asked not."""
    if dimensions is not None:
        vectors = vectors[:, :dimensions]
    if not normalize:
        return vectors
    norms = np.linalg.norm(vectors.astype(np.float64), axis=1, keepdims=True)
    return (vectors / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def encode_base64(vector: np.ndarray) -> str:
    """OpenAI's encoding_format "base64": the little-endian float32 bytes."""
    return base64.b64encode(np.asarray(vector, dtype="<f4").tobytes()).decode("ascii")


def fit_inputs(inputs: list[list[int]], limit: int, truncate: bool, what: str = "input") -> list[list[int]]:
    """Inputs checked against the most tokens one sequence takes: each non-empty, and a longer
    one cut to `limit` where the request allows (Ollama's truncate), else refused in one line."""
    fitted = []
    for i, tokens in enumerate(inputs):
        if not tokens:
            raise UserError(f"{what} {i} is empty")
        if len(tokens) > limit:
            if not truncate:
                raise UserError(f"{what} {i} is {len(tokens)} tokens but the model takes at most {limit} at once; shorten it or ask for truncation")
            tokens = tokens[:limit]
        fitted.append(tokens)
    return fitted


def run_groups(backend: Backend, inputs: list[list[int]], slots: list[int], n_tokens: int, compute: Callable[[Batch, list[int]], np.ndarray],
               last_only: bool = False) -> list[np.ndarray]:  # fmt: skip
    """compute(batch, lengths) of each group of inputs, each input a sequence of its own
    (one of `slots`), emptied after: nothing an embedding puts in a cache is reused. Every
    row wants its output, or with `last_only` each input's last (its next-token logits)."""
    results = []
    budget = min(n_tokens, max(GROUP_TOKENS, max(len(t) for t in inputs)))
    for group in forward_groups([len(t) for t in inputs], len(slots), budget):
        batch = Batch.of_rows((slot, inputs[i], 0, 1 if last_only else len(inputs[i])) for slot, i in zip(slots, group))
        try:
            results.append(compute(batch, [len(inputs[i]) for i in group]))
        finally:
            for slot in slots[: len(group)]:
                backend.kv_clear(slot)
    return results


def embed_inputs(backend: Backend, inputs: list[list[int]], slots: list[int], n_tokens: int, pooling: str) -> np.ndarray:
    """The pooled vectors of the inputs, [n, n_embd], not normalised."""
    parts = run_groups(backend, inputs, slots, n_tokens, lambda batch, lengths: pool(backend.embed(batch), lengths, pooling))
    return np.concatenate(parts)


def rank_inputs(backend: Backend, inputs: list[list[int]], slots: list[int], n_tokens: int) -> np.ndarray:
    """A reranker's score of each input (a query and a document in one sequence), [n]."""
    return np.concatenate(run_groups(backend, inputs, slots, n_tokens, lambda batch, lengths: backend.rank(batch)))


def rerank_tokens(backend: Backend, query: str, document: str, template: str | None = None) -> list[int]:
    """A query and a document as one reranker input, as llama-server's format_prompt_rerank
    makes it: a rerank template with {query}, then {document} replaced (one after the other,
    as its string_replace_all) and tokenized with its special tokens parsed and none added;
    else [BOS] query [EOS] [SEP] document [EOS], each mark where the vocabulary adds it (a
    BERT or XLM-RoBERTa pair: <s> query </s> </s> document </s>)."""
    if template is not None:
        prompt = template.replace("{query}", query).replace("{document}", document)
        return backend.tokenize(prompt, add_special=False, parse_special=True)
    vocab = backend.vocab
    eos = vocab.eos_id if vocab.eos_id is not None else vocab.sep_id
    ends = [eos] if vocab.add_eos and eos is not None else []
    tokens = [vocab.bos_id] if vocab.add_bos and vocab.bos_id is not None else []
    tokens += backend.tokenize(query, add_special=False, parse_special=False) + ends
    tokens += [vocab.sep_id] if vocab.add_sep and vocab.sep_id is not None else []
    return tokens + backend.tokenize(document, add_special=False, parse_special=False) + ends
