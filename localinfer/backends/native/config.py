"""The hyperparameters of a llama-family model, read from GGUF metadata.

One place decides what the native engine can run; everything else trusts this.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from localinfer.errors import InvalidModelFile, UserError
from localinfer.modelfile import GGUFInfo

# GGUF architecture -> RoPE layout. llama.cpp's converter permutes q/k for "llama"-style
# models so that rotated pairs are adjacent (ggml's NORM mode); qwen2 keeps NeoX halves.
# SmolLM, SmolLM2 and Mistral GGUFs are all written as "llama".
ROPE_LAYOUT = {"llama": "normal", "qwen2": "neox"}


class UnsupportedModel(UserError):
    """The native engine cannot run this file; llama.cpp probably can."""


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope_layout: str  # "normal" (adjacent pairs) or "neox" (first/second half)
    rope_dims: int  # leading dims of each head that rotate
    rope_base: float
    rope_linear_scale: float  # positions are divided by this (1.0: no scaling)

    @classmethod
    def from_gguf(cls, info: GGUFInfo) -> ModelConfig:
        arch = info.architecture
        if arch not in ROPE_LAYOUT:
            raise UnsupportedModel(
                f"the native engine does not run the '{arch}' architecture (it runs {', '.join(ROPE_LAYOUT)}); use --engine llama.cpp"
            )
        meta = info.metadata

        def get(key: str, default: object = None, kind: type = float) -> object:
            """A metadata value as `kind`; a missing key without a default, or a value of
            the wrong type, is a file the engine cannot run: one line says which key."""
            value = meta.get(f"{arch}.{key}", default)
            if isinstance(value, list):
                if len(set(value)) > 1:
                    raise UnsupportedModel(f"{key} differs between layers, which the native engine does not run; use --engine llama.cpp")
                value = value[0] if value else default
            if value is None:
                raise InvalidModelFile(f"{info.path.name} has no {arch}.{key}, which the native engine needs; is the file complete?")
            if kind is str:
                return str(value)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not (isinstance(value, int) or (math.isfinite(value) and value.is_integer()))):
                raise InvalidModelFile(f"{info.path.name} has {arch}.{key} = {value!r}, not a number")
            return kind(value)

        for key, value in (("block_count", info.n_layer), ("embedding_length", info.n_embd), ("attention.head_count", meta.get(f"{arch}.attention.head_count"))):
            if not value:
                raise InvalidModelFile(f"{info.path.name} has no usable {arch}.{key}, which the native engine needs")
        scaling = get("rope.scaling.type", "none", str)
        factor = get("rope.scaling.factor", 1.0) or 1.0
        if scaling not in ("none", "linear") and factor != 1.0:
            raise UnsupportedModel(f"the native engine does not do '{scaling}' RoPE scaling; use --engine llama.cpp")
        head_dim = get("attention.key_length", info.n_embd // info.n_head, int)
        if get("attention.value_length", head_dim, int) != head_dim:
            raise UnsupportedModel("keys and values of different sizes are not run by the native engine; use --engine llama.cpp")
        n_ff = get("feed_forward_length", None, int)
        rope_dims = get("rope.dimension_count", head_dim, int)
        if n_ff <= 0 or head_dim <= 0 or head_dim % 2 or info.n_head % info.n_head_kv or not 0 < rope_dims <= head_dim or rope_dims % 2 or info.n_vocab <= 0:
            raise InvalidModelFile(
                f"{info.path.name} has inconsistent sizes (heads {info.n_head}/{info.n_head_kv}, head size {head_dim}, "
                f"rotated dims {rope_dims}, feed-forward {n_ff}, vocabulary {info.n_vocab})"
            )
        norm_eps, rope_base = get("attention.layer_norm_rms_epsilon", 1e-5), get("rope.freq_base", 10000.0)
        if not (math.isfinite(norm_eps) and norm_eps >= 0 and math.isfinite(rope_base) and rope_base > 0 and math.isfinite(factor) and factor > 0):
            raise InvalidModelFile(f"{info.path.name} has unusable numbers (RMS epsilon {norm_eps}, RoPE base {rope_base}, scaling factor {factor})")
        return cls(
            architecture=arch,
            n_layer=info.n_layer,
            n_embd=info.n_embd,
            n_ff=n_ff,
            n_head=info.n_head,
            n_head_kv=info.n_head_kv,
            head_dim=head_dim,
            n_vocab=info.n_vocab,
            n_ctx_train=info.context_length or 0,
            norm_eps=norm_eps,
            rope_layout=ROPE_LAYOUT[arch],
            rope_dims=rope_dims,
            rope_base=rope_base,
            rope_linear_scale=factor if scaling == "linear" else 1.0,
        )
