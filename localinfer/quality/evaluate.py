"""Perplexity and KL divergence over a text, as llama.cpp's perplexity tool computes them.

The text is tokenized once and cut into chunks of `ctx` tokens. Each chunk is run from a
fresh cache (BOS first where the model wants one); only its second half is scored, so
every scored token sees at least ctx/2 tokens of context. Logits come from the backend
interface, so the same numbers are measured on llama.cpp and on the native engine.

  perplexity = exp(mean over scored tokens of -log p(next token))
  KLD        = sum_v p_ref(v) * (log p_ref(v) - log p(v)), per scored position
  top-1      = share of scored positions where both models' most likely token agree
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from localinfer.backends.base import Backend, Batch
from localinfer.errors import UserError


@dataclass
class EvalResult:
    perplexity: float
    tokens: int  # scored tokens
    chunks: int
    kld: dict[str, float] | None = None  # mean, p99, max (with a reference)
    top1_agreement: float | None = None

    def as_dict(self) -> dict[str, object]:
        out: dict[str, object] = {"perplexity": self.perplexity, "tokens": self.tokens}
        if self.kld is not None:
            out["kld"] = self.kld
            out["top1_agreement"] = self.top1_agreement
        return out


def chunks_of(tokens: list[int], ctx: int) -> list[list[int]]:
    """Whole chunks of ctx tokens; refuses a text too short for one."""
    if ctx < 8:
        raise UserError(f"--ctx must be at least 8, not {ctx}")
    n = len(tokens) // ctx
    if n == 0:
        raise UserError(f"the text has {len(tokens)} tokens, fewer than one chunk of --ctx {ctx}; give a longer text or a smaller --ctx")
    return [tokens[i * ctx : (i + 1) * ctx] for i in range(n)]


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(axis=-1, keepdims=True)
    x -= np.log(np.exp(x).sum(axis=-1, keepdims=True))
    return x


def scored_logprobs(backend: Backend, chunk: list[int]) -> np.ndarray:
    """Log-probabilities [n_scored, vocab] predicting tokens ctx/2+1 .. ctx-1 of the chunk."""
    tokens = list(chunk)
    bos = backend.vocab.bos_id
    if backend.vocab.add_bos and bos is not None:
        tokens[0] = bos  # as llama.cpp's perplexity tool does: the chunk starts a document
    first = len(tokens) // 2
    want = np.zeros(len(tokens), dtype=bool)
    want[first:-1] = True
    batch = Batch.for_sequence(tokens, 0)
    batch.want_logits = want
    backend.kv_clear(0)
    logits = backend.forward(batch)
    backend.kv_clear(0)
    return log_softmax(logits)


def evaluate(
    backend: Backend,
    tokens: list[int],
    ctx: int,
    reference: Backend | None = None,
    max_chunks: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> EvalResult:
    """`progress(done, total, perplexity so far)` is called after every chunk."""
    return evaluate_many({"model": backend}, tokens, ctx, reference, max_chunks, progress)["model"]


def evaluate_many(
    backends: dict[str, Backend],
    tokens: list[int],
    ctx: int,
    reference: Backend | None = None,
    max_chunks: int | None = None,
    progress: Callable[[int, int, float], None] | None = None,
) -> dict[str, EvalResult]:
    """Several models over the same chunks, the reference run once per chunk for all of
    them (a quantization table scores five quants against one F16 source)."""
    chunks = chunks_of(tokens, ctx)[:max_chunks]
    for backend in backends.values():
        if reference is not None and reference.vocab.n_vocab != backend.vocab.n_vocab:
            raise UserError(f"the reference has a vocabulary of {reference.vocab.n_vocab} tokens and the model {backend.vocab.n_vocab}; KL divergence needs the same tokenizer")
    nll: dict[str, list[np.ndarray]] = {name: [] for name in backends}
    klds: dict[str, list[np.ndarray]] = {name: [] for name in backends}
    agree: dict[str, list[np.ndarray]] = {name: [] for name in backends}
    for i, chunk in enumerate(chunks):
        ref = scored_logprobs(reference, chunk) if reference is not None else None
        targets = np.asarray(chunk[len(chunk) // 2 + 1 :])
        for name, backend in backends.items():
            logp = scored_logprobs(backend, chunk)
            nll[name].append(-logp[np.arange(len(targets)), targets])
            if ref is not None:
                klds[name].append(np.sum(np.exp(ref) * (ref - logp), axis=-1))
                agree[name].append(ref.argmax(axis=-1) == logp.argmax(axis=-1))
        if progress:
            first = next(iter(backends))
            progress(i + 1, len(chunks), float(np.exp(np.concatenate(nll[first]).mean())))
    results = {}
    for name in backends:
        all_nll = np.concatenate(nll[name])
        result = EvalResult(perplexity=float(np.exp(all_nll.mean())), tokens=len(all_nll), chunks=len(chunks))
        if reference is not None:
            kld = np.maximum(np.concatenate(klds[name]), 0.0)  # tiny negatives are rounding
            result.kld = {"mean": float(kld.mean()), "p99": float(np.percentile(kld, 99)), "max": float(kld.max())}
            result.top1_agreement = float(np.concatenate(agree[name]).mean())
        results[name] = result
    return results
