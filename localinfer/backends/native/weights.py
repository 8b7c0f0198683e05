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
from localinfer.modelfile import GGUFInfo, TensorInfo
from localinfer_native import SUPPORTED_TYPES, QMatrix


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
    def open(cls, path: Path, info: GGUFInfo, config: ModelConfig) -> Weights:
        with open(path, "rb") as f:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        tensors = {t.name: t for t in info.tensors}

        def raw(t: TensorInfo) -> np.ndarray:
            return np.frombuffer(mm, dtype=np.uint8, count=t.nbytes, offset=t.offset)

        def matrix(name: str) -> QMatrix:
            t = tensors.get(name)
            if t is None:
                raise UnsupportedModel(f"{path.name} has no tensor '{name}', which a {config.architecture} model needs; use --engine llama.cpp")
            qtype = GGMLQuantizationType(t.type)
            if qtype not in SUPPORTED_TYPES:
                raise UnsupportedModel(f"type {qtype.name} (tensor {name}) is not supported by the native engine; use --engine llama.cpp")
            return QMatrix.from_array(qtype, raw(t), t.shape[0])

        def vector(name: str, required: bool = True) -> np.ndarray | None:
            t = tensors.get(name)
            if t is None:
                if required:
                    raise UnsupportedModel(f"{path.name} has no tensor '{name}'; use --engine llama.cpp")
                return None
            if t.type != GGMLQuantizationType.F32:
                raise UnsupportedModel(f"tensor {name} is {GGMLQuantizationType(t.type).name}, the native engine expects F32; use --engine llama.cpp")
            return raw(t).view(np.float32)

        layers = []
        for i in range(config.n_layer):
            p = f"blk.{i}."
            layers.append(
                LayerWeights(
                    attn_norm=vector(p + "attn_norm.weight"),
                    wq=matrix(p + "attn_q.weight"),
                    wk=matrix(p + "attn_k.weight"),
                    wv=matrix(p + "attn_v.weight"),
                    q_bias=vector(p + "attn_q.bias", required=False),
                    k_bias=vector(p + "attn_k.bias", required=False),
                    v_bias=vector(p + "attn_v.bias", required=False),
                    wo=matrix(p + "attn_output.weight"),
                    ffn_norm=vector(p + "ffn_norm.weight"),
                    w_gate=matrix(p + "ffn_gate.weight"),
                    w_up=matrix(p + "ffn_up.weight"),
                    w_down=matrix(p + "ffn_down.weight"),
                )
            )
        token_embd = matrix("token_embd.weight")
        return cls(
            token_embd=token_embd,
            layers=layers,
            output_norm=vector("output_norm.weight"),
            output=matrix("output.weight") if "output.weight" in tensors else token_embd,
            rope_freq_factors=vector("rope_freqs.weight", required=False),
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
