"""Tiny embedding and reranking GGUFs with random weights, in llama.cpp's exact tensor names
and metadata, and what llama.cpp itself makes of them: the reference every embedding test
holds our engine to.

Writers (each file a few hundred KB, loaded in milliseconds, the same bytes for a seed):

  bert          token, type and position embeddings, their LayerNorm, per layer q/k/v, the
                attention output and the FFN (GELU) with biases, a LayerNorm after each
                residual; a WordPiece vocabulary as convert_hf_to_gguf writes one
  bert rerank   the same with rank pooling and RoBERTa's classification head: cls (dense,
                tanh) then cls.output (one logit), both with biases
  nomic-bert    fused attn_qkv, NeoX RoPE (base 1000), SwiGLU FFN, no biases but the norms'
  jina-bert-v2  ALiBi (no position embeddings), GEGLU FFN with the gate fused into ffn_up
  xlm-roberta   bge-m3's kind: arch "bert" as XLMRobertaModel writes it, the same tensors,
                CLS pooling, one token type, LayerNorm eps 1e-5, and a SentencePiece
                Unigram vocabulary (tokenizer model "t5", llama.cpp's UGM) trained here,
                in fairseq's order (<s> <pad> </s> <unk> first), with its normalizer
  xlm-roberta rerank  bge-reranker-v2-m3's kind: the same with the classification head,
                and no pooling key (the converter writes none without modules.json)
  qwen3         a decoder with last-token pooling (Qwen3-Embedding): q/k RMSNorm, GQA,
                a byte-level BPE vocabulary that appends <|endoftext|>
  qwen3 rerank  Qwen3-Reranker twice, the same weights (tied embeddings, as the 0.6B's):
                as llama.cpp's converter writes it (rank pooling, cls.output = the LM
                head's "yes" and "no" rows, a "rerank" chat template) and as a plain
                causal LM (an older conversion: no pooling, no head, no template)

The reference does what llama-server does, through llama-cpp-python's low-level API: each
text its own sequence, tokenized with its special tokens, the pooled row read back with
llama_get_embeddings_seq and L2-normalised as common_embd_normalize(embd_norm=2); a rerank
prompt formatted as format_prompt_rerank formats it, its score the rank pooling's output.
A plain causal LM's yes/no score is Qwen's model card's: P(yes) = the softmax of the "yes"
and "no" logits at the prompt's last position, from llama.cpp's own logits.
Flash attention is llama.cpp's "auto", as llama-server's: on for a CPU, where it rounds K
and V to f16 (1e-4 from the same model with it off). A sequence longer than the ubatch is
refused here, since llama.cpp's encoder aborts the process on one (GGML_ASSERT).
"""

from __future__ import annotations

import functools
import io
import os
import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, PoolingType, TokenType

from localinfer.backends.llamacpp import _init_once, last_error

import llama_cpp as C  # noqa: E402  (after localinfer's import, which loads the shared library first)

from .conftest import THREADS

N_EMBD, N_HEAD, N_LAYER, N_FF, N_CTX = 64, 4, 2, 128, 128
QWEN3_HEAD_DIM, QWEN3_HEAD_KV = 32, 2  # 4 x 32 = 128 query values from 64, as Qwen3's heads outgrow its width
NORM_EPS = 1e-12  # BERT's LayerNorm epsilon
POOLING = {p.name.lower(): p for p in PoolingType}  # none, mean, cls, last, rank (gguf's values: 0..4)

# --- vocabularies ------------------------------------------------------------------------

WORDS = """the of and to in is was for on that with as it at by from be this are or an not
have has had were but which their they his her she he we you your our my me him them its all
any some one two three first new more most many other such what when where who how why than
then there here into over after before about up down out off so if no yes can will would could
should may might must do does did done make made get got go going went come came see saw know
known think take took give given find found tell told ask work call try use used need feel
become leave put mean keep let begin seem help show hear play run move live believe bring
happen write provide sit stand lose pay meet include continue set learn change lead understand
watch follow stop create speak read allow add spend grow open walk win offer remember love
consider appear buy wait serve die send expect build stay fall cut reach kill remain suggest
raise pass sell require report decide pull time year people way day man woman child world life
hand part place case week company system program question government number night point home
water room mother area money story fact month lot right study book eye job word business issue
side kind head house service friend father power hour game line end member law car city name
president team minute idea kid body information back parent face others level office door
health person art war history party result morning reason research girl guy moment air
teacher force education good great little own old big high different small large next early
young important few public bad same able best better sure free long last quick brown fox jumps
lazy dog cat sat mat hello paris france capital london england rome italy weather rain sun sunny
cloud cold hot warm snow today tomorrow computer code python model language text search query
document answer sentence vector embedding retrieval data science learning machine neural
network food apple banana fruit eat drink coffee tea music song movie film sport football
""".split()

SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}  # bert-base-uncased's ids
PUNCTUATION = list(".,!?;:'\"-()[]{}/\\&*@#$%^_+=<>|~`")
SUFFIXES = ["s", "es", "ed", "ing", "ly", "er", "est", "tion", "ment", "ness"]


def wordpiece_vocabulary() -> tuple[list[str], list[int]]:
    """A BERT vocabulary as BertModel.set_vocab writes it: the specials (CONTROL) as they
    are, at bert-base-uncased's ids with [unusedN] around them; every other word-start piece
    behind U+2581 and every continuation ("##x") bare. Letters and digits both ways, so any
    lowercase word or number tokenizes without [UNK]."""
    by_id = {i: t for t, i in SPECIALS.items()}
    tokens: list[str] = []
    n_unused = 0
    for i in range(max(SPECIALS.values()) + 1):
        if i in by_id:
            tokens.append(by_id[i])
        else:
            tokens.append(f"\u2581[unused{n_unused}]")
            n_unused += 1
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789")
    pieces = [*PUNCTUATION, *chars, *(w for w in WORDS if len(w) > 1)]
    tokens += ["\u2581" + p for p in dict.fromkeys(pieces)]
    tokens += [c for c in dict.fromkeys([*chars, *SUFFIXES])]  # continuations: "##x" written as "x"
    types = [int(TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL) for t in tokens]
    return tokens, types


def byte_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the alphabet of a byte-level BPE)."""
    keep = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    mapping, extra = {}, 0
    for b in range(256):
        if b in keep:
            mapping[b] = chr(b)
        else:
            mapping[b] = chr(256 + extra)
            extra += 1
    return mapping


def bpe_vocabulary(more: Sequence[str] = (), bare: Sequence[str] = (), added: Sequence[str] = ()) -> tuple[list[str], list[int], list[str]]:
    """A byte-level BPE as Qwen's: three control tokens (<|endoftext|> first), the 256 byte
    symbols, then for each word (WORDS, then `more`) the merges that build "Ġword" left to
    right, so that a word after a space is one token and anything else falls back to bytes;
    then the `bare` words without the space (Qwen's "yes" and "no"), their merges ranked after
    every "Ġ" one, so that they never cut into a word after a space; then `added` tokens
    (USER_DEFINED, as the converter writes an added token that is not special: <think>)."""
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [int(TokenType.CONTROL)] * len(tokens)
    tokens += list(byte_to_unicode().values())
    merges: dict[str, None] = {}
    words: dict[str, None] = {}
    for word in [*WORDS, *more]:
        add_chain("Ġ", word, merges, words)
    for word in bare:
        add_chain(word[0], word[1:], merges, words)
    tokens += [w for w in words if w not in tokens]
    types += [int(TokenType.NORMAL)] * (len(tokens) - len(types))
    tokens += list(added)
    types += [int(TokenType.USER_DEFINED)] * len(added)
    return tokens, types, list(merges)


def add_chain(piece: str, rest: str, merges: dict[str, None], words: dict[str, None]) -> None:
    """The merges that build piece + rest one character at a time, and every piece between."""
    for ch in rest:
        merges[f"{piece} {ch}"] = None
        piece += ch
        words[piece] = None


# A SentencePiece Unigram model as XLM-RoBERTa ships one (sentencepiece.bpe.model), learned
# from WORDS and a few words in other scripts; anything else (a capital, an emoji) is <unk>
UNIGRAM_MORE = "café naïve résumé über straße zürich münchen 東京 大阪 京都 привет мир москва".split()
XLMR_SPECIALS = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}  # fairseq's ids, as HF's XLMRobertaTokenizer has them


@functools.cache
def sentencepiece_model() -> bytes:
    """The model file's bytes, trained here in milliseconds (the same bytes each time: one
    thread, a corpus in a seeded order, each word in eight contexts; about 430 pieces). SentencePiece's
    defaults are XLM-R's: <unk>, <s>, </s> at 0, 1 and 2, no <pad>, the nmt_nfkc normalizer
    as a precompiled charsmap (240,007 bytes from this SentencePiece; bge-m3's GGUF carries
    237,539, an older Unicode's), a dummy prefix, runs of spaces merged; every character of
    the corpus kept (character_coverage 1), so a word of them always tokenizes and any other
    character is <unk>."""
    import sentencepiece as spm

    words = [*WORDS, *UNIGRAM_MORE]
    rng = np.random.default_rng(0)
    lines = []
    for _ in range(8):
        order = [words[i] for i in rng.permutation(len(words))]
        lines += [" ".join(order[i : i + 10]) for i in range(0, len(order), 10)]
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines), model_writer=out, model_type="unigram", vocab_size=1000, hard_vocab_limit=False,
        character_coverage=1.0, num_threads=1, minloglevel=2,
    )  # fmt: skip
    return out.getvalue()


def protobuf_fields(message: bytes) -> Iterator[tuple[int, int | bytes]]:
    """(field number, value) of a protobuf message's fields: a varint as an int, a
    length-delimited field as its bytes; fixed-width ones (a piece's score) skipped. Enough
    to read a SentencePiece model's normalizer without the protobuf package."""
    i = 0
    while i < len(message):
        key, i = varint(message, i)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, i = varint(message, i)
            yield number, value
        elif wire == 2:
            n, i = varint(message, i)
            yield number, message[i : i + n]
            i += n
        elif wire in (1, 5):
            i += 8 if wire == 1 else 4
        else:
            raise ValueError(f"protobuf wire type {wire}: not one a SentencePiece model uses")


def varint(data: bytes, i: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        byte = data[i]
        i += 1
        value |= (byte & 0x7F) << shift
        shift += 7
        if byte < 0x80:
            return value, i


def normalizer_spec(model: bytes) -> tuple[bytes, bool, bool]:
    """ModelProto.normalizer_spec (field 3): precompiled_charsmap (2), add_dummy_prefix (3)
    and remove_extra_whitespaces (4), each flag true where the file leaves it out (proto2's
    defaults), as the converter reads them."""
    spec = dict(protobuf_fields(next(v for n, v in protobuf_fields(model) if n == 3 and isinstance(v, bytes))))
    charsmap = spec.get(2, b"")
    assert isinstance(charsmap, bytes)
    return charsmap, bool(spec.get(3, 1)), bool(spec.get(4, 1))


def unigram_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Pieces, scores and token types as XLMRobertaModel._xlmroberta_set_vocab writes them from
    sentencepiece.bpe.model: config.json's vocab_size (SentencePiece's + 2, for fairseq's
    <pad> and HF's <mask>) of [PADi] slots (UNUSED, -10000), SentencePiece's pieces over them,
    then "realigned" as HF's tokenizer numbers them: <s> <pad> </s> (CONTROL) <unk> (UNKNOWN)
    at 0..3, each other piece one place after its SentencePiece id, and the last slot (HF's
    <mask>, id 250001 in bge-m3) left [PADn], UNUSED."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=sentencepiece_model())
    n = sp.vocab_size()
    tokens, scores, types = [f"[PAD{i}]" for i in range(n + 2)], [-10000.0] * (n + 2), [int(TokenType.UNUSED)] * (n + 2)
    for i in range(n):
        kind = TokenType.UNKNOWN if sp.IsUnknown(i) else TokenType.CONTROL if sp.IsControl(i) else TokenType.NORMAL
        tokens[i], scores[i], types[i] = sp.IdToPiece(i), sp.GetScore(i), int(kind)
    control, unknown = int(TokenType.CONTROL), int(TokenType.UNKNOWN)
    return list(XLMR_SPECIALS) + tokens[3:-1], [0.0] * 4 + scores[3:-1], [control] * 3 + [unknown] + types[3:-1]


def unigram_metadata(w: GGUFWriter) -> int:
    """XLMRobertaModel.set_vocab, then gguf's SpecialVocab over XLM-R's tokenizer files: model
    "t5" (llama.cpp's UGM), pre "default", the pieces with their scores and types, the
    normalizer's flags and charsmap, one token type; <s> the BOS, </s> the EOS and separator,
    <unk>, <pad>, and <mask> at HF's id (the last slot); all three marks added, from the
    post-processor "<s> $A </s>" and its pair "<s> $A </s> </s> $B </s>" (add_sep: a
    reranker's pair is <s> query </s> </s> document </s>). Returns the vocabulary's size."""
    tokens, scores, types = unigram_vocabulary()
    charsmap, add_prefix, remove_whitespaces = normalizer_spec(sentencepiece_model())
    w.add_tokenizer_model("t5")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(add_prefix)
    w.add_token_type_count(1)  # XLM-R's type_vocab_size
    w.add_remove_extra_whitespaces(remove_whitespaces)
    w.add_precompiled_charsmap(charsmap)
    w.add_bos_token_id(XLMR_SPECIALS["<s>"])
    w.add_eos_token_id(XLMR_SPECIALS["</s>"])
    w.add_unk_token_id(XLMR_SPECIALS["<unk>"])
    w.add_sep_token_id(XLMR_SPECIALS["</s>"])
    w.add_pad_token_id(XLMR_SPECIALS["<pad>"])
    w.add_mask_token_id(len(tokens) - 1)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)
    return len(tokens)


def sentencepiece_ids(text: str) -> list[int]:
    """SentencePiece's own tokens of a text, in the GGUF's numbering (fairseq's: <unk> 3,
    every other piece one up), no marks added: what llama.cpp's UGM must give."""
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_proto=sentencepiece_model())
    return [XLMR_SPECIALS["<unk>"] if sp.IsUnknown(i) else i + 1 for i in sp.encode(text)]


# --- writers -------------------------------------------------------------------------------


class RandomWeights:
    """Weights drawn in call order from one seed: the file's bytes are the seed's."""

    def __init__(self, seed: int) -> None:
        self.rng = np.random.default_rng(seed)

    def matrix(self, rows: int, cols: int) -> np.ndarray:
        return (self.rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)  # [rows (out), cols (in)]

    def embedding(self, rows: int, scale: float = 1.0) -> np.ndarray:
        return (scale * self.rng.standard_normal((rows, N_EMBD))).astype(np.float32)

    def norm(self, n: int = N_EMBD) -> np.ndarray:
        return (1.0 + 0.1 * self.rng.standard_normal(n)).astype(np.float32)

    def bias(self, n: int = N_EMBD) -> np.ndarray:
        return (0.1 * self.rng.standard_normal(n)).astype(np.float32)


def pooling_of(name: str) -> PoolingType:
    if name not in POOLING:
        raise ValueError(f"unknown pooling {name!r}: one of {', '.join(POOLING)}")
    return POOLING[name]


def encoder_metadata(w: GGUFWriter, pooling: str | None, norm_eps: float = NORM_EPS) -> None:
    """What TextModel and BertModel.set_gguf_parameters write for every BERT-family encoder;
    no pooling key where `pooling` is None (a folder without sentence-transformers' modules.json)."""
    w.add_context_length(N_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_layer_norm_eps(norm_eps)
    w.add_causal_attention(False)
    if pooling is not None:
        w.add_pooling_type(pooling_of(pooling))


def wordpiece_metadata(w: GGUFWriter) -> int:
    """BertModel.set_vocab with gguf's SpecialVocab over a bert-base tokenizer.json: [CLS] is
    the BOS and [SEP] the EOS (there is no CLS key), both added ("[CLS] $A [SEP]"); the
    pair template "[CLS] $A [SEP] $B [SEP]" gives add_sep false. Two token types. Returns
    the vocabulary's size."""
    from localinfer_quant.bert import add_bert_base_specials, add_pieces

    tokens, types = wordpiece_vocabulary()
    add_pieces(w, tokens, types, n_token_types=2)
    add_bert_base_specials(w, SPECIALS)
    return len(tokens)


def finish(w: GGUFWriter) -> None:
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def attention_with_biases(w: GGUFWriter, r: RandomWeights, p: str) -> None:
    """A layer's q, k, v and output products with their biases, then the LayerNorm after the
    residual (bert, jina-bert-v2)."""
    for kind in ("attn_q", "attn_k", "attn_v", "attn_output"):
        w.add_tensor(p + kind + ".weight", r.matrix(N_EMBD, N_EMBD))
        w.add_tensor(p + kind + ".bias", r.bias())
    post_norms(w, r, p, "attn_output_norm")


def embeddings_and_norm(w: GGUFWriter, r: RandomWeights, n_vocab: int, n_types: int, positions: bool) -> None:
    w.add_tensor("token_embd.weight", r.embedding(n_vocab))  # [n_vocab, n_embd]
    w.add_tensor("token_types.weight", r.embedding(n_types, 0.5))  # [n_token_types, n_embd]; llama.cpp adds row 0
    if positions:
        # [n_ctx_train, n_embd]; a RoBERTa's from its row pad + 1 on (the converter cuts the rows before)
        w.add_tensor("position_embd.weight", r.embedding(N_CTX, 0.5))
    w.add_tensor("token_embd_norm.weight", r.norm())
    w.add_tensor("token_embd_norm.bias", r.bias())


def post_norms(w: GGUFWriter, r: RandomWeights, p: str, name: str) -> None:
    w.add_tensor(p + name + ".weight", r.norm())
    w.add_tensor(p + name + ".bias", r.bias())


@dataclass(frozen=True)
class BertFamily:
    """What tells apart the models llama.cpp's converter writes as arch "bert": the vocabulary
    (its keys written by `vocabulary`, which returns its size), the rows of token types and
    LayerNorm's epsilon. The tensors and the forward are BERT's for all."""

    name: str
    vocabulary: Callable[[GGUFWriter], int]
    n_token_types: int
    norm_eps: float


BERT = BertFamily("tiny-bert", wordpiece_metadata, 2, NORM_EPS)
XLM_ROBERTA = BertFamily("tiny-xlm-roberta", unigram_metadata, 1, 1e-5)  # XLMRobertaModel: type_vocab_size 1, layer_norm_eps 1e-5


def write_bert(path: Path, pooling: str = "mean", seed: int = 0) -> Path:
    """A tiny BERT (arch "bert"), as convert_hf_to_gguf writes a sentence-transformers folder."""
    return _write_bert(path, pooling, seed, head=False, family=BERT)


def write_bert_reranker(path: Path, seed: int = 0) -> Path:
    """A tiny BERT cross-encoder: rank pooling and the classification head llama.cpp's
    build_pooling applies to the first token's state h: cls.output(tanh(cls(h))), one label."""
    return _write_bert(path, "rank", seed, head=True, family=BERT)


def write_xlm_roberta(path: Path, pooling: str = "cls", seed: int = 0) -> Path:
    """A tiny bge-m3 (XLMRobertaModel, arch "bert"): BERT's tensors, CLS pooling (its
    1_Pooling), the Unigram vocabulary (unigram_metadata)."""
    return _write_bert(path, pooling, seed, head=False, family=XLM_ROBERTA)


def write_xlm_roberta_reranker(path: Path, pooling: str | None = None, seed: int = 0) -> Path:
    """A tiny bge-reranker-v2-m3 (XLMRobertaForSequenceClassification, arch "bert"): the
    classification head (classifier.dense, classifier.out_proj), one label (id2label
    {0: LABEL_0}), and no pooling key: the pinned converter writes one only from a
    sentence-transformers folder's modules.json, which bge-reranker-v2-m3 has none of, so
    rank pooling is asked at load (llama-server's --rerank, our catalog's default)."""
    return _write_bert(path, pooling, seed, head=True, family=XLM_ROBERTA)


def _write_bert(path: Path, pooling: str | None, seed: int, head: bool, family: BertFamily) -> Path:
    r = RandomWeights(seed)
    w = GGUFWriter(str(path), "bert")
    w.add_name(family.name + ("-reranker" if head else ""))
    encoder_metadata(w, pooling, family.norm_eps)
    if head:
        w.add_classifier_output_labels(["LABEL_0"])  # n_cls_out = 1
    n_vocab = family.vocabulary(w)
    embeddings_and_norm(w, r, n_vocab, family.n_token_types, positions=True)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        attention_with_biases(w, r, p)
        w.add_tensor(p + "ffn_up.weight", r.matrix(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.bias", r.bias(N_FF))
        w.add_tensor(p + "ffn_down.weight", r.matrix(N_EMBD, N_FF))
        w.add_tensor(p + "ffn_down.bias", r.bias())
        post_norms(w, r, p, "layer_output_norm")
    if head:
        w.add_tensor("cls.weight", r.matrix(N_EMBD, N_EMBD))  # RoBERTa's classifier.dense
        w.add_tensor("cls.bias", r.bias())
        w.add_tensor("cls.output.weight", 4 * r.matrix(1, N_EMBD))  # classifier.out_proj [n_cls_out, n_embd]; x4: scores spread
        w.add_tensor("cls.output.bias", r.bias(1))
    finish(w)
    return path


def write_nomic_bert(path: Path, pooling: str = "mean", seed: int = 0) -> Path:
    """A tiny nomic-embed-text (arch "nomic-bert"): rotary positions, one fused q/k/v
    matrix, a SwiGLU FFN, and no biases but the LayerNorms' (NomicBertModel's asserts)."""
    r = RandomWeights(seed)
    w = GGUFWriter(str(path), "nomic-bert")
    w.add_name("tiny-nomic-bert")
    encoder_metadata(w, pooling)
    w.add_rope_freq_base(1000.0)  # nomic's rotary_emb_base
    n_vocab = wordpiece_metadata(w)
    embeddings_and_norm(w, r, n_vocab, 2, positions=False)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_qkv.weight", r.matrix(3 * N_EMBD, N_EMBD))  # q rows, then k, then v
        w.add_tensor(p + "attn_output.weight", r.matrix(N_EMBD, N_EMBD))
        post_norms(w, r, p, "attn_output_norm")
        w.add_tensor(p + "ffn_gate.weight", r.matrix(N_FF, N_EMBD))  # silu(gate) * up
        w.add_tensor(p + "ffn_up.weight", r.matrix(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", r.matrix(N_EMBD, N_FF))
        post_norms(w, r, p, "layer_output_norm")
    finish(w)
    return path


def write_jina_bert_v2(path: Path, pooling: str = "mean", seed: int = 0) -> Path:
    """A tiny jina-embeddings-v2 (arch "jina-bert-v2"): ALiBi instead of position embeddings
    (llama.cpp sets its max bias, 8, itself), q/k/v and the attention output with biases,
    and GEGLU with gate and up fused in one ffn_up of 2 x n_ff rows (mlp.gated_layers)."""
    r = RandomWeights(seed)
    w = GGUFWriter(str(path), "jina-bert-v2")
    w.add_name("tiny-jina-bert-v2")
    encoder_metadata(w, pooling)
    n_vocab = wordpiece_metadata(w)
    embeddings_and_norm(w, r, n_vocab, 2, positions=False)
    for i in range(N_LAYER):
        p = f"blk.{i}."
        attention_with_biases(w, r, p)
        w.add_tensor(p + "ffn_up.weight", r.matrix(2 * N_FF, N_EMBD))  # GEGLU's two halves
        w.add_tensor(p + "ffn_down.weight", r.matrix(N_EMBD, N_FF))
        w.add_tensor(p + "ffn_down.bias", r.bias())
        post_norms(w, r, p, "layer_output_norm")
    finish(w)
    return path


def write_qwen3_embedding(path: Path, pooling: str = "last", seed: int = 0) -> Path:
    """A tiny Qwen3-Embedding (arch "qwen3", causal): qwen3.pooling_type last, and the
    tokenizer appends <|endoftext|> (its TemplateProcessing "$A <|endoftext|>"), whose
    state is the embedding."""
    r = RandomWeights(seed)
    tokens, types, merges = bpe_vocabulary()
    w = GGUFWriter(str(path), "qwen3")
    w.add_name("tiny-qwen3-embedding")
    qwen3_metadata(w, N_CTX)
    w.add_pooling_type(pooling_of(pooling))
    bpe_metadata(w, tokens, types, merges, eos=0, add_eos=True)
    w.add_tensor("token_embd.weight", r.embedding(len(tokens)))
    qwen3_layers(w, r)
    finish(w)
    return path


# What convert_hf_to_gguf's Qwen3Model writes as a Qwen3-Reranker's "rerank" chat template
# (llama.cpp's conversion/qwen.py): Qwen's model card's prompt, its default instruction.
QWEN3_RERANK_TEMPLATE = (
    '<|im_start|>system\nJudge whether the Document meets the requirements based on the Query and the Instruct provided. Note that the answer can only be "yes" or "no".<|im_end|>\n'
    "<|im_start|>user\n<Instruct>: Given a web search query, retrieve relevant passages that answer the query\n<Query>: {query}\n<Document>: {document}<|im_end|>\n"
    "<|im_start|>assistant\n<think>\n\n</think>\n\n"
)
RERANK_CTX = 512  # the prompt alone is about 100 tokens here


def reranker_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """The BPE above with the prompt's words (after a space and bare), Qwen's bare "yes" and
    "no" (one token each, as convert_tokens_to_ids finds them) and <think>, </think>."""
    words = list(dict.fromkeys(re.findall(r"[A-Za-z]+", QWEN3_RERANK_TEMPLATE)))
    return bpe_vocabulary(more=words, bare=[*words, "yes", "no"], added=["<think>", "</think>"])


def write_qwen3_reranker(path: Path, converted: bool = True, seed: int = 0) -> Path:
    """A tiny Qwen3-Reranker (arch "qwen3", causal, tied embeddings as the 0.6B's). Converted
    (llama.cpp's Qwen3Model with is_rerank): pooling rank, classifier labels ["yes", "no"],
    the "rerank" chat template, and cls.output = the LM head's rows for "yes" then "no"
    (_get_cls_out_tensor's [true_row, false_row]); token_embd stays, the tied head. Else
    the same weights as a plain causal LM, as an older conversion left it. The "yes" and
    "no" rows are a tenth of the others, so that the scores sit inside (0, 1) (about 0.35
    here) rather than at its ends, where a float32 keeps few of their digits."""
    r = RandomWeights(seed)
    tokens, types, merges = reranker_vocabulary()
    yes_no = [tokens.index("yes"), tokens.index("no")]
    w = GGUFWriter(str(path), "qwen3")
    w.add_name("tiny-qwen3-reranker")
    qwen3_metadata(w, RERANK_CTX)
    if converted:
        w.add_pooling_type(PoolingType.RANK)
        w.add_classifier_output_labels(["yes", "no"])
        w.add_chat_template([{"name": "rerank", "template": QWEN3_RERANK_TEMPLATE}])
    bpe_metadata(w, tokens, types, merges, eos=tokens.index("<|im_end|>"), add_eos=False)
    embedding = r.embedding(len(tokens))  # [n_vocab, n_embd], also the output head (tied)
    embedding[yes_no] *= 0.1
    if converted:
        w.add_tensor("cls.output.weight", embedding[yes_no])  # [n_cls_out = 2, n_embd]
    w.add_tensor("token_embd.weight", embedding)
    qwen3_layers(w, r)
    finish(w)
    return path


def qwen3_metadata(w: GGUFWriter, n_ctx: int) -> None:
    """Qwen3's hyperparameters as TextModel writes them."""
    w.add_context_length(n_ctx)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_block_count(N_LAYER)
    w.add_head_count(N_HEAD)
    w.add_head_count_kv(QWEN3_HEAD_KV)
    w.add_key_length(QWEN3_HEAD_DIM)
    w.add_value_length(QWEN3_HEAD_DIM)
    w.add_rope_freq_base(1e6)
    w.add_layer_norm_rms_eps(1e-6)


def bpe_metadata(w: GGUFWriter, tokens: list[str], types: list[int], merges: list[str], eos: int, add_eos: bool, add_bos: bool = False) -> None:
    """A Qwen2-style byte-level BPE: <|endoftext|> (id 0) the BOS and padding, the BOS added
    only where asked (a llama's habit; never Qwen's)."""
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("qwen2")
    w.add_token_list(tokens)
    w.add_token_types(types)
    w.add_token_merges(merges)
    w.add_bos_token_id(0)
    w.add_eos_token_id(eos)
    w.add_pad_token_id(0)
    w.add_add_bos_token(add_bos)
    w.add_add_eos_token(add_eos)


def qwen3_layers(w: GGUFWriter, r: RandomWeights) -> None:
    """The final norm and every layer: q/k RMSNorm per head, GQA, SwiGLU."""
    q_dim, kv_dim = N_HEAD * QWEN3_HEAD_DIM, QWEN3_HEAD_KV * QWEN3_HEAD_DIM
    w.add_tensor("output_norm.weight", r.norm())
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.norm())
        w.add_tensor(p + "attn_q.weight", r.matrix(q_dim, N_EMBD))
        w.add_tensor(p + "attn_k.weight", r.matrix(kv_dim, N_EMBD))
        w.add_tensor(p + "attn_v.weight", r.matrix(kv_dim, N_EMBD))
        w.add_tensor(p + "attn_q_norm.weight", r.norm(QWEN3_HEAD_DIM))
        w.add_tensor(p + "attn_k_norm.weight", r.norm(QWEN3_HEAD_DIM))
        w.add_tensor(p + "attn_output.weight", r.matrix(N_EMBD, q_dim))
        w.add_tensor(p + "ffn_norm.weight", r.norm())
        w.add_tensor(p + "ffn_gate.weight", r.matrix(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", r.matrix(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", r.matrix(N_EMBD, N_FF))


# --- the reference: llama.cpp as llama-server runs it ----------------------------------------


@contextmanager
def llama_context(path: Path, pooling: str | None, logits: bool = False) -> Iterator[tuple[C.llama_model_p, C.llama_context_p, C.llama_batch]]:
    """The model, an embedding context (or with `logits` a generative one) of one sequence
    over the model's whole trained context, and a batch that holds it; all freed on the way
    out. n_ubatch is the context:
    an encoder sees a sequence in one ubatch (llama.cpp asserts n_ubatch >= n_tokens, an
    abort, not an error code), so texts are measured against it before any call."""
    _init_once(False)  # llamacpp.py's quiet log callback: a second one would take its error lines
    model = ctx = batch = None
    try:
        model = C.llama_model_load_from_file(os.fsencode(path), C.llama_model_default_params())
        if not model:
            raise RuntimeError(f"llama.cpp could not load {path}: {last_error() or 'unknown error'}")
        n_ctx = C.llama_model_n_ctx_train(model)
        cparams = C.llama_context_default_params()
        cparams.n_ctx = cparams.n_batch = cparams.n_ubatch = n_ctx
        cparams.n_seq_max = 1
        cparams.embeddings = not logits
        cparams.pooling_type = C.LLAMA_POOLING_TYPE_UNSPECIFIED if pooling is None else int(pooling_of(pooling))
        cparams.n_threads = cparams.n_threads_batch = THREADS
        cparams.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_AUTO  # llama-server's -fa auto: on for a CPU, K and V rounded to f16
        cparams.no_perf = True
        ctx = C.llama_init_from_model(model, cparams)
        if not ctx:
            raise RuntimeError(f"llama.cpp could not make a context for {path}: {last_error() or 'unknown error'}")
        batch = C.llama_batch_init(n_ctx, 0, 1)
        yield model, ctx, batch
    finally:
        if batch is not None:
            C.llama_batch_free(batch)
        if ctx:
            C.llama_free(ctx)
        if model:
            C.llama_model_free(model)


def tokenize(vocab: C.llama_vocab_p, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """llama_tokenize, asked again with the room it says it needs."""
    data = text.encode("utf-8")
    n = len(data) + 8
    out = (C.llama_token * n)()
    count = C.llama_tokenize(vocab, data, len(data), out, n, add_special, parse_special)
    if count < 0:
        n = -count
        out = (C.llama_token * n)()
        count = C.llama_tokenize(vocab, data, len(data), out, n, add_special, parse_special)
    return list(out[:count])


def run_sequence(ctx: C.llama_context_p, batch: C.llama_batch, tokens: list[int]) -> None:
    """One sequence (id 0) through llama_decode, every token an output, as llama-server
    sends an embedding task. A context without memory (an encoder) runs it through
    llama_encode inside; a decoder's cache is cleared first, so texts never see each other."""
    limit = min(C.llama_n_ubatch(ctx), C.llama_model_n_ctx_train(C.llama_get_model(ctx)))  # n_ctx is padded to 256
    if not tokens or len(tokens) > limit:
        raise ValueError(f"{len(tokens)} tokens: a sequence here takes 1 to {limit}")
    memory = C.llama_get_memory(ctx)
    if memory:
        C.llama_memory_clear(memory, True)
    for i, token in enumerate(tokens):
        batch.token[i] = token
        batch.pos[i] = i
        batch.n_seq_id[i] = 1
        batch.seq_id[i][0] = 0
        batch.logits[i] = True
    batch.n_tokens = len(tokens)
    if (rc := C.llama_decode(ctx, batch)) != 0:
        raise RuntimeError(f"llama_decode returned {rc}: {last_error()}")


def common_embd_normalize(v: np.ndarray) -> np.ndarray:
    """common.cpp's common_embd_normalize with embd_norm 2 (llama-server's default): the
    Euclidean norm summed in double, and a zero vector left zero."""
    norm = np.sqrt(np.sum(v.astype(np.float64) ** 2))
    return (v * np.float32(1.0 / norm if norm > 0 else 0.0)).astype(np.float32)


def pooled(ctx: C.llama_context_p, width: int) -> np.ndarray:
    ptr = C.llama_get_embeddings_seq(ctx, 0)
    if not ptr:
        raise RuntimeError("llama.cpp pooled nothing: is the pooling 'none'?")
    return np.ctypeslib.as_array(ptr, shape=(width,)).copy()


def llamacpp_embeddings(path: Path, texts: list[str], pooling: str | None = None, normalize: bool = True) -> np.ndarray:
    """[n_texts, n_embd]: each text alone, its special tokens added, pooled by `pooling`
    (None: the GGUF's own), L2-normalised unless told not to, as llama-server's /embeddings."""
    if pooling in ("none", "rank"):
        raise ValueError(f"pooling {pooling!r} has no one vector per text: llamacpp_token_embeddings, llamacpp_rerank_scores")
    with llama_context(path, pooling) as (model, ctx, batch):
        vocab = C.llama_model_get_vocab(model)
        width = C.llama_model_n_embd_out(model)
        rows = []
        for text in texts:
            run_sequence(ctx, batch, tokenize(vocab, text, add_special=True, parse_special=True))
            row = pooled(ctx, width)
            rows.append(common_embd_normalize(row) if normalize else row)
    return np.stack(rows)  # [n_texts, n_embd]


def llamacpp_token_embeddings(path: Path, text: str) -> np.ndarray:
    """[n_tokens, n_embd]: every token's last hidden state (pooling none), unnormalised as
    llama-server returns them."""
    with llama_context(path, "none") as (model, ctx, batch):
        tokens = tokenize(C.llama_model_get_vocab(model), text, add_special=True, parse_special=True)
        run_sequence(ctx, batch, tokens)
        width = C.llama_model_n_embd_out(model)
        return np.stack([np.ctypeslib.as_array(C.llama_get_embeddings_ith(ctx, i), shape=(width,)).copy() for i in range(len(tokens))])


def rerank_tokens(model: C.llama_model_p, query: str, document: str) -> list[int]:
    """llama-server's format_prompt_rerank: the GGUF's "rerank" chat template with {query}
    and {document} filled in (tokenized without added specials, specials parsed), or else
    [BOS] query [EOS] [SEP] document [EOS], each marker where the vocabulary adds it (EOS
    falling back to SEP); query and document tokenized plain."""
    vocab = C.llama_model_get_vocab(model)
    template = C.llama_model_chat_template(model, b"rerank")
    if template:
        return template_tokens(vocab, template.decode("utf-8"), query, document)
    eos = C.llama_vocab_eos(vocab)
    eos = C.llama_vocab_sep(vocab) if eos == C.LLAMA_TOKEN_NULL else eos
    bos = [C.llama_vocab_bos(vocab)] if C.llama_vocab_get_add_bos(vocab) else []
    end = [eos] if C.llama_vocab_get_add_eos(vocab) else []
    sep = [C.llama_vocab_sep(vocab)] if C.llama_vocab_get_add_sep(vocab) else []
    query_tokens, document_tokens = (tokenize(vocab, text, add_special=False, parse_special=False) for text in (query, document))
    return bos + query_tokens + end + sep + document_tokens + end


def template_tokens(vocab: C.llama_vocab_p, template: str, query: str, document: str) -> list[int]:
    """format_prompt_rerank's prompt from a rerank template: {query}, then {document}
    replaced (string_replace_all, one after the other), tokenized with no specials added
    and the template's own parsed."""
    prompt = template.replace("{query}", query).replace("{document}", document)
    return tokenize(vocab, prompt, add_special=False, parse_special=True)


def llamacpp_rerank_scores(path: Path, query: str, documents: list[str]) -> np.ndarray:
    """[n_documents]: llama-server's /rerank relevance_score for each document, the first
    value the rank pooling leaves (its classification head's logit), unnormalised."""
    with llama_context(path, "rank") as (model, ctx, batch):
        n_out = C.llama_model_n_cls_out(model)
        scores = []
        for document in documents:
            run_sequence(ctx, batch, rerank_tokens(model, query, document))
            scores.append(pooled(ctx, n_out)[0])
    return np.array(scores, dtype=np.float32)


def llamacpp_yes_no_scores(path: Path, query: str, documents: list[str], template: str = QWEN3_RERANK_TEMPLATE) -> np.ndarray:
    """[n_documents]: Qwen's model card's score of a plain causal LM, from llama.cpp's own
    logits: the prompt formatted and tokenized as format_prompt_rerank does a rerank template
    (the converter's, by default), one forward, then at its last position the softmax of the
    "yes" and "no" logits, P(yes) (the card's log_softmax over [no, yes], exp of yes), in
    float64. The two tokens are the vocabulary's own "yes" and "no", each one token."""
    with llama_context(path, "none", logits=True) as (model, ctx, batch):
        vocab = C.llama_model_get_vocab(model)
        (yes,), (no,) = (tokenize(vocab, word, add_special=False, parse_special=False) for word in ("yes", "no"))
        n_vocab = C.llama_vocab_n_tokens(vocab)
        scores = []
        for document in documents:
            tokens = template_tokens(vocab, template, query, document)
            run_sequence(ctx, batch, tokens)
            logits = np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, len(tokens) - 1), shape=(n_vocab,)).astype(np.float64)
            scores.append(1.0 / (1.0 + np.exp(logits[no] - logits[yes])))
    return np.array(scores)
