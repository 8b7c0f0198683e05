"""The hyperparameters of a model the native engine runs, read from GGUF metadata.

One place decides what the native engine can run; everything else trusts this. What
sets one architecture apart from the llama layer is data (`Architecture`), read by the
weights' loader and the forward pass, so forward.py stays one straight pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np

from localinfer.errors import InvalidModelFile, UserError
from localinfer.modelfile import GGUFInfo


@dataclass(frozen=True)
class Architecture:
    """How one GGUF architecture differs from the llama layer (as llama.cpp builds each)."""

    # llama.cpp's converter permutes q/k for "llama"-style models so that rotated pairs
    # are adjacent (ggml's NORM mode); the others keep NeoX halves.
    rope_layout: str
    qk_norm: bool = False  # an RMSNorm over each head of q and of k, before RoPE (attn_q_norm, attn_k_norm)
    post_norms: bool = False  # RMSNorm of the attention's and the FFN's outputs before each residual add (gemma)
    embed_scale: bool = False  # token embeddings times sqrt(n_embd) (gemma)
    # the gated FFN's: silu (SwiGLU), gelu (GeGLU, tanh approximation) or swiglu_oai (gpt-oss's clamped SwiGLU)
    activation: str = "silu"
    fused_gate_up: bool = False  # ffn_up holds the gate's rows, then the up's (phi3)
    sliding_window: bool = False  # local layers attend to the last n_swa positions (gemma3)
    swa_period: int = 6  # without a pattern key, layer il is local unless il % period == period - 1
    swa_same_rope: bool = False  # local layers rotate as the global ones (gpt-oss), not with base 10000 (gemma3)
    # A mixture of experts in place of the FFN (None: a dense one): how its router picks a
    # token's experts and weighs them (localinfer_native.types.MoeFFN's `gating`).
    router: str | None = None
    attn_sinks: bool = False  # a learned sink logit per head joins each softmax (attn_sinks)
    ffn_norm: str = "ffn_norm"  # the FFN's input norm's tensor (gpt-oss calls it post_attention_norm)
    # An encoder (BERT) in place of the decoder layer (native/encoder.py): token, position and
    # token-type embeddings and their LayerNorm; per layer q/k/v and the output with biases,
    # attention over the whole sequence (non-causal), a LayerNorm with a bias after each
    # residual add (post-norm), a plain GELU FFN with biases; no final norm, no logits. With a
    # rope_layout other than "none" (nomic-bert), RoPE on q and k instead of a position
    # table, and with activation "silu" a SwiGLU FFN (ffn_gate).
    encoder: bool = False


# What the native engine runs. SmolLM, SmolLM2 and Mistral GGUFs are all written as "llama".
# Of BERT's relatives, jina-bert-v2 (ALiBi) stays on llama.cpp.
ARCHITECTURES = {
    "llama": Architecture("normal"),
    "qwen2": Architecture("neox"),
    "qwen3": Architecture("neox", qk_norm=True),
    "gemma3": Architecture("neox", qk_norm=True, post_norms=True, embed_scale=True, activation="gelu", sliding_window=True),
    "phi3": Architecture("neox", fused_gate_up=True),
    "qwen3moe": Architecture("neox", qk_norm=True, router="softmax_norm"),
    "gpt-oss": Architecture("neox", activation="swiglu_oai", sliding_window=True, swa_period=2, swa_same_rope=True,
                            router="topk_softmax", attn_sinks=True, ffn_norm="post_attention_norm"),
    "bert": Architecture("none", activation="gelu", encoder=True),
    "nomic-bert": Architecture("neox", activation="silu", encoder=True),  # nomic-embed-text
}


# YaRN's tuning keys, which the files people run do not carry (llama.cpp defaults them)
YARN_TUNING = tuple(f"rope.scaling.yarn_{k}" for k in ("beta_fast", "beta_slow", "ext_factor", "attn_factor", "log_multiplier"))


class UnsupportedModel(UserError):
    """The native engine cannot run this file; llama.cpp probably can."""


@dataclass(frozen=True)
class Rope:
    """One RoPE: its base, how many leading dims of a head rotate, positions divided by
    `linear_scale`, cos and sin multiplied by `attn_factor` (phi3's long-context mscale).
    With a `yarn_factor`, YaRN as ggml's rope_yarn: each pair's angle blends the plain one
    and the one divided by the factor, by where the pair's wavelength falls against
    `yarn_orig_ctx` (beta_fast 32, beta_slow 1), and attn_factor includes YaRN's mscale."""

    base: float
    dims: int
    linear_scale: float = 1.0
    attn_factor: float = 1.0
    yarn_factor: float = 0.0  # 0: no YaRN
    yarn_orig_ctx: int = 0


@dataclass(frozen=True)
class ModelConfig:
    architecture: str
    kind: Architecture
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx_train: int
    norm_eps: float
    rope: Rope  # every layer's, or the global layers' where some are local
    rope_local: Rope  # the sliding-window layers' (gemma3: its own base, no scaling)
    n_ctx_orig: int  # the context the short RoPE factors are for (phi3's long-context files)
    attn_scale: float  # what q·k is multiplied by before the softmax
    window: int  # n_swa: a local layer's query sees this many positions, its own included (0: none)
    local_layers: tuple[bool, ...]  # per layer: does it attend within the window?
    logit_softcap: float  # logits = cap * tanh(logits / cap) where not 0
    n_expert: int = 0  # a mixture of experts' experts per layer (0: a dense FFN)
    n_expert_used: int = 0  # the experts each token runs
    n_ff_exp: int = 0  # one expert's FFN width

    @classmethod
    def from_gguf(cls, info: GGUFInfo) -> ModelConfig:
        arch = info.architecture
        if arch not in ARCHITECTURES:
            raise UnsupportedModel(f"the native engine does not run the '{arch}' architecture (it runs {', '.join(ARCHITECTURES)}); use --engine llama.cpp")
        kind, meta = ARCHITECTURES[arch], Metadata(info)
        for key, value in (("block_count", info.n_layer), ("embedding_length", info.n_embd), ("attention.head_count", meta.get("attention.head_count", 0))):
            if not value:
                raise InvalidModelFile(f"{info.path.name} has no usable {arch}.{key}, which the native engine needs")
        head_dim = meta.get("attention.key_length", info.n_embd // info.n_head, int)
        if meta.get("attention.value_length", head_dim, int) != head_dim:
            raise UnsupportedModel("keys and values of different sizes are not run by the native engine; use --engine llama.cpp")
        n_expert, n_expert_used, n_ff_exp = meta.experts(kind)
        n_ff = meta.get("feed_forward_length", 0 if n_expert else None, int)  # a mixture of experts may have none
        rope = meta.rope(head_dim)
        if (n_ff <= 0 and not n_expert) or head_dim <= 0 or head_dim % 2 or info.n_head % info.n_head_kv or not 0 < rope.dims <= head_dim or rope.dims % 2 or info.n_vocab <= 0:
            raise InvalidModelFile(
                f"{info.path.name} has inconsistent sizes (heads {info.n_head}/{info.n_head_kv}, head size {head_dim}, "
                f"rotated dims {rope.dims}, feed-forward {n_ff}, vocabulary {info.n_vocab})"
            )
        norm_eps, softcap = meta.norm_eps(kind), meta.get("final_logit_softcapping", 0.0)
        if not (math.isfinite(norm_eps) and norm_eps >= 0 and math.isfinite(softcap) and softcap >= 0):
            raise InvalidModelFile(f"{info.path.name} has unusable numbers (RMS epsilon {norm_eps}, logit softcap {softcap})")
        window, local = meta.sliding_window(info.n_layer, kind.swa_period) if kind.sliding_window else (0, (False,) * info.n_layer)
        # gemma3's 27B (62 layers) scales queries by its width per head, the rest by the head size (llama.cpp)
        scale_dim = info.n_embd // info.n_head if arch == "gemma3" and info.n_layer == 62 else head_dim
        return cls(
            architecture=arch, kind=kind, n_layer=info.n_layer, n_embd=info.n_embd, n_ff=n_ff, n_head=info.n_head, n_head_kv=info.n_head_kv,
            head_dim=head_dim, n_vocab=info.n_vocab, n_ctx_train=info.context_length or 0, norm_eps=norm_eps,
            rope=rope, rope_local=meta.local_rope(rope, kind) if window else rope,
            n_ctx_orig=meta.get("rope.scaling.original_context_length", info.context_length or 0, int),
            attn_scale=1.0 / math.sqrt(scale_dim), window=window, local_layers=local, logit_softcap=softcap,
            n_expert=n_expert, n_expert_used=n_expert_used, n_ff_exp=n_ff_exp,
        )  # fmt: skip


class Metadata:
    """A model's `{arch}.*` metadata, each value checked as it is read: a missing key without
    a default, or a value of the wrong type, is a file the engine cannot run, and one line
    says which key."""

    def __init__(self, info: GGUFInfo) -> None:
        self.info, self.arch = info, info.architecture

    def raw(self, key: str, default: object = None) -> object:
        return self.info.metadata.get(f"{self.arch}.{key}", default)

    def get(self, key: str, default: object = None, kind: type = float) -> object:
        value = self.raw(key, default)
        if isinstance(value, list):
            if len(set(value)) > 1:
                raise UnsupportedModel(f"{key} differs between layers, which the native engine does not run; use --engine llama.cpp")
            value = value[0] if value else default
        if value is None:
            raise InvalidModelFile(f"{self.info.path.name} has no {self.arch}.{key}, which the native engine needs; is the file complete?")
        if kind is str:
            return str(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not (isinstance(value, int) or (math.isfinite(value) and value.is_integer()))):
            raise InvalidModelFile(f"{self.info.path.name} has {self.arch}.{key} = {value!r}, not a number")
        return kind(value)

    def norm_eps(self, kind: Architecture) -> float:
        """The norms' epsilon: RMSNorm's, or an encoder's LayerNorm's (which it must be: a
        causal BERT or one with mixture-of-experts layers is not the encoder we run)."""
        if not kind.encoder:
            return self.get("attention.layer_norm_rms_epsilon", 1e-5)
        if self.raw("attention.causal") is not False:
            raise UnsupportedModel(f"the native engine runs {self.arch} as an encoder (attention.causal false); use --engine llama.cpp")
        if self.get("moe_every_n_layers", 0, int) > 0:
            raise UnsupportedModel(f"the native engine does not run {self.arch} with mixture-of-experts layers; use --engine llama.cpp")
        return self.get("attention.layer_norm_epsilon")

    def positive(self, key: str, default: float) -> float:
        value = self.get(key, default)
        if not (math.isfinite(value) and value > 0):
            raise InvalidModelFile(f"{self.info.path.name} has {self.arch}.{key} = {value}, not a positive number")
        return value

    def rope(self, head_dim: int) -> Rope:
        scaling = self.get("rope.scaling.type", "linear", str)  # llama.cpp's default: a factor alone scales linearly
        factor = self.positive("rope.scaling.factor", 1.0) if self.raw("rope.scaling.factor") else 1.0
        if scaling not in ("none", "linear", "yarn") and factor != 1.0:
            raise UnsupportedModel(f"the native engine does not do '{scaling}' RoPE scaling; use --engine llama.cpp")
        base, dims, attn_factor = self.positive("rope.freq_base", 10000.0), self.get("rope.dimension_count", head_dim, int), self.positive("rope.scaling.attn_factor", 1.0)
        if scaling != "yarn":
            return Rope(base, dims, linear_scale=factor if scaling == "linear" else 1.0, attn_factor=attn_factor)
        tuned = [key for key in YARN_TUNING if self.raw(key) is not None]
        if tuned:
            raise UnsupportedModel(f"the native engine does not run YaRN with {self.arch}.{tuned[0]} set; use --engine llama.cpp")
        # llama.cpp's context sets YaRN's attention factor to 1 (get_mscale, then its
        # cancellation) times the file's; rope_yarn then multiplies by 1 + 0.1 ln(factor)
        f32 = np.float32
        mscale = f32(attn_factor) * (f32(1) + f32(0.1) * np.log(f32(factor)))
        orig = self.get("rope.scaling.original_context_length", None, int)
        return Rope(base, dims, attn_factor=float(mscale), yarn_factor=factor, yarn_orig_ctx=orig)

    def local_rope(self, rope: Rope, kind: Architecture) -> Rope:
        """The sliding-window layers' RoPE: the global one with the swa base where the file
        gives one (gpt-oss), or plain RoPE with base 10000 unless it says another (gemma3)."""
        if kind.swa_same_rope:
            return replace(rope, base=self.positive("rope.freq_base_swa", rope.base))
        return Rope(self.positive("rope.freq_base_swa", 10000.0), rope.dims)

    def experts(self, kind: Architecture) -> tuple[int, int, int]:
        """(experts, experts per token, an expert's FFN width), (0, 0, 0) for a dense model,
        as llama.cpp reads them: the width falls back to feed_forward_length / experts per
        token where the file does not say it (qwen3moe)."""
        n_expert = self.get("expert_count", 0, int)
        if kind.router is None:
            if n_expert > 0:
                raise UnsupportedModel(f"the native engine does not run a mixture of experts written as '{self.arch}' (Mixtral's kind); use --engine llama.cpp")
            return 0, 0, 0
        n_used = self.get("expert_used_count", 0, int)
        if not 0 < n_used <= n_expert:
            raise InvalidModelFile(f"{self.info.path.name} has {n_used} experts per token of {n_expert} ({self.arch}.expert_used_count, expert_count)")
        if self.raw("expert_feed_forward_length") is None:
            n_ff_exp = self.get("feed_forward_length", 0, int) // n_used
        else:
            n_ff_exp = self.get("expert_feed_forward_length", 0, int)
        if n_ff_exp <= 0:
            raise InvalidModelFile(f"{self.info.path.name} has no usable {self.arch}.expert_feed_forward_length, which the native engine needs")
        return n_expert, n_used, n_ff_exp

    def sliding_window(self, n_layer: int, period: int) -> tuple[int, tuple[bool, ...]]:
        """(n_swa, which layers are local), as llama.cpp reads them: without a window every
        layer is global; a scalar pattern n makes layer il local unless il % n == n - 1
        (without the key, the architecture's period: gemma3's 6, five local and one global;
        gpt-oss's 2); a per-layer array says it layer by layer."""
        window = self.get("attention.sliding_window", 0, int)
        if window <= 0:
            return 0, (False,) * n_layer
        pattern = self.raw("attention.sliding_window_pattern", period)
        if isinstance(pattern, list):
            if len(pattern) != n_layer:
                raise InvalidModelFile(f"{self.info.path.name} has a sliding-window pattern of {len(pattern)} layers for {n_layer}")
            return window, tuple(bool(p) for p in pattern)
        n = self.get("attention.sliding_window_pattern", period, int)
        return window, tuple(n == 0 or il % n < n - 1 for il in range(n_layer))
