"""The model's tensors as views into one read-only mmap of the GGUF file.

Nothing is copied or expanded: kernels read the quantized blocks where they lie, and the
OS pages them in (and can page them out) like any file cache.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType

from localinfer.backends.native.config import ModelConfig, UnsupportedModel
from localinfer.errors import InvalidModelFile
from localinfer.modelfile import GGUFInfo, TensorInfo
from localinfer_native import Kernels, QMatrix
from localinfer_native.types import MoeFFN


# an architecture's FFN activation, as a mixture of experts names it (MoeFFN.activation)
EXPERT_ACTIVATION = {"silu": "swiglu", "gelu": "geglu", "swiglu_oai": "swiglu_oai"}


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray  # float32 [n_embd]
    wq: QMatrix
    wk: QMatrix
    wv: QMatrix
    q_bias: np.ndarray | None  # qwen2
    k_bias: np.ndarray | None
    v_bias: np.ndarray | None
    q_norm: np.ndarray | None  # qwen3, gemma3: float32 [head_dim], each head of q RMS-normed before RoPE
    k_norm: np.ndarray | None
    wo: QMatrix
    post_attn_norm: np.ndarray | None  # gemma3: the attention's output RMS-normed before the residual add
    ffn_norm: np.ndarray
    w_gate: QMatrix | None  # None where a mixture of experts takes the FFN's place
    w_up: QMatrix | None
    w_down: QMatrix | None
    post_ffn_norm: np.ndarray | None  # gemma3: likewise the FFN's
    moe: MoeFFN | None = None  # qwen3moe, gpt-oss: the router and the stacked experts
    o_bias: np.ndarray | None = None  # gpt-oss: the attention output's bias
    sinks: np.ndarray | None = None  # gpt-oss: float32 [n_head], each head's sink logit


@dataclass
class Weights:
    token_embd: QMatrix
    layers: list[LayerWeights]
    output_norm: np.ndarray
    output: QMatrix  # token_embd itself when the model ties them
    rope_freq_factors: np.ndarray | None  # per-frequency RoPE divisors: llama 3's, or phi3's short ones
    rope_factors_long: np.ndarray | None  # phi3's for contexts past the original one
    mapped_bytes: int
    _map: mmap.mmap

    @classmethod
    def open(cls, path: Path, info: GGUFInfo, config: ModelConfig, kernels: Kernels) -> Weights:
        """Every tensor's shape is checked against the config, and its type against what
        `kernels` runs, before a view is made: the kernels trust these sizes and read raw
        pointers into the map."""
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if len(mm) < info.file_size:  # the file shrank since it was inspected
            raise InvalidModelFile(f"{path.name} changed while it was being loaded")
        c, read = config, TensorReader(path, mm, info, config, kernels)
        layers = [read.layer(i) for i in range(c.n_layer)]
        read.refuse_unread_layer_tensors()
        token_embd = read.matrix("token_embd.weight", c.n_embd, c.n_vocab)
        half, has = c.rope.dims // 2, read.tensors.__contains__
        return cls(
            token_embd=token_embd,
            layers=layers,
            output_norm=read.vector("output_norm.weight", c.n_embd),
            output=read.matrix("output.weight", c.n_embd, c.n_vocab) if has("output.weight") else token_embd,
            rope_freq_factors=read.vector("rope_freqs.weight" if has("rope_freqs.weight") else "rope_factors_short.weight", half, required=False),
            rope_factors_long=read.vector("rope_factors_long.weight", half, required=False),
            mapped_bytes=len(mm),
            _map=mm,
        )

    def close(self) -> None:
        # Views into the map may outlive us (numpy holds the buffer); closing would
        # then raise BufferError, and the map goes away with its last view anyway.
        try:
            self._map.close()
        except BufferError:
            pass


class TensorReader:
    """Checked views of one mapped GGUF's tensors, by their GGUF names."""

    def __init__(self, path: Path, mm: mmap.mmap, info: GGUFInfo, config: ModelConfig, kernels: Kernels) -> None:
        self.path, self.mm, self.config, self.kernels = path, mm, config, kernels
        self.tensors = {t.name: t for t in info.tensors}
        self.read: set[str] = set()  # the names a view was made of

    def raw(self, t: TensorInfo, shape: tuple[int, ...]) -> np.ndarray:
        got = t.shape
        while len(got) > len(shape) and got[-1] == 1:
            got = got[:-1]
        if got != shape:
            raise InvalidModelFile(f"{self.path.name} has tensor {t.name} of shape {list(t.shape)} where this model's sizes need {list(shape)}")
        self.read.add(t.name)
        return np.frombuffer(self.mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

    def matrix(self, name: str, cols: int, rows: int) -> QMatrix:
        t, qtype = self.weight(name)
        return QMatrix.from_array(qtype, self.raw(t, (cols, rows)), cols)

    def experts(self, name: str, cols: int, rows: int) -> QMatrix:
        """A mixture of experts' stacked tensor, {cols, rows, n_expert} in GGUF's order, as
        one matrix of n_expert * rows rows (a view: expert e's are rows e * rows onwards)."""
        t, qtype = self.weight(name)
        return QMatrix.from_array(qtype, self.raw(t, (cols, rows, self.config.n_expert)), cols)

    def weight(self, name: str) -> tuple[TensorInfo, GGMLQuantizationType]:
        """A weight tensor the model needs, in a type the kernels run."""
        t = self.tensors.get(name)
        if t is None:
            raise UnsupportedModel(f"{self.path.name} has no tensor '{name}', which a {self.config.architecture} model needs; use --engine llama.cpp")
        qtype = GGMLQuantizationType(t.type)
        if qtype not in self.kernels.supported_types:
            raise UnsupportedModel(f"type {qtype.name} (tensor {name}) is not supported by the native engine's {self.kernels.name} kernels; use --engine llama.cpp")
        return t, qtype

    def refuse_unread_layer_tensors(self) -> None:
        """A layer tensor the forward pass would not read means a part of the model it would
        leave out (a bias, a shared expert, a newer file's scales): refuse it, as llama.cpp
        refuses a file with tensors it did not create."""
        unread = sorted(name for name in self.tensors if name.startswith("blk.") and name not in self.read)
        if unread:
            more = f" and {len(unread) - 3} more" if len(unread) > 3 else ""
            raise UnsupportedModel(f"{self.path.name} has layer tensors the native engine does not read ({', '.join(unread[:3])}{more}); use --engine llama.cpp")

    def moe(self, p: str) -> MoeFFN:
        """Layer prefix p's router and experts (llama_model_qwen3moe's and
        llama_model_openai_moe's tensors: gpt-oss adds a bias to each)."""
        c = self.config
        return MoeFFN(
            router=self.matrix(p + "ffn_gate_inp.weight", c.n_embd, c.n_expert),
            gate=self.experts(p + "ffn_gate_exps.weight", c.n_embd, c.n_ff_exp),
            up=self.experts(p + "ffn_up_exps.weight", c.n_embd, c.n_ff_exp),
            down=self.experts(p + "ffn_down_exps.weight", c.n_ff_exp, c.n_embd),
            n_expert=c.n_expert, n_used=c.n_expert_used, gating=c.kind.router, activation=EXPERT_ACTIVATION[c.kind.activation],
            router_bias=self.vector(p + "ffn_gate_inp.bias", c.n_expert, required=False),
            gate_bias=self.expert_bias(p + "ffn_gate_exps.bias", c.n_ff_exp),
            up_bias=self.expert_bias(p + "ffn_up_exps.bias", c.n_ff_exp),
            down_bias=self.expert_bias(p + "ffn_down_exps.bias", c.n_embd),
        )  # fmt: skip

    def expert_bias(self, name: str, length: int) -> np.ndarray | None:
        """Every expert's bias, {length, n_expert} in GGUF's order: float32 [n_expert, length]."""
        t = self.tensors.get(name)
        if t is None:
            return None
        if t.type != GGMLQuantizationType.F32:
            raise UnsupportedModel(f"tensor {name} is {GGMLQuantizationType(t.type).name}, the native engine expects F32; use --engine llama.cpp")
        return self.raw(t, (length, self.config.n_expert)).view(np.float32).reshape(self.config.n_expert, length)

    def vector(self, name: str, length: int, required: bool = True) -> np.ndarray | None:
        t = self.tensors.get(name)
        if t is None:
            if required:
                raise UnsupportedModel(f"{self.path.name} has no tensor '{name}'; use --engine llama.cpp")
            return None
        if t.type != GGMLQuantizationType.F32:
            raise UnsupportedModel(f"tensor {name} is {GGMLQuantizationType(t.type).name}, the native engine expects F32; use --engine llama.cpp")
        return self.raw(t, (length,)).view(np.float32)

    def split(self, name: str, cols: int, sizes: tuple[int, ...]) -> list[QMatrix]:
        """A fused tensor's consecutive row ranges, each a matrix of its own (views, no copy)."""
        m, start, parts = self.matrix(name, cols, sum(sizes)), 0, []
        for rows in sizes:
            parts.append(QMatrix(m.type, m.data[start : start + rows], rows, cols))
            start += rows
        return parts

    def ffn(self, p: str) -> tuple[QMatrix | None, QMatrix | None, QMatrix | None, MoeFFN | None]:
        """Layer prefix p's gate, up and down matrices, or its mixture of experts."""
        c = self.config
        if c.kind.router:
            return None, None, None, self.moe(p)
        if c.kind.fused_gate_up:  # phi3: the gate's rows, then the up's
            w_gate, w_up = self.split(p + "ffn_up.weight", c.n_embd, (c.n_ff, c.n_ff))
        else:
            w_gate, w_up = self.matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff), self.matrix(p + "ffn_up.weight", c.n_embd, c.n_ff)
        return w_gate, w_up, self.matrix(p + "ffn_down.weight", c.n_ff, c.n_embd), None

    def layer(self, i: int) -> LayerWeights:
        c, p, matrix, vector = self.config, f"blk.{i}.", self.matrix, self.vector
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim
        if p + "attn_qkv.weight" in self.tensors:  # phi3's fused q/k/v (llama.cpp takes it for any architecture)
            wq, wk, wv = self.split(p + "attn_qkv.weight", c.n_embd, (q_dim, kv_dim, kv_dim))
        else:
            wq, wk, wv = (matrix(p + f"attn_{x}.weight", c.n_embd, rows) for x, rows in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)))
        w_gate, w_up, w_down, moe = self.ffn(p)
        qk_norm, post = c.kind.qk_norm, c.kind.post_norms
        lw = LayerWeights(
            attn_norm=vector(p + "attn_norm.weight", c.n_embd),
            wq=wq, wk=wk, wv=wv,
            q_bias=vector(p + "attn_q.bias", q_dim, required=False),
            k_bias=vector(p + "attn_k.bias", kv_dim, required=False),
            v_bias=vector(p + "attn_v.bias", kv_dim, required=False),
            q_norm=vector(p + "attn_q_norm.weight", c.head_dim) if qk_norm else None,
            k_norm=vector(p + "attn_k_norm.weight", c.head_dim) if qk_norm else None,
            wo=matrix(p + "attn_output.weight", q_dim, c.n_embd),
            post_attn_norm=vector(p + "post_attention_norm.weight", c.n_embd) if post else None,
            ffn_norm=vector(p + c.kind.ffn_norm + ".weight", c.n_embd),
            w_gate=w_gate, w_up=w_up, w_down=w_down,
            post_ffn_norm=vector(p + "post_ffw_norm.weight", c.n_embd) if post else None,
            moe=moe,
            o_bias=vector(p + "attn_output.bias", c.n_embd, required=False),
            sinks=vector(p + "attn_sinks.weight", c.n_head) if c.kind.attn_sinks else None,
        )  # fmt: skip
        if len({lw.q_bias is None, lw.k_bias is None, lw.v_bias is None}) > 1:
            raise InvalidModelFile(f"{self.path.name} has some of layer {i}'s q/k/v biases but not all three")
        return lw
