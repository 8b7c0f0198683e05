"""Hugging Face BERT folders (sentence-transformers' included) -> an F16 GGUF of
architecture "bert", as llama.cpp's converter (its BertModel) writes them.

What makes the file one llama.cpp runs as the checkpoint ran:
- Tensor names: HF's `embeddings.*` and `encoder.layer.N.*` become token_embd,
  token_types, position_embd, token_embd_norm and per layer attn_q/k/v, attn_output,
  attn_output_norm, ffn_up, ffn_down, layer_output_norm, each with its bias. The pooler
  and the masked-LM head are dropped: an embedding model does not use them.
- Types: matrices F16, vectors F32, and position_embd and token_types F32, as the
  converter keeps them; llama.cpp's quantizer then leaves those two unquantized too.
- The WordPiece vocabulary in llama.cpp's "phantom space" form: a word-initial piece
  `play` is written `▁play`, a continuation `##ing` is written `ing`, and special
  tokens ([CLS], [SEP], ...) stay as they are. llama.cpp's WordPiece tokenizer prefixes
  each word with ▁ and matches greedily, which then picks the same pieces as BERT's.
- Metadata: sizes, the LayerNorm epsilon, attention.causal = false, the number of token
  types, and the pooling from sentence-transformers' files. Without them we write mean,
  where llama.cpp's converter writes no key and llama.cpp then pools nothing (one vector
  per token): a folder converted to serve embeddings should give one per text.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from localinfer_quant.hf import UnsupportedSource, read_checkpoint, read_json, token_table, write_model
from localinfer_quant.pooling import sentence_pooling
from localinfer_quant.source import TensorPlan

TT = gguf.TokenType
PHANTOM_SPACE = "\u2581"
SPECIAL_KINDS = ("bos", "eos", "unk", "sep", "pad", "cls", "mask")  # SpecialVocab's own list

# HF name (without .weight/.bias) -> GGUF name, outside the layers and per layer
GLOBAL_NAMES = {
    "embeddings.word_embeddings": "token_embd",
    "embeddings.token_type_embeddings": "token_types",
    "embeddings.position_embeddings": "position_embd",
    "embeddings.LayerNorm": "token_embd_norm",
}
BLOCK_NAMES = {
    "attention.self.query": "attn_q",
    "attention.self.key": "attn_k",
    "attention.self.value": "attn_v",
    "attention.output.dense": "attn_output",
    "attention.output.LayerNorm": "attn_output_norm",
    "intermediate.dense": "ffn_up",
    "output.dense": "ffn_down",
    "output.LayerNorm": "layer_output_norm",
}
HF_BLOCK = re.compile(r"^encoder\.layer\.(\d+)\.(.+)\.(weight|bias)$")
# what an embedding model does not run: the position_ids buffer, the pooler (CLS -> dense
# -> tanh, for next-sentence prediction), the masked-LM and next-sentence heads
DROPPED = re.compile(r"^(embeddings\.position_ids|pooler\.|cls\.)")
KEPT_F32 = {"token_types.weight", "position_embd.weight"}  # the converter's POS_EMBD and TOKEN_TYPES
GELU = {"gelu", "gelu_new", "gelu_pytorch_tanh"}  # llama.cpp runs BERT's FFN with ggml_gelu


def gguf_name(hf: str) -> str | None:
    """HF tensor name -> GGUF name, None for a tensor the GGUF leaves out."""
    name = hf.removeprefix("bert.")  # BertForMaskedLM keeps the encoder under bert.
    name = re.sub(r"\.gamma$", ".weight", re.sub(r"\.beta$", ".bias", name))  # TF-era LayerNorm names
    if DROPPED.match(name):
        return None
    base, _, suffix = name.rpartition(".")
    if base in GLOBAL_NAMES and suffix in ("weight", "bias"):
        return f"{GLOBAL_NAMES[base]}.{suffix}"
    m = HF_BLOCK.match(name)
    if m and m.group(2) in BLOCK_NAMES:
        return f"blk.{m.group(1)}.{BLOCK_NAMES[m.group(2)]}.{m.group(3)}"
    raise UnsupportedSource(f"tensor '{hf}' is not part of a BERT checkpoint")


def expected_names(n_layer: int) -> set[str]:
    """Every tensor llama.cpp's bert loader requires (token_types is optional there)."""
    names = {"token_embd.weight", "position_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias"}
    for i in range(n_layer):
        names |= {f"blk.{i}.{t}.{s}" for t in BLOCK_NAMES.values() for s in ("weight", "bias")}
    return names


def import_plans(tensors: dict[str, np.ndarray], config: dict[str, Any]) -> list[TensorPlan]:
    """GGUF tensors in the checkpoint's order, checked to be a whole BERT of config's size."""
    plans = []
    for hf, w in tensors.items():
        name = gguf_name(hf)
        if name is not None:
            plans.append(_plan(name, w))
    names = {p.name for p in plans}
    missing = sorted(expected_names(config["num_hidden_layers"]) - names)
    if missing:
        raise UnsupportedSource(f"the checkpoint lacks {len(missing)} tensor(s) a BERT needs, e.g. {missing[0]}")
    extra = sorted(n for n in names if n.startswith("blk.") and int(n.split(".")[1]) >= config["num_hidden_layers"])
    if extra:
        raise UnsupportedSource(f"the checkpoint has {extra[0]}, past config.json's num_hidden_layers = {config['num_hidden_layers']}")
    check_shapes({p.name: p.shape for p in plans}, config)
    return plans


def check_shapes(shapes: dict[str, tuple[int, ...]], config: dict[str, Any]) -> None:
    """The embeddings against config.json, which llama.cpp would otherwise refuse at load
    in a log line: rows of hidden_size, as many as the vocabulary, positions, token types."""
    n_embd = config["hidden_size"]
    rows = {"token_embd.weight": config.get("vocab_size"), "position_embd.weight": config["max_position_embeddings"],
            "token_types.weight": config.get("type_vocab_size")}  # fmt: skip
    for name, n_rows in rows.items():
        shape = shapes.get(name)
        if shape is not None and (len(shape) != 2 or shape[1] != n_embd or shape[0] != (n_rows or shape[0])):
            raise UnsupportedSource(f"{name} has shape {list(shape)}, where config.json says {[n_rows or shape[0], n_embd]}")


def _plan(name: str, w: np.ndarray) -> TensorPlan:
    dtype = np.dtype(np.float32 if w.ndim < 2 or name in KEPT_F32 else np.float16)
    return TensorPlan(name, tuple(w.shape), dtype, lambda: np.asarray(w).astype(dtype, copy=False))


def check_config(config: dict[str, Any], path: Path) -> None:
    """What llama.cpp's bert graph cannot run: another activation, relative positions, heads
    that do not split the width."""
    act = config.get("hidden_act", "gelu")
    if act not in GELU:
        raise UnsupportedSource(f"{path}: hidden_act '{act}' is not supported; llama.cpp runs BERT with GELU")
    positions = config.get("position_embedding_type", "absolute")
    if positions != "absolute":
        raise UnsupportedSource(f"{path}: position_embedding_type '{positions}' is not supported (only absolute)")
    if config["hidden_size"] % config["num_attention_heads"]:
        raise UnsupportedSource(f"{path}: hidden_size {config['hidden_size']} is not a multiple of num_attention_heads {config['num_attention_heads']}")


def import_bert(folder: Path, dst: Path, config: dict[str, Any], name: str | None = None) -> Path:
    """Write the BERT checkpoint in `folder` as an F16 GGUF at `dst`; returns `dst`."""
    check_config(config, folder / "config.json")
    plans = import_plans(read_checkpoint(folder), config)
    n_vocab = next(p.shape[0] for p in plans if p.name == "token_embd.weight")
    tokenizer = read_wordpiece(folder, n_vocab)
    pooling = sentence_pooling(folder)
    pooling = gguf.PoolingType.MEAN if pooling is None else pooling

    def metadata(writer: gguf.GGUFWriter) -> None:
        add_hparams(writer, config, pooling)
        add_wordpiece(writer, folder, tokenizer, config.get("type_vocab_size", 1))

    return write_model(dst, "bert", name or folder.name, metadata, plans)


def add_hparams(writer: gguf.GGUFWriter, config: dict[str, Any], pooling: gguf.PoolingType) -> None:
    """The bert.* keys llama.cpp's converter writes."""
    writer.add_block_count(config["num_hidden_layers"])
    writer.add_context_length(config["max_position_embeddings"])
    writer.add_embedding_length(config["hidden_size"])
    writer.add_feed_forward_length(config["intermediate_size"])
    writer.add_head_count(config["num_attention_heads"])
    writer.add_layer_norm_eps(config.get("layer_norm_eps", 1e-12))
    writer.add_causal_attention(False)
    writer.add_pooling_type(pooling)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def read_wordpiece(folder: Path, n_vocab: int) -> tuple[list[str], list[int]]:
    """tokenizer.json's WordPiece pieces and token types by id, [PADi] where no token is."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise UnsupportedSource(f"{folder} has no tokenizer.json (a BERT's WordPiece tokenizer, as transformers saves it)")
    tokenizer = read_json(path)
    model = tokenizer.get("model") if isinstance(tokenizer, dict) else None
    if not isinstance(model, dict) or model.get("type") != "WordPiece" or not isinstance(model.get("vocab"), dict):
        kind = model.get("type") if isinstance(model, dict) else None
        raise UnsupportedSource(f"{path} holds a '{kind}' tokenizer; a BERT needs WordPiece")
    return token_table(model["vocab"], tokenizer.get("added_tokens") or [], n_vocab)


def phantom(token: str, token_type: int) -> str:
    """A WordPiece piece as llama.cpp's tokenizer matches it: word starts ▁-prefixed,
    continuations without their ##, control tokens unchanged."""
    if token_type == TT.CONTROL:
        return token
    if token.startswith("##"):
        return token[2:]
    return PHANTOM_SPACE + token


def add_pieces(writer: gguf.GGUFWriter, pieces: list[str], types: list[int], n_token_types: int) -> None:
    """A WordPiece vocabulary's keys, tokenizer model "bert", its pieces as phantom() wrote them."""
    writer.add_token_type_count(n_token_types)
    writer.add_tokenizer_model("bert")
    writer.add_tokenizer_pre("default")  # llama.cpp's WordPiece ignores it
    writer.add_token_list(pieces)
    writer.add_token_types(types)


def add_bert_base_specials(writer: gguf.GGUFWriter, ids: dict[str, int]) -> None:
    """The special ids gguf-py's SpecialVocab writes for a bert-base tokenizer.json (the
    synthetic and test models, which have no folder to read): [CLS] as BOS and [SEP] as EOS
    (there is no CLS key), both added ("[CLS] $A [SEP]"), no separator between a pair."""
    writer.add_bos_token_id(ids["[CLS]"])
    writer.add_eos_token_id(ids["[SEP]"])
    writer.add_unk_token_id(ids["[UNK]"])
    writer.add_sep_token_id(ids["[SEP]"])
    writer.add_pad_token_id(ids["[PAD]"])
    writer.add_mask_token_id(ids["[MASK]"])
    writer.add_add_bos_token(True)
    writer.add_add_eos_token(True)
    writer.add_add_sep_token(False)


def add_wordpiece(writer: gguf.GGUFWriter, folder: Path, tokenizer: tuple[list[str], list[int]], n_token_types: int) -> None:
    """The vocabulary as tokenizer model "bert", its special ids ([CLS], [SEP], [PAD],
    [UNK], [MASK]) and whether [CLS]/[SEP] are added, read by gguf-py's SpecialVocab."""
    tokens, types = tokenizer
    add_pieces(writer, [phantom(t, k) for t, k in zip(tokens, types)], types, n_token_types)
    kinds = [k for k in SPECIAL_KINDS if hasattr(writer, f"add_{k}_token_id")]  # gguf-py without a cls key warns otherwise
    gguf.SpecialVocab(folder, n_vocab=len(tokens), special_token_types=kinds).add_to_gguf(writer, quiet=True)
