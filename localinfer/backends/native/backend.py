"""The native backend: our forward pass and kernels behind the same interface as llama.cpp.

Tokenization is llama.cpp's, from the vocabulary alone (no weights, no compute), so both
engines see the same token ids and the runtime above cannot tell them apart. An encoder
(BERT) runs encoder.py's pass instead of the decoder's: it gives hidden states, never
logits, and keeps no KV cache, so its cache operations hold nothing (as llama.cpp's).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from localinfer.backends.base import Backend, Batch, Capabilities, LoadParams, ModelFacts
from localinfer.backends.llamacpp import LlamaTokenized, Tokenizer, default_threads
from localinfer.backends.native.config import ARCHITECTURES, ModelConfig
from localinfer.backends.native.encoder import Encoder, EncoderWeights
from localinfer.backends.native.forward import Transformer
from localinfer.backends.native.kvcache import KVCache, local_positions_held
from localinfer.backends.native.memory import anon_rss_bytes
from localinfer.backends.native.weights import Weights
from localinfer.errors import BackendError, UserError
from localinfer.kvtypes import position_bytes
from localinfer.modelfile import GGUFInfo, inspect
from localinfer_native import KERNEL_SETS, KernelsUnavailable, kernel_types, load_kernels
from localinfer_native.types import KV_TYPES, kv_row_bytes


def native_cache_types(types: tuple[str, str], head_dim: int) -> tuple[str, str]:
    """The KV-cache types asked for, if the native engine keeps them at this head size; else a
    UserError. The loader refuses a type no engine's capabilities list first; this is for a
    backend loaded directly (tests, bench) and for the head size, which only the file knows."""
    for t in types:
        if t not in KV_TYPES:
            raise UserError(f"the native engine's KV cache is {', '.join(KV_TYPES)}, not {t}; 'localinfer doctor' lists each engine's")
        try:
            kv_row_bytes(t, head_dim)
        except ValueError as e:
            raise UserError(f"{e}; use --cache-type f16 or --engine llama.cpp") from None
    return types


# Where llama.cpp measured faster (docs/benchmarks.md): BF16 prefill (its vdpbf16ps against
# our float FMA). qwen3, gemma3 and phi3 were measured at least as fast ("Today's models");
# qwen3moe and gpt-oss faster at full size, prefill 3-5x and decode 1.1-1.5x, in less memory
# ("Mixtures of experts"). bert: faster on a 2-layer slice of BERT-base, F16 1.1-1.5x and
# Q8_0 2.2-2.8x our Engine on llama.cpp at 128 and 512 tokens (docs/architecture.md).
SLOWER = frozenset({"BF16"})


class NativeBackend(LlamaTokenized, Backend):
    name = "native"

    def __init__(self, path: Path, params: LoadParams) -> None:
        rss_before = anon_rss_bytes()
        info = inspect(path)
        if (why := self.capabilities().rank_refusal(info.architecture, params.pooling or info.pooling)) is not None:
            raise UserError(f"the native engine does not run {why}; use --engine llama.cpp")
        self.config = config = ModelConfig.from_gguf(info)
        cache_types = native_cache_types(params.cache_types, config.head_dim)
        threads = params.n_threads or default_threads()
        try:
            self.kernels = load_kernels(params.kernels, threads)
        except KernelsUnavailable as e:
            raise UserError(str(e)) from None
        encoder = config.kind.encoder
        # first: its checks name the tensor that is wrong
        self.weights = (EncoderWeights if encoder else Weights).open(path, info, config, self.kernels)
        try:
            self._tok = Tokenizer.load(path, params.verbose)
        except BaseException:
            self.weights.close()
            raise
        self.cache = None if encoder else KVCache(config, params.n_ctx, params.n_seq_max, cache_types, self.kernels.tiled_keys)
        # compiles or loads kernels
        self.model = Encoder(config, self.weights, self.kernels) if encoder else Transformer(config, self.weights, self.kernels, self.cache)
        # Code, vocabulary and compiled kernels are fixed costs; from here on, what the
        # model's use adds: KV cache pages and activations.
        self._rss_at_start = anon_rss_bytes()
        self._rss_fixed = max(0, self._rss_at_start - rss_before)
        self._n_batch = params.n_batch
        self._facts = ModelFacts(
            path=path,
            architecture=config.architecture,
            n_params=info.n_params,
            n_ctx_train=config.n_ctx_train,
            n_ctx=params.n_ctx,
            n_seq_max=params.n_seq_max,
            n_layer=config.n_layer,
            n_embd=config.n_embd,
            chat_template=self._tok.chat_template,
            extra={"threads": str(threads), "kernels": self.kernels.describe()},
            pooling=params.pooling or info.pooling,
            n_batch=params.n_batch,
            causal=not encoder,
        )

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(
            architectures=frozenset(ARCHITECTURES), weight_types=frozenset(t.name for t in kernel_types()), kv_types=tuple(KV_TYPES), gpu_offload=False, kv_layout="per-sequence",
            kernel_sets=KERNEL_SETS, slower=SLOWER, ranks=frozenset({"bert"}),
        )  # fmt: skip

    @classmethod
    def kv_cache_bytes(cls, info: GGUFInfo, n_ctx: int, n_seq: int, cache_types: tuple[str, str]) -> int:
        """Its sliding-window layers hold a few windows, not the whole context (kvcache.py)."""
        try:
            config = ModelConfig.from_gguf(info)
        except UserError:  # a file it will refuse in one line at load
            return super().kv_cache_bytes(info, n_ctx, n_seq, cache_types)
        if config.kind.encoder:
            return 0  # a scratch of one sequence's keys and values, rewritten every forward
        n_local = sum(config.local_layers) if config.window else 0
        held = (config.n_layer - n_local) * n_ctx + n_local * local_positions_held(config.window, n_ctx, LoadParams.n_batch)
        return int(held * n_seq * position_bytes(config.n_head_kv, config.head_dim, cache_types))

    @classmethod
    def load(cls, path: Path, params: LoadParams) -> NativeBackend:
        return cls(path, params)

    def _live(self) -> None:
        if getattr(self, "_tok", None) is None:
            raise BackendError("the model is closed")

    def forward(self, batch: Batch) -> np.ndarray:
        if self.cache is None:
            raise BackendError("an encoder gives embeddings, not logits")
        return self._run(batch, hidden=False)

    def embed(self, batch: Batch) -> np.ndarray:
        if self.cache is None:
            return self._encode(batch)
        return self._run(batch, hidden=True)

    def _encode(self, batch: Batch) -> np.ndarray:
        """An encoder's forward: the whole batch at once, each sequence in it whole."""
        self._live()
        if len(batch) == 0:
            return np.empty((0, self.config.n_embd), np.float32)
        if len(batch) > self._n_batch:
            raise BackendError(f"a batch of {len(batch)} tokens is more than the {self._n_batch} an encoder's forward takes")
        self._check_tokens(batch)
        return self.model.forward(batch.tokens, batch.positions, batch.seq_ids, batch.want_logits)

    def rank(self, batch: Batch) -> np.ndarray:
        """A BERT cross-encoder's score of each sequence: its classifier head on the first
        token's state (encoder.ClassifierHead), as llama.cpp's rank pooling computes it."""
        if self.cache is not None or self._facts.pooling != "rank" or self.weights.head is None:
            return super().rank(batch)
        states = self._encode(Batch(batch.tokens, batch.positions, batch.seq_ids, batch.positions == 0))
        firsts = batch.seq_ids[batch.positions == 0]
        order = [int(np.flatnonzero(firsts == seq)[0]) for seq in dict.fromkeys(batch.seq_ids.tolist())]
        return self.weights.head.scores(states[order])

    def _check_tokens(self, batch: Batch) -> None:
        if batch.tokens.min() < 0 or batch.tokens.max() >= self.weights.token_embd.rows:
            raise BackendError("token id out of range for this model")

    def _run(self, batch: Batch, hidden: bool) -> np.ndarray:
        self._live()
        if len(batch) == 0:
            return np.empty((0, self.config.n_embd if hidden else self.config.n_vocab), np.float32)
        self._check_tokens(batch)
        out = []
        for start in range(0, len(batch), self._n_batch):
            end = start + self._n_batch
            out.append(
                self.model.forward(batch.tokens[start:end], batch.positions[start:end], batch.seq_ids[start:end], batch.want_logits[start:end], hidden)
            )
        return out[0] if len(out) == 1 else np.concatenate(out)

    # An encoder (no cache) holds nothing between forwards: each operation has nothing to act on.
    def kv_clear(self, seq_id: int) -> None:
        self._live()
        if self.cache is not None:
            self.cache.clear(seq_id)

    def kv_truncate(self, seq_id: int, n_keep: int) -> int:
        self._live()
        return 0 if self.cache is None else self.cache.truncate(seq_id, n_keep)

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        self._live()
        return 0 if self.cache is None else self.cache.copy(src_seq, dst_seq, n_tokens)

    def kv_read(self, seq_id: int, start: int, end: int) -> bytes:
        self._live()
        return b"" if self.cache is None else self.cache.read(seq_id, start, end)

    def kv_write(self, seq_id: int, start: int, data: bytes) -> int:
        self._live()
        return start if self.cache is None else self.cache.write(seq_id, start, data)

    def runtime_report(self) -> dict[str, object]:
        """Which kernels ran, and the resident memory this engine added beyond the mapped weights."""
        return {
            "kernels": self.kernels.describe(),
            "weights_mapped": self.weights.mapped_bytes,
            "kv_cache_used": 0 if self.cache is None else self.cache.peak_bytes,
            "activations": self.model.peak_activation_bytes,
            "resident_beyond_mmap": max(0, anon_rss_bytes() - self._rss_at_start),
            "resident_at_load": self._rss_fixed,
        }

    def close(self) -> None:
        if getattr(self, "_tok", None) is not None:
            self._tok.close()
            self._tok = None
