"""The hyperparameters of a llama-family model, read from GGUF metadata.

One place decides what the native engine can run; everything else trusts this.
"""

from __future__ import annotations

from dataclasses import dataclass

from localinfer.errors import UserError
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

        def get(key: str, default: object = None) -> object:
            value = meta.get(f"{arch}.{key}", default)
            if isinstance(value, list):
                if len(set(value)) > 1:
                    raise UnsupportedModel(f"{key} differs between layers, which the native engine does not run; use --engine llama.cpp")
                value = value[0]
            return value

        scaling = str(get("rope.scaling.type", "none"))
        factor = float(get("rope.scaling.factor", 1.0) or 1.0)
        if scaling not in ("none", "linear") and factor != 1.0:
            raise UnsupportedModel(f"the native engine does not do '{scaling}' RoPE scaling; use --engine llama.cpp")
        head_dim = int(get("attention.key_length", info.n_embd // info.n_head))
        if int(get("attention.value_length", head_dim)) != head_dim:
            raise UnsupportedModel("keys and values of different sizes are not run by the native engine; use --engine llama.cpp")
        return cls(
            architecture=arch,
            n_layer=info.n_layer,
            n_embd=info.n_embd,
            n_ff=int(get("feed_forward_length")),
            n_head=info.n_head,
            n_head_kv=info.n_head_kv,
            head_dim=head_dim,
            n_vocab=info.n_vocab,
            n_ctx_train=info.context_length or 0,
            norm_eps=float(get("attention.layer_norm_rms_epsilon", 1e-5)),
            rope_layout=ROPE_LAYOUT[arch],
            rope_dims=int(get("rope.dimension_count", head_dim)),
            rope_base=float(get("rope.freq_base", 10000.0)),
            rope_linear_scale=factor if scaling == "linear" else 1.0,
        )
