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


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: np.ndarray  # float32 [n_embd]
    wq: QMatrix
    wk: QMatrix
    wv: QMatrix
    q_bias: np.ndarray | None  # qwen2
    k_bias: np.ndarray | None
    v_bias: np.ndarray | None
    wo: QMatrix
    ffn_norm: np.ndarray
    w_gate: QMatrix
    w_up: QMatrix
    w_down: QMatrix


@dataclass
class Weights:
    token_embd: QMatrix
    layers: list[LayerWeights]
    output_norm: np.ndarray
    output: QMatrix  # token_embd itself when the model ties them
    rope_freq_factors: np.ndarray | None  # llama 3's per-frequency RoPE divisors
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
        tensors = {t.name: t for t in info.tensors}
        c = config
        q_dim, kv_dim = c.n_head * c.head_dim, c.n_head_kv * c.head_dim

        def raw(t: TensorInfo, shape: tuple[int, ...]) -> np.ndarray:
            got = t.shape
            while len(got) > len(shape) and got[-1] == 1:
                got = got[:-1]
            if got != shape:
                raise InvalidModelFile(f"{path.name} has tensor {t.name} of shape {list(t.shape)} where this model's sizes need {list(shape)}")
            return np.frombuffer(mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

        def matrix(name: str, cols: int, rows: int) -> QMatrix:
            t = tensors.get(name)
            if t is None:
                raise UnsupportedModel(f"{path.name} has no tensor '{name}', which a {config.architecture} model needs; use --engine llama.cpp")
            qtype = GGMLQuantizationType(t.type)
            if qtype not in kernels.supported_types:
                raise UnsupportedModel(f"type {qtype.name} (tensor {name}) is not supported by the native engine's {kernels.name} kernels; use --engine llama.cpp")
            return QMatrix.from_array(qtype, raw(t, (cols, rows)), cols)

        def vector(name: str, length: int, required: bool = True) -> np.ndarray | None:
            t = tensors.get(name)
            if t is None:
                if required:
                    raise UnsupportedModel(f"{path.name} has no tensor '{name}'; use --engine llama.cpp")
                return None
            if t.type != GGMLQuantizationType.F32:
                raise UnsupportedModel(f"tensor {name} is {GGMLQuantizationType(t.type).name}, the native engine expects F32; use --engine llama.cpp")
            return raw(t, (length,)).view(np.float32)

        layers = []
        for i in range(config.n_layer):
            p = f"blk.{i}."
            layers.append(
                LayerWeights(
                    attn_norm=vector(p + "attn_norm.weight", c.n_embd),
                    wq=matrix(p + "attn_q.weight", c.n_embd, q_dim),
                    wk=matrix(p + "attn_k.weight", c.n_embd, kv_dim),
                    wv=matrix(p + "attn_v.weight", c.n_embd, kv_dim),
                    q_bias=vector(p + "attn_q.bias", q_dim, required=False),
                    k_bias=vector(p + "attn_k.bias", kv_dim, required=False),
                    v_bias=vector(p + "attn_v.bias", kv_dim, required=False),
                    wo=matrix(p + "attn_output.weight", q_dim, c.n_embd),
                    ffn_norm=vector(p + "ffn_norm.weight", c.n_embd),
                    w_gate=matrix(p + "ffn_gate.weight", c.n_embd, c.n_ff),
                    w_up=matrix(p + "ffn_up.weight", c.n_embd, c.n_ff),
                    w_down=matrix(p + "ffn_down.weight", c.n_ff, c.n_embd),
                )
            )
            lw = layers[-1]
            if len({lw.q_bias is None, lw.k_bias is None, lw.v_bias is None}) > 1:
                raise InvalidModelFile(f"{path.name} has some of layer {i}'s q/k/v biases but not all three")
        token_embd = matrix("token_embd.weight", c.n_embd, c.n_vocab)
        return cls(
            token_embd=token_embd,
            layers=layers,
            output_norm=vector("output_norm.weight", c.n_embd),
            output=matrix("output.weight", c.n_embd, c.n_vocab) if "output.weight" in tensors else token_embd,
            rope_freq_factors=vector("rope_freqs.weight", c.rope_dims // 2, required=False),
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
