"""A tiny llama GGUF (a few dozen KB) with every tensor kind the native engine reads, and a
map of where each header field lies in its bytes: the seed and the map that the model-file
fuzzer mutates. Small enough that one case (write, scan, load, one forward) takes a few ms."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf import GGUFWriter

from localinfer_quant.codecs import quantize

N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV, N_VOCAB = 64, 256, 2, 4, 2, 48
HEAD_DIM = N_EMBD // N_HEAD
# a type per product, so that each kernel family reads mutated blocks (k-quants need
# 256-value rows: only ffn_down's are that long here)
MATRIX_TYPES = {"attn_q": T.Q4_0, "attn_k": T.Q8_0, "attn_v": T.F16, "attn_output": T.Q4_1, "ffn_gate": T.Q5_1, "ffn_up": T.Q5_0}
FFN_DOWN_TYPES = (T.Q4_K, T.Q6_K)  # per layer


def embedded_vocabulary() -> dict[str, object]:
    """The embedded model's BPE vocabulary (49,152 tokens and their merges): the other
    tokenizer family, whose loading in llama.cpp is a different code path."""
    from gguf import GGUFReader

    from localinfer_quant.source import embedded_model_path

    fields = GGUFReader(embedded_model_path()).fields
    return {key: fields[key].contents() for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")}


def write_tiny_model(path: Path, seed: int = 0, bpe: dict[str, object] | None = None) -> Path:
    """The tiny model, with a 48-token SentencePiece-style vocabulary, or with `bpe`'s."""
    rng = np.random.default_rng(seed)
    n_vocab = len(bpe["tokenizer.ggml.tokens"]) if bpe else N_VOCAB
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny")
    w.add_block_count(N_LAYER)
    w.add_context_length(256)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(N_HEAD_KV)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    if bpe:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(bpe["tokenizer.ggml.tokens"])
        w.add_token_types(bpe["tokenizer.ggml.token_type"])
        w.add_token_merges(bpe["tokenizer.ggml.merges"])
    else:
        w.add_tokenizer_model("llama")
        w.add_token_list([f"t{i}" for i in range(N_VOCAB)])
        w.add_token_scores([float(-i) for i in range(N_VOCAB)])
        w.add_token_types([1] * N_VOCAB)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template("{% for m in messages %}{{ m.content }}{% endfor %}")

    def matrix(name: str, rows: int, cols: int, qtype: T) -> None:
        x = (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)
        if qtype == T.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            w.add_tensor(name, quantize(x, qtype), raw_dtype=qtype)

    def norm(name: str) -> None:
        w.add_tensor(name, (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32))

    matrix("token_embd.weight", n_vocab, N_EMBD, T.Q8_0)
    norm("output_norm.weight")
    matrix("output.weight", n_vocab, N_EMBD, T.Q4_0)
    q, kv = N_HEAD * HEAD_DIM, N_HEAD_KV * HEAD_DIM
    shapes = {"attn_q": (q, N_EMBD), "attn_k": (kv, N_EMBD), "attn_v": (kv, N_EMBD), "attn_output": (N_EMBD, q),
              "ffn_gate": (N_FF, N_EMBD), "ffn_up": (N_FF, N_EMBD), "ffn_down": (N_EMBD, N_FF)}  # fmt: skip
    for i in range(N_LAYER):
        norm(f"blk.{i}.attn_norm.weight")
        norm(f"blk.{i}.ffn_norm.weight")
        for kind, (rows, cols) in shapes.items():
            matrix(f"blk.{i}.{kind}.weight", rows, cols, MATRIX_TYPES.get(kind) or FFN_DOWN_TYPES[i % 2])
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@dataclass(frozen=True)
class Field:
    """One header field: its bytes are data[start:start + size]."""

    start: int
    size: int
    kind: str  # version, count, length, vtype, int, float, bytes, ndims, dim, ttype, offset, tensor_data
    label: str


@dataclass(frozen=True)
class Layout:
    fields: list[Field]
    data_start: int
    tensors: list[tuple[str, int, int, int]]  # name, ggml type, absolute offset, bytes


SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def layout(data: bytes) -> Layout:
    """Where every field of a well-formed GGUF lies (the seed's map; mutants are not parsed)."""
    from gguf import GGML_QUANT_SIZES

    fields: list[Field] = []
    pos = 0

    def take(size: int, kind: str, label: str, fmt: str | None = None) -> int:
        nonlocal pos
        fields.append(Field(pos, size, kind, label))
        value = struct.unpack_from(fmt, data, pos)[0] if fmt else 0
        pos += size
        return value

    def string(label: str) -> str:
        n = take(8, "length", label + ".length", "<Q")
        text = data[pos : pos + n].decode()
        take(n, "bytes", label)
        return text

    def value(vtype: int, label: str) -> None:
        if vtype in SCALAR:
            kind = "float" if vtype in (6, 12) else "int"
            take(SCALAR[vtype], kind, label)
        elif vtype == 8:
            string(label)
        elif vtype == 9:
            etype = take(4, "vtype", label + ".element_type", "<I")
            count = take(8, "count", label + ".count", "<Q")
            for i in range(count):
                value(etype, f"{label}[{i}]")

    take(4, "magic", "magic")
    take(4, "version", "version")
    n_tensors = take(8, "count", "n_tensors", "<Q")
    n_kv = take(8, "count", "n_kv", "<Q")
    for _ in range(n_kv):
        key = string("key")
        value(take(4, "vtype", key + ".type", "<I"), key)
    infos = []
    for _ in range(n_tensors):
        name = string("tensor_name")
        fields[-1] = Field(fields[-1].start, fields[-1].size, "bytes", name + ".name")
        n_dims = take(4, "ndims", name + ".n_dims", "<I")
        dims = [take(8, "dim", f"{name}.dim{d}", "<Q") for d in range(n_dims)]
        ttype = take(4, "ttype", name + ".type", "<I")
        offset = take(8, "offset", name + ".offset", "<Q")
        infos.append((name, dims, ttype, offset))
    data_start = -(-pos // 32) * 32
    tensors = []
    for name, dims, ttype, offset in infos:
        block, size = GGML_QUANT_SIZES[T(ttype)]
        nbytes = int(np.prod(dims)) // block * size
        tensors.append((name, ttype, data_start + offset, nbytes))
        fields.append(Field(data_start + offset, nbytes, "tensor_data", name))
    return Layout(fields, data_start, tensors)
