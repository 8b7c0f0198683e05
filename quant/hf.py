"""GGUF <-> Hugging Face checkpoint folders, for the llama family (llama, mistral, qwen2,
qwen3); BERT encoders are imported by bert.py, which `import_hf` hands them to.

The quantization toolkit starts from a high-precision source, and real sources are HF
folders (config.json, tokenizer files, safetensors). Without network the only real model
is a GGUF, so we go both ways: `export_hf` writes a GGUF as a true HF checkpoint and
`import_hf` writes an HF checkpoint as an F16 GGUF, as llama.cpp's converter would.

Two details make the folders real rather than look-alikes:
- llama.cpp's converter permutes the rows of q_proj/k_proj for llama/mistral (each
  head's rotary pairs made adjacent, for its interleaved RoPE); export undoes it, import
  redoes it. qwen2 keeps HF order (llama.cpp runs it with NeoX RoPE) and has q/k/v biases;
  qwen3 keeps HF order too, without biases, with a per-head RMSNorm of q and k.
- The tokenizer is byte-level BPE; its pre-tokenizer has no name in tokenizer.json, so
  the known ones are recognised by their structure (`PRE_TOKENIZERS`).

safetensors is read and written here directly (an 8-byte header length, a JSON header,
raw little-endian data), so no extra dependency is needed.
"""

from __future__ import annotations

import json
import re
import struct
from pathlib import Path
from typing import Any, Callable, Iterable

import gguf
import numpy as np

from localinfer_quant.source import TensorPlan, gguf_architecture, tensor_f32, widened_dtype, write_gguf

Q = gguf.GGMLQuantizationType
TT = gguf.TokenType


class UnsupportedSource(ValueError):
    """A model (architecture, tokenizer, tensor, RoPE scaling) these converters do not handle."""


# --- families ----------------------------------------------------------------------------
# HF model_type -> (GGUF architecture, HF architectures class, q/k rows permuted in GGUF)
FAMILIES: dict[str, tuple[str, str, bool]] = {
    "llama": ("llama", "LlamaForCausalLM", True),
    "mistral": ("llama", "MistralForCausalLM", True),
    "qwen2": ("qwen2", "Qwen2ForCausalLM", False),
    "qwen3": ("qwen3", "Qwen3ForCausalLM", False),
}
# HF model_type -> the architectures classes bert.py converts (llama.cpp's BertModel)
ENCODERS: dict[str, tuple[str, ...]] = {"bert": ("BertModel", "BertForMaskedLM")}
SUPPORTED = ", ".join([*FAMILIES, *ENCODERS])
GGUF_TO_MODEL_TYPE = {"llama": "llama", "qwen2": "qwen2"}
POOLED_DECODERS = ("qwen2", "qwen3")  # GGUF architectures whose folders may carry sentence-transformers' pooling

# --- tensor names ------------------------------------------------------------------------
GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
BLOCK_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
HF_BLOCK_NAMES = {v: k for k, v in BLOCK_NAMES.items()}
HF_GLOBAL_NAMES = {v: k for k, v in GLOBAL_NAMES.items()}
GGUF_BLOCK = re.compile(r"^blk\.(\d+)\.(\w+)\.(weight|bias)$")
HF_BLOCK = re.compile(r"^model\.layers\.(\d+)\.([\w.]+)\.(weight|bias)$")
HF_IGNORED = re.compile(r"rotary_emb\.inv_freq$")  # a buffer some old checkpoints saved


def hf_name(gguf_name: str) -> str:
    """GGUF tensor name -> HF name, e.g. blk.3.attn_q.weight -> model.layers.3.self_attn.q_proj.weight."""
    if gguf_name in GLOBAL_NAMES:
        return GLOBAL_NAMES[gguf_name]
    m = GGUF_BLOCK.match(gguf_name)
    if m and m.group(2) in BLOCK_NAMES:
        return f"model.layers.{m.group(1)}.{BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise UnsupportedSource(f"tensor '{gguf_name}' has no Hugging Face llama-family name")


def gguf_name(hf: str) -> str:
    """HF tensor name -> GGUF name; the inverse of `hf_name`. A checkpoint saved from the
    bare model (sentence-transformers' Qwen3-Embedding: layers.0..., embed_tokens) has no
    `model.` prefix; it is read as if it had, as llama.cpp's converter maps both."""
    if not hf.startswith("model.") and hf != "lm_head.weight":
        hf = "model." + hf
    if hf in HF_GLOBAL_NAMES:
        return HF_GLOBAL_NAMES[hf]
    m = HF_BLOCK.match(hf)
    if m and m.group(2) in HF_BLOCK_NAMES:
        return f"blk.{m.group(1)}.{HF_BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise UnsupportedSource(f"tensor '{hf}' is not part of a llama-family checkpoint")


# --- the q/k row permutation -------------------------------------------------------------
def permute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """HF order -> GGUF order: llama.cpp's converter `permute` (rotary halves interleaved)."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, 2, head_dim // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def unpermute_qk(w: np.ndarray, n_head: int) -> np.ndarray:
    """GGUF order -> HF order: the inverse of `permute_qk`."""
    head_dim = w.shape[0] // n_head
    return w.reshape(n_head, head_dim // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def qk_heads(name: str, n_head: int, n_head_kv: int) -> int | None:
    """How many heads to (un)permute a tensor by: q by n_head, k by n_head_kv, else None."""
    if ".attn_q." in name:
        return n_head
    if ".attn_k." in name:
        return n_head_kv
    return None


# --- safetensors -------------------------------------------------------------------------
ST_DTYPES = {"F16": np.float16, "F32": np.float32, "F64": np.float64, "I8": np.int8, "I16": np.int16,
             "I32": np.int32, "I64": np.int64, "U8": np.uint8, "BOOL": np.bool_, "BF16": np.uint16}
ST_NAMES = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32"}


def write_safetensors(path: Path, plans: list[TensorPlan], metadata: dict[str, str] | None = None) -> None:
    """A .safetensors file from `plans`, computing one tensor at a time."""
    header: dict[str, Any] = {"__metadata__": metadata or {"format": "pt"}}
    offset = 0
    for p in plans:
        header[p.name] = {"dtype": ST_NAMES[p.dtype], "shape": list(p.shape), "data_offsets": [offset, offset + p.nbytes]}
        offset += p.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(blob)))
        f.write(blob)
        for p in plans:
            data = np.ascontiguousarray(p.load(), dtype=p.dtype.newbyteorder("<"))
            assert data.shape == p.shape, (p.name, data.shape, p.shape)
            f.write(data.tobytes())


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Name -> array (memory-mapped; BF16 comes back widened to float32)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    raw = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    return {name: _st_array(raw, spec, name) for name, spec in header.items()}


def _st_array(raw: np.ndarray, spec: dict[str, Any], name: str) -> np.ndarray:
    if spec["dtype"] not in ST_DTYPES:
        raise UnsupportedSource(f"tensor '{name}' has safetensors dtype {spec['dtype']}")
    begin, end = spec["data_offsets"]
    a = raw[begin:end].view(np.dtype(ST_DTYPES[spec["dtype"]]).newbyteorder("<")).reshape(spec["shape"])
    if spec["dtype"] == "BF16":
        return (a.astype(np.uint32) << 16).view(np.float32)
    return a


def read_checkpoint(folder: Path) -> dict[str, np.ndarray]:
    """All tensors of an HF folder: model.safetensors, or the shards its index names."""
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    else:
        files = sorted(p.name for p in folder.glob("*.safetensors"))
    if not files:
        raise UnsupportedSource(f"{folder} has no .safetensors weights (PyTorch .bin checkpoints are not supported)")
    tensors: dict[str, np.ndarray] = {}
    for name in files:
        tensors.update(read_safetensors(folder / name))
    return tensors


# --- pre-tokenizers ----------------------------------------------------------------------
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
               r"|\s*[\r\n]+|\s+(?!\S)|\s+")
LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _byte_level(use_regex: bool, trim_offsets: bool = True) -> dict[str, Any]:
    return {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": trim_offsets, "use_regex": use_regex}


def _split(regex: str) -> dict[str, Any]:
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": "Isolated", "invert": False}


# GGUF tokenizer.ggml.pre -> the tokenizer.json pre_tokenizer that means the same split.
PRE_TOKENIZERS: dict[str, dict[str, Any]] = {
    "smollm": {"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True}, _byte_level(True)]},
    "gpt2": _byte_level(True),
    "qwen2": {"type": "Sequence", "pretokenizers": [_split(QWEN2_REGEX), _byte_level(False, trim_offsets=False)]},
    "llama-bpe": {"type": "Sequence", "pretokenizers": [_split(LLAMA3_REGEX), _byte_level(False)]},
}


def _pre_signature(pre: dict[str, Any] | None) -> tuple[tuple[Any, ...], ...]:
    """What decides a pre-tokenizer's split, without flags that do not (offsets, invert)."""
    if not pre:
        return ()
    parts = pre.get("pretokenizers", [pre]) if pre.get("type") == "Sequence" else [pre]
    sig = []
    for p in parts:
        kind = p.get("type")
        if kind == "Split":
            sig.append((kind, (p.get("pattern") or {}).get("Regex") or (p.get("pattern") or {}).get("String")))
        elif kind == "Digits":
            sig.append((kind, bool(p.get("individual_digits"))))
        elif kind == "ByteLevel":
            sig.append((kind, bool(p.get("use_regex", True)), bool(p.get("add_prefix_space", False))))
        else:
            sig.append((kind,))
    return tuple(sig)


def pre_name(pre_tokenizer: dict[str, Any] | None) -> str:
    """tokenizer.json's pre_tokenizer -> GGUF tokenizer.ggml.pre, or UnsupportedSource."""
    sig = _pre_signature(pre_tokenizer)
    for name, known in PRE_TOKENIZERS.items():
        if _pre_signature(known) == sig:
            return name
    raise UnsupportedSource(f"unknown pre-tokenizer {json.dumps(pre_tokenizer)[:200]}; known: {', '.join(PRE_TOKENIZERS)}")


# --- GGUF metadata helpers ---------------------------------------------------------------
SPECIAL_KEYS = {"bos": gguf.Keys.Tokenizer.BOS_ID, "eos": gguf.Keys.Tokenizer.EOS_ID,
                "unk": gguf.Keys.Tokenizer.UNK_ID, "pad": gguf.Keys.Tokenizer.PAD_ID}


def _f32(x: float) -> float:
    """A float32 metadata value as the short decimal it was written from (1e-05, not 9.99e-06)."""
    return float(str(np.float32(x)))

def _meta(reader: gguf.GGUFReader, key: str, default: Any = None) -> Any:
    field = reader.get_field(key)
    return default if field is None else field.contents()


# --- export: GGUF -> HF folder -----------------------------------------------------------
def export_hf(gguf_path: Path, out_dir: Path) -> Path:
    """Write `gguf_path` as an HF checkpoint folder (F16 safetensors) at `out_dir`; returns it.

    Quantized tensors are dequantized with our codecs; matrices are stored F16 and
    vectors F32, so an F16 GGUF goes out (and comes back through `import_hf`) bit for bit.
    """
    reader = gguf.GGUFReader(gguf_path)
    arch = gguf_architecture(reader)
    if arch not in GGUF_TO_MODEL_TYPE:
        raise UnsupportedSource(f"GGUF architecture '{arch}' cannot be exported; supported: {', '.join(GGUF_TO_MODEL_TYPE)}")
    config = hf_config(reader, arch)
    out_dir.mkdir(parents=True, exist_ok=True)
    _write_json(out_dir / "config.json", config)
    _write_json(out_dir / "generation_config.json", _generation_config(config))
    tokenizer, tokenizer_config = hf_tokenizer(reader)
    _write_json(out_dir / "tokenizer.json", tokenizer)
    _write_json(out_dir / "tokenizer_config.json", tokenizer_config)
    _write_json(out_dir / "special_tokens_map.json", _special_tokens_map(tokenizer_config))
    plans = export_plans(reader, config)
    write_safetensors(out_dir / "model.safetensors", plans)
    return out_dir


def hf_config(reader: gguf.GGUFReader, arch: str) -> dict[str, Any]:
    """config.json from the GGUF's hyperparameters."""
    names = {t.name for t in reader.tensors}
    if "rope_freqs.weight" in names:
        raise UnsupportedSource("GGUF has a rope_freqs tensor (llama3 RoPE scaling); export does not support it")
    n_embd = int(_meta(reader, f"{arch}.embedding_length"))
    n_head = int(_meta(reader, f"{arch}.attention.head_count"))
    rope_dim = _meta(reader, f"{arch}.rope.dimension_count", n_embd // n_head)
    head_dim = int(_meta(reader, f"{arch}.attention.key_length", rope_dim))
    embd = next(t for t in reader.tensors if t.name == "token_embd.weight")
    model_type = GGUF_TO_MODEL_TYPE[arch]
    config: dict[str, Any] = {
        "architectures": [FAMILIES[model_type][1]],
        "model_type": model_type,
        "hidden_size": n_embd,
        "intermediate_size": int(_meta(reader, f"{arch}.feed_forward_length")),
        "num_hidden_layers": int(_meta(reader, f"{arch}.block_count")),
        "num_attention_heads": n_head,
        "num_key_value_heads": int(_meta(reader, f"{arch}.attention.head_count_kv", n_head)),
        "head_dim": head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": _f32(_meta(reader, f"{arch}.attention.layer_norm_rms_epsilon")),
        "rope_theta": _f32(_meta(reader, f"{arch}.rope.freq_base", 10000.0)),
        "rope_scaling": _rope_scaling(reader, arch),
        "max_position_embeddings": int(_meta(reader, f"{arch}.context_length")),
        "vocab_size": int(embd.shape[1]),
        "tie_word_embeddings": "output.weight" not in names,
        "attention_bias": "blk.0.attn_q.bias" in names,
        "mlp_bias": False,
        "torch_dtype": "float16",
        "use_cache": True,
    }
    for kind in ("bos", "eos", "pad"):
        tid = _meta(reader, SPECIAL_KEYS[kind])
        if tid is not None:
            config[f"{kind}_token_id"] = int(tid)
    if model_type == "qwen2":
        config.pop("attention_bias")
        config.pop("mlp_bias")
        config.update(use_sliding_window=False, sliding_window=None, max_window_layers=config["num_hidden_layers"])
    return config


def _rope_scaling(reader: gguf.GGUFReader, arch: str) -> dict[str, Any] | None:
    kind = _meta(reader, f"{arch}.rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        factor = float(_meta(reader, f"{arch}.rope.scaling.factor"))
        return {"rope_type": "linear", "type": "linear", "factor": factor}
    raise UnsupportedSource(f"RoPE scaling '{kind}' cannot be exported (only linear)")


def _generation_config(config: dict[str, Any]) -> dict[str, Any]:
    return {k: config[k] for k in ("bos_token_id", "eos_token_id", "pad_token_id") if k in config}


def export_plans(reader: gguf.GGUFReader, config: dict[str, Any]) -> list[TensorPlan]:
    """The safetensors tensors: HF names, HF q/k row order, F16 matrices and F32 vectors."""
    permuted = FAMILIES[config["model_type"]][2]
    n_head, n_head_kv = config["num_attention_heads"], config["num_key_value_heads"]
    plans = []
    for t in reader.tensors:
        heads = qk_heads(t.name, n_head, n_head_kv) if permuted else None
        plans.append(_export_plan(t, hf_name(t.name), heads))
    return plans


def _export_plan(t: gguf.ReaderTensor, name: str, heads: int | None) -> TensorPlan:
    shape = tuple(int(d) for d in reversed(t.shape))
    dtype = widened_dtype(len(shape))

    def load() -> np.ndarray:
        if t.tensor_type in (Q.F16, Q.F32) and np.dtype(t.data.dtype) == dtype:
            w = np.asarray(t.data).reshape(shape)
        else:
            w = tensor_f32(t).astype(dtype)
        return unpermute_qk(w, heads) if heads else w

    return TensorPlan(name, shape, dtype, load)


def hf_tokenizer(reader: gguf.GGUFReader) -> tuple[dict[str, Any], dict[str, Any]]:
    """tokenizer.json and tokenizer_config.json from the GGUF vocabulary."""
    model = _meta(reader, "tokenizer.ggml.model")
    if model != "gpt2":
        raise UnsupportedSource(f"GGUF tokenizer model '{model}' cannot be exported (only byte-level BPE, 'gpt2')")
    pre = _meta(reader, "tokenizer.ggml.pre", "default")
    if pre not in PRE_TOKENIZERS:
        raise UnsupportedSource(f"GGUF pre-tokenizer '{pre}' cannot be exported; known: {', '.join(PRE_TOKENIZERS)}")
    tokens: list[str] = list(_meta(reader, "tokenizer.ggml.tokens"))
    types: list[int] = [int(x) for x in _meta(reader, "tokenizer.ggml.token_type", [TT.NORMAL] * len(tokens))]
    merges: list[str] = list(_meta(reader, "tokenizer.ggml.merges", []))
    special = {kind: _meta(reader, key) for kind, key in SPECIAL_KEYS.items()}
    add_bos = bool(_meta(reader, "tokenizer.ggml.add_bos_token", False))
    added = [_added_token(i, tokens[i], types[i]) for i in range(len(tokens)) if types[i] in (TT.CONTROL, TT.USER_DEFINED)]
    tokenizer = {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": added,
        "normalizer": None,
        "pre_tokenizer": PRE_TOKENIZERS[pre],
        "post_processor": _post_processor(tokens, special["bos"], add_bos),
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
            "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
            "ignore_merges": pre == "llama-bpe",
            "vocab": {tok: i for i, tok in enumerate(tokens)},
            "merges": merges,
        },
    }
    config: dict[str, Any] = {
        "add_bos_token": add_bos,
        "add_eos_token": bool(_meta(reader, "tokenizer.ggml.add_eos_token", False)),
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "clean_up_tokenization_spaces": False,
        "model_max_length": int(_meta(reader, f"{gguf_architecture(reader)}.context_length", 2048)),
        "tokenizer_class": "PreTrainedTokenizerFast",
    }
    for kind, tid in special.items():
        if tid is not None and 0 <= int(tid) < len(tokens):
            config[f"{kind}_token"] = tokens[int(tid)]
    template = _meta(reader, "tokenizer.chat_template")
    if template:
        config["chat_template"] = template
    return tokenizer, config


def _added_token(i: int, text: str, token_type: int) -> dict[str, Any]:
    control = token_type == TT.CONTROL
    return {"id": i, "content": text, "single_word": False, "lstrip": False, "rstrip": False,
            "normalized": not control, "special": control}


def _post_processor(tokens: list[str], bos: int | None, add_bos: bool) -> dict[str, Any]:
    if not add_bos or bos is None:
        return {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": False, "use_regex": True}
    text = tokens[int(bos)]
    seq = lambda s, t: {"Sequence": {"id": s, "type_id": t}}  # noqa: E731
    tok = lambda t: {"SpecialToken": {"id": text, "type_id": t}}  # noqa: E731
    return {"type": "TemplateProcessing", "single": [tok(0), seq("A", 0)],
            "pair": [tok(0), seq("A", 0), tok(1), seq("B", 1)],
            "special_tokens": {text: {"id": text, "ids": [int(bos)], "tokens": [text]}}}


def _special_tokens_map(tokenizer_config: dict[str, Any]) -> dict[str, str]:
    return {k: v for k, v in tokenizer_config.items() if k in ("bos_token", "eos_token", "unk_token", "pad_token")}


def _write_json(path: Path, data: Any) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


# --- import: HF folder -> GGUF F16 -------------------------------------------------------
def import_hf(folder: Path, dst: Path, name: str | None = None) -> Path:
    """Write the HF checkpoint in `folder` as an F16 GGUF at `dst`; returns `dst`.

    Raises UnsupportedSource for a model_type/architecture this converter does not know, a
    tokenizer it cannot read, or tensors the model's family does not have.
    """
    config = read_config(folder)
    model_type = config["model_type"]
    if model_type in ENCODERS:
        from localinfer_quant.bert import import_bert

        return import_bert(folder, dst, config, name)
    from localinfer_quant.pooling import sentence_pooling

    arch, _, permuted = FAMILIES[model_type]
    tensors = read_checkpoint(folder)
    plans = import_plans(tensors, config, permuted)
    n_vocab = next((p.shape[0] for p in plans if p.name == "token_embd.weight"), 0)
    if not n_vocab:
        raise UnsupportedSource(f"{folder} has no model.embed_tokens.weight")
    # an embedding model saved by sentence-transformers (Qwen3-Embedding); llama.cpp's
    # converter reads its pooling for the qwen families only, and so do we
    pooling = sentence_pooling(folder) if arch in POOLED_DECODERS else None

    def metadata(writer: gguf.GGUFWriter) -> None:
        add_hparams(writer, arch, config, n_vocab)
        if pooling is not None:
            writer.add_pooling_type(pooling)
        add_tokenizer(writer, folder, n_vocab)

    return write_model(dst, arch, name or folder.name, metadata, plans)


def write_model(dst: Path, arch: str, name: str, metadata: Callable[[gguf.GGUFWriter], None], plans: list[TensorPlan]) -> Path:
    """A GGUF at `dst`, written beside it as .partial and renamed when whole: a failure
    (a damaged tokenizer or weights file, Ctrl-C) leaves nothing that looks like a model."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".partial")
    try:
        writer = gguf.GGUFWriter(tmp, arch)
        writer.add_type("model")
        writer.add_name(name)
        metadata(writer)
        write_gguf(writer, plans)
        tmp.replace(dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


def read_json(path: Path) -> Any:
    """A folder's JSON file, or UnsupportedSource in one line (bad JSON, unreadable)."""
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise UnsupportedSource(f"{path} is not valid JSON ({e.msg} at line {e.lineno}, column {e.colno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UnsupportedSource(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None


def read_config(folder: Path) -> dict[str, Any]:
    """config.json, checked to be a model this converter knows (a llama-family causal LM
    or a BERT encoder)."""
    path = folder / "config.json"
    if not path.is_file():
        raise UnsupportedSource(f"{folder} has no config.json; not a Hugging Face checkpoint folder")
    config = read_json(path)
    if not isinstance(config, dict):
        raise UnsupportedSource(f"{path} is not a model configuration (a JSON object)")
    check_config_types(config, path)
    model_type = config.get("model_type")
    if model_type not in FAMILIES and model_type not in ENCODERS:
        raise UnsupportedSource(f"unsupported model_type '{model_type}' in {path}; supported: {SUPPORTED}")
    known = {family[1] for family in FAMILIES.values()} | {c for classes in ENCODERS.values() for c in classes}
    for entry in config.get("architectures") or []:
        if entry not in known:
            raise UnsupportedSource(f"unsupported architecture '{entry}' in {path}; supported: {', '.join(sorted(known))}")
    scaling = config.get("rope_scaling") or {}
    kind = scaling.get("rope_type", scaling.get("type"))
    if kind not in (None, "default", "linear"):
        raise UnsupportedSource(f"unsupported rope_scaling type '{kind}' in {path} (only linear)")
    return config


# The keys the import reads, and what each must be. A config.json from a real checkpoint
# has them all; a hand-made or damaged one gets one line that names the first bad key.
REQUIRED_INTS = ("hidden_size", "num_attention_heads", "num_hidden_layers", "intermediate_size", "max_position_embeddings")
OPTIONAL_TYPES: dict[str, tuple[type, ...]] = {
    "num_key_value_heads": (int,), "head_dim": (int,), "rms_norm_eps": (int, float), "rope_theta": (int, float),
    "tie_word_embeddings": (bool,), "rope_scaling": (dict,), "architectures": (list,), "model_type": (str,),
    "layer_norm_eps": (int, float), "type_vocab_size": (int,), "vocab_size": (int,),
}  # fmt: skip


def check_config_types(config: dict[str, Any], path: Path) -> None:
    for key in REQUIRED_INTS:
        value = config.get(key)
        if value is None:
            raise UnsupportedSource(f"{path} lacks '{key}', which the conversion needs")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise UnsupportedSource(f"{path}: '{key}' is {value!r}, not a positive whole number")
    for key, kinds in OPTIONAL_TYPES.items():
        value = config.get(key)
        if value is not None and (not isinstance(value, kinds) or (bool not in kinds and isinstance(value, bool))):
            raise UnsupportedSource(f"{path}: '{key}' is {value!r}, which is not a {' or '.join(k.__name__ for k in kinds)}")


def add_hparams(writer: gguf.GGUFWriter, arch: str, config: dict[str, Any], n_vocab: int) -> None:
    """The architecture's hyperparameter keys, as llama.cpp's converter writes them."""
    n_embd, n_head = config["hidden_size"], config["num_attention_heads"]
    head_dim = config.get("head_dim") or n_embd // n_head
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(n_embd)
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_head_count(n_head)
    writer.add_head_count_kv(config.get("num_key_value_heads") or n_head)
    writer.add_layer_norm_rms_eps(config.get("rms_norm_eps", 1e-6))
    writer.add_rope_freq_base(config.get("rope_theta", 10000.0))
    writer.add_rope_dimension_count(head_dim)
    if head_dim != n_embd // n_head or arch == "qwen3":  # llama.cpp's Qwen3Model writes config's head_dim
        writer.add_key_length(head_dim)
        writer.add_value_length(head_dim)
    scaling = config.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "linear":
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(scaling["factor"])
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def import_plans(tensors: dict[str, np.ndarray], config: dict[str, Any], permuted: bool) -> list[TensorPlan]:
    """GGUF tensors in the checkpoint's order (as llama.cpp's converter writes them)."""
    tied = config.get("tie_word_embeddings", False)
    if tied or "lm_head.weight" not in tensors:
        tensors = {k: v for k, v in tensors.items() if k != "lm_head.weight"}
    if not tied and "lm_head.weight" not in tensors:
        raise UnsupportedSource("config says tie_word_embeddings is false but lm_head.weight is missing")
    n_head = config["num_attention_heads"]
    n_head_kv = config.get("num_key_value_heads") or n_head
    named = {gguf_name(k): v for k, v in tensors.items() if not HF_IGNORED.search(k)}
    plans = []
    for name in named:
        heads = qk_heads(name, n_head, n_head_kv) if permuted else None
        plans.append(_import_plan(name, named[name], heads))
    return plans


def _import_plan(name: str, w: np.ndarray, heads: int | None) -> TensorPlan:
    dtype = widened_dtype(w.ndim)

    def load() -> np.ndarray:
        a = np.asarray(w).astype(dtype, copy=False)
        return permute_qk(a, heads) if heads else a

    return TensorPlan(name, tuple(w.shape), dtype, load)


def add_tokenizer(writer: gguf.GGUFWriter, folder: Path, n_vocab: int) -> None:
    """The vocabulary, special ids and chat template from the tokenizer files: a
    SentencePiece model (tokenizer.model: Llama 2, Mistral 7B) or byte-level BPE
    (tokenizer.json: Llama 3, Qwen2, SmolLM)."""
    if (folder / "tokenizer.model").is_file():
        return add_sentencepiece(writer, folder, n_vocab)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedSource(f"{folder} has neither tokenizer.model (SentencePiece) nor tokenizer.json (byte-level BPE)")
    tokenizer = json.loads(path.read_text(encoding="utf-8"))
    model = tokenizer.get("model") or {}
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = "SentencePiece-style BPE (byte_fallback)" if model.get("byte_fallback") else str(model.get("type"))
        raise UnsupportedSource(f"tokenizer.json holds a '{kind}' tokenizer; byte-level BPE is read from tokenizer.json, SentencePiece from tokenizer.model (missing here)")
    tokens, types = token_table(model["vocab"], tokenizer.get("added_tokens") or [], n_vocab)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(pre_name(tokenizer.get("pre_tokenizer")))
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)


def add_sentencepiece(writer: gguf.GGUFWriter, folder: Path, n_vocab: int) -> None:
    """tokenizer.model through gguf-py's SentencePieceVocab (pieces, scores, types), as
    llama.cpp's converter writes it: tokenizer model "llama"."""
    try:
        vocab = gguf.SentencePieceVocab(folder)
    except (RuntimeError, ValueError, OSError) as e:
        raise UnsupportedSource(f"cannot read {folder / 'tokenizer.model'} ({e})") from None
    entries = list(vocab.all_tokens())
    if len(entries) > n_vocab:
        raise UnsupportedSource(f"tokenizer.model has {len(entries)} tokens, more than the embedding's {n_vocab} rows")
    tokens = [text for text, _, _ in entries] + [f"[PAD{i}]".encode() for i in range(len(entries), n_vocab)]
    scores = [score for _, score, _ in entries] + [-1000.0] * (n_vocab - len(entries))
    types = [int(kind) for _, _, kind in entries] + [int(TT.UNUSED)] * (n_vocab - len(entries))
    writer.add_tokenizer_model("llama")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_scores(scores)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=False, n_vocab=n_vocab).add_to_gguf(writer, quiet=True)


def token_table(vocab: dict[str, int], added: Iterable[dict[str, Any]], n_vocab: int) -> tuple[list[str], list[int]]:
    """Token texts and types by id; ids the tokenizer does not use become [PADi] (UNUSED)."""
    tokens = [f"[PAD{i}]" for i in range(n_vocab)]
    types = [int(TT.UNUSED)] * n_vocab
    entries = [(text, i, int(TT.NORMAL)) for text, i in vocab.items()]
    entries += [(a["content"], a["id"], int(TT.CONTROL if a.get("special") else TT.USER_DEFINED)) for a in added]
    for text, i, kind in entries:
        if i >= n_vocab:
            raise UnsupportedSource(f"token '{text}' has id {i}, past the embedding's {n_vocab} rows")
        tokens[i], types[i] = text, kind
    return tokens, types
