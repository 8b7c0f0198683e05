"""Synthetic mixtures of experts of real shapes (Qwen3-30B-A3B, gpt-oss-20b), for
bench/synthetic.py: written straight in the block types their real files have, with no F16
source (Qwen3-30B-A3B's would be 61 GB) and no pass through llama.cpp's quantizer.

What the real files hold, and so what is written here (llama.cpp's load logs of them, public:
tensor counts per type and every metadata key; the tests check the full shapes' bytes
against the files' sizes and the types against llama.cpp's own quantizer):

* qwen3moe, Q4_K_M (Qwen/Qwen3-30B-A3B-GGUF, 18.56 GB; the log is of unsloth's Q4_K_M, the
  same size to within its metadata): 241 F32 (norms, q/k norms and the routers
  `ffn_gate_inp`, which llama.cpp never quantizes), 289 Q4_K, 49 Q6_K. The Q6_K ones
  are `output.weight` and, in the layers llama.cpp's `use_more_bits` picks (the first and
  last eighth and every third between), `attn_v` and `ffn_down_exps`: the rules of
  `llama_tensor_get_type` for LLAMA_FTYPE_MOSTLY_Q4_K_M that apply to these names.
* gpt-oss, MXFP4_MOE (ggml-org/gpt-oss-20b-GGUF, 12.11 GB): 72 MXFP4 (the experts), 98
  Q8_0 (attention, the embedding, the output matrix), 289 F32 (norms, every bias, the
  routers and the attention sinks).

A quantized tensor's blocks are drawn at random from a pool of real blocks of its type,
which our bit-exact codecs (ggml's own quantizers, `localinfer_quant.codecs`) make once from
normal(0, 0.02) values: a block read costs what it costs in the real file, and writing runs
at the speed of memory and disk, not of Q4_K's scale search (about 20 M values/s: 25
minutes for 30 B parameters). F32 tensors are drawn as bench/synthetic.py draws them.
Writing streams one tensor at a time (the largest: gpt-oss's embedding, 0.6 GB) into a
hidden temporary file, renamed only when whole.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import cache
from pathlib import Path

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType, RopeScalingType

T = GGMLQuantizationType
WEIGHT_STD = 0.02  # as bench/synthetic.py: the usual initialiser's scale
POOL_BLOCKS = 1 << 14  # distinct blocks per type: 2.4 MB of Q4_K, quantized in half a second
TAKE_BLOCKS = 1 << 20  # blocks drawn at a time, so a tensor's indices stay small
MB = 1 << 20


@dataclass(frozen=True)
class MoeShape:
    """A mixture of experts' shape, as its config.json and its llama.cpp GGUF give it."""

    name: str
    arch: str  # GGUF architecture: qwen3moe | gpt-oss
    ftype: str  # the real file's llama ftype, the only one made: Q4_K_M | MXFP4_MOE
    n_layer: int
    n_embd: int
    n_ff: int  # {arch}.feed_forward_length as the real file has it (qwen3moe's is unused)
    n_head: int
    n_head_kv: int
    head_dim: int
    n_expert: int
    n_expert_used: int
    n_ff_exp: int  # one expert's FFN width
    n_vocab: int
    n_ctx: int
    rope_base: float
    norm_eps: float
    qk_norm: bool = False  # qwen3moe's per-head attn_q_norm / attn_k_norm
    gpt_oss: bool = False  # biases on attention, router and experts; attention sinks; post_attention_norm as the FFN's norm
    window: int = 0  # gpt-oss's sliding window (even layers local, llama.cpp's default period of 2)
    yarn: tuple[float, int] | None = None  # YaRN RoPE: factor, original context

    def cut(self, layers: int | None = None, vocab: int | None = None) -> MoeShape:
        """The same shape with only its first `layers` layers (each the real layer's size)
        and/or a vocabulary of `vocab` tokens, named so (NAME-L2-V49536)."""
        s = self if layers in (None, self.n_layer) else replace(self, name=f"{self.name}-L{layers}", n_layer=layers)
        return s if vocab in (None, s.n_vocab) else replace(s, name=f"{s.name}-V{vocab}", n_vocab=vocab)


MOE_SHAPES = {s.name: s for s in [
    MoeShape("qwen3-30b-a3b", "qwen3moe", "Q4_K_M", 48, 2048, 6144, 32, 4, 128, 128, 8, 768, 151_936, 40_960, 1e6, 1e-6, qk_norm=True),
    MoeShape("gpt-oss-20b", "gpt-oss", "MXFP4_MOE", 24, 2880, 2880, 64, 8, 64, 32, 4, 2880, 201_088, 131_072, 150_000.0, 1e-5,
             gpt_oss=True, window=128, yarn=(32.0, 4096)),
]}  # fmt: skip


@dataclass(frozen=True)
class MoeTensor:
    name: str
    shape: tuple[int, ...]  # numpy order: [n_expert, rows, cols] for experts (GGUF lists it reversed)
    type: GGMLQuantizationType
    kind: str  # matrix (quantized) | norm | bias | router (F32)

    @property
    def nbytes(self) -> int:
        block, size = GGML_QUANT_SIZES[self.type]
        return math.prod(self.shape) // block * size

    @property
    def byte_shape(self) -> tuple[int, ...]:
        """The shape of its data as written: a quantized row's bytes, an F32 tensor's values."""
        if self.type == T.F32:
            return self.shape
        block, size = GGML_QUANT_SIZES[self.type]
        return (*self.shape[:-1], self.shape[-1] // block * size)


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's use_more_bits: the layers whose attn_v and ffn_down a _M K-quant raises."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


def matrix_type(s: MoeShape, name: str, i_layer: int) -> GGMLQuantizationType:
    """A weight matrix's block type in the real file (see the module docstring)."""
    if s.ftype == "MXFP4_MOE":
        return T.MXFP4 if name.endswith("_exps.weight") else T.Q8_0
    if name == "output.weight":
        return T.Q6_K
    if name.endswith(("attn_v.weight", "ffn_down_exps.weight")) and use_more_bits(i_layer, s.n_layer):
        return T.Q6_K
    return T.Q4_K


def tensor_plan(s: MoeShape) -> list[MoeTensor]:
    """Every tensor of the shape, with its block type; the embedding first, the output last."""
    def matrix(name: str, *shape: int, i_layer: int = -1) -> MoeTensor:
        qtype = matrix_type(s, name, i_layer)
        if shape[-1] % GGML_QUANT_SIZES[qtype][0]:
            raise ValueError(f"{s.name}: {name}'s rows of {shape[-1]} are no whole number of {qtype.name} blocks")
        return MoeTensor(name, shape, qtype, "matrix")

    plan = [matrix("token_embd.weight", s.n_vocab, s.n_embd)]
    for i in range(s.n_layer):
        plan += layer_plan(s, f"blk.{i}.", lambda name, *shape, i=i: matrix(name, *shape, i_layer=i))
    return plan + [MoeTensor("output_norm.weight", (s.n_embd,), T.F32, "norm"), matrix("output.weight", s.n_vocab, s.n_embd)]


def layer_plan(s: MoeShape, p: str, matrix: Callable[..., MoeTensor]) -> list[MoeTensor]:
    """One layer's tensors under llama.cpp's names (llama_model_qwen3moe / llama_model_openai_moe)."""
    q, kv, e = s.n_head * s.head_dim, s.n_head_kv * s.head_dim, s.n_expert
    f32 = lambda name, kind, *shape: MoeTensor(p + name, shape, T.F32, kind)  # noqa: E731
    plan = [f32("attn_norm.weight", "norm", s.n_embd)]
    for kind, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
        plan.append(matrix(f"{p}{kind}.weight", rows, s.n_embd))
        plan += [f32(f"{kind}.bias", "bias", rows)] if s.gpt_oss else []
    if s.qk_norm:
        plan += [f32("attn_q_norm.weight", "norm", s.head_dim), f32("attn_k_norm.weight", "norm", s.head_dim)]
    plan.append(matrix(p + "attn_output.weight", s.n_embd, q))
    if s.gpt_oss:  # the sinks: one raw logit per head; post_attention_norm is the FFN's input norm
        plan += [f32("attn_output.bias", "bias", s.n_embd), f32("attn_sinks.weight", "bias", s.n_head), f32("post_attention_norm.weight", "norm", s.n_embd)]
    else:
        plan.append(f32("ffn_norm.weight", "norm", s.n_embd))
    plan.append(f32("ffn_gate_inp.weight", "router", e, s.n_embd))
    plan += [f32("ffn_gate_inp.bias", "bias", e)] if s.gpt_oss else []
    for kind, rows, cols in (("ffn_gate_exps", s.n_ff_exp, s.n_embd), ("ffn_up_exps", s.n_ff_exp, s.n_embd), ("ffn_down_exps", s.n_embd, s.n_ff_exp)):
        plan.append(matrix(f"{p}{kind}.weight", e, rows, cols))
        plan += [f32(f"{kind}.bias", "bias", e, rows)] if s.gpt_oss else []
    return plan


def n_params(s: MoeShape) -> tuple[int, int]:
    """(all parameters, those one token computes with: n_expert_used / n_expert of the experts')."""
    counts = [(math.prod(t.shape), "_exps." in t.name) for t in tensor_plan(s)]
    experts = sum(n for n, expert in counts if expert)
    total = sum(n for n, _ in counts)
    return total, total - experts + experts * s.n_expert_used // s.n_expert


def add_metadata(w, s: MoeShape, file_type: int) -> None:  # w: gguf.GGUFWriter
    """The hyperparameters under llama.cpp's keys, as the real files have them (no
    rope.dimension_count: llama.cpp takes the head size)."""
    w.add_name(f"synthetic {s.name}")
    w.add_file_type(file_type)
    w.add_quantization_version(2)  # GGML_QNT_VERSION
    w.add_block_count(s.n_layer)
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    w.add_rope_freq_base(s.rope_base)
    w.add_layer_norm_rms_eps(s.norm_eps)
    w.add_expert_count(s.n_expert)
    w.add_expert_used_count(s.n_expert_used)
    w.add_expert_feed_forward_length(s.n_ff_exp)
    w.add_key_length(s.head_dim)
    w.add_value_length(s.head_dim)
    if s.window:
        w.add_sliding_window(s.window)
    if s.yarn:
        w.add_rope_scaling_type(RopeScalingType.YARN)
        w.add_rope_scaling_factor(s.yarn[0])
        w.add_rope_scaling_orig_ctx_len(s.yarn[1])


@cache
def block_pool(qtype: GGMLQuantizationType, seed: int) -> np.ndarray:
    """[POOL_BLOCKS, type size] uint8: blocks of `qtype` quantized from normal(0, 0.02) values."""
    from localinfer_quant.codecs import quantize

    block, _ = GGML_QUANT_SIZES[qtype]
    rng = np.random.default_rng([seed, int(qtype), 0x9007])
    return quantize(WEIGHT_STD * rng.standard_normal((POOL_BLOCKS, block), dtype=np.float32), qtype)


def tensor_data(t: MoeTensor, seed: int, rng: np.random.Generator) -> np.ndarray:
    """One tensor's data: blocks drawn from its type's pool, or F32 values."""
    if t.type == T.F32:
        values = WEIGHT_STD * rng.standard_normal(t.shape, dtype=np.float32)
        return values + np.float32(1.0) if t.kind == "norm" else values
    pool = block_pool(t.type, seed)
    out = np.empty((t.nbytes // pool.shape[1], pool.shape[1]), np.uint8)  # [blocks, type size]
    for start in range(0, len(out), TAKE_BLOCKS):
        part = out[start : start + TAKE_BLOCKS]
        np.take(pool, rng.integers(0, len(pool), len(part), dtype=np.int32), axis=0, out=part)
    return out.reshape(t.byte_shape)


def write(s: MoeShape, path: Path, seed: int, progress: Callable[[int, int, str], None], vocabulary: Callable[[object, int], None]) -> None:
    """The GGUF, streamed: metadata and tensor infos, then each tensor as it is drawn, into a
    hidden temporary file renamed to `path` only when whole. `vocabulary(writer, n_vocab)`
    adds the tokenizer; `progress(done MB, total MB, tensor)` is called before each tensor."""
    from gguf import GGUFWriter

    from localinfer_quant.quantize import ftypes

    plan = tensor_plan(s)
    total = sum(t.nbytes for t in plan)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        w = GGUFWriter(str(tmp), s.arch)
        add_metadata(w, s, ftypes()[s.ftype])
        vocabulary(w, s.n_vocab)
        for t in plan:
            dtype = np.dtype(np.float32 if t.type == T.F32 else np.uint8)
            w.add_tensor_info(t.name, t.byte_shape, dtype, t.nbytes, raw_dtype=None if t.type == T.F32 else t.type)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        done = 0
        for i, t in enumerate(plan):
            progress(done // MB, total // MB, t.name)
            w.write_tensor_data(tensor_data(t, seed, np.random.default_rng([seed, i])))  # per tensor: any one is reproducible alone
            done += t.nbytes
        progress(total // MB, total // MB, "")
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
