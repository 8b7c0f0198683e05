"""Synthetic BERT encoders of real shapes (BERT-base: 12 layers, 768 wide, 3,072 FFN, 12
heads, 30,522 tokens, 512 positions, mean pooling), for bench/synthetic.py, which writes
their F16 source and quantizes it as it does every other shape.

The tensors and keys are those llama.cpp's converter writes for a sentence-transformers BERT
(and tests/embedding_models.py's tiny one): token, token-type and position embeddings and
their LayerNorm; per layer q/k/v and the attention output with biases, a LayerNorm after
the attention's residual, the FFN (GELU) up and down with biases and a LayerNorm after its
residual; `bert.*` hyperparameters with attention.causal false and the pooling type. The
position and token-type tables stay F32, as the converter keeps them.

The vocabulary is a WordPiece one in llama.cpp's "phantom space" form (a word start behind
U+2581, a continuation bare, a control token as it is), laid out as bert-base-uncased's:
[PAD] 0, [UNK] 100, [CLS] 101, [SEP] 102, [MASK] 103 among [unusedN] up to id 998. Then
punctuation, digits and letters, common English words, every two- and three-letter word
start and every two-letter continuation, and three-letter continuations until the shape's
size: any lowercase English text tokenizes without [UNK] (a word not in the list becomes a
few pieces, about as a real BERT splits a rare word), which is all a speed measurement needs.
"""

from __future__ import annotations

import itertools
import string
from dataclasses import dataclass, replace

PHANTOM_SPACE = "\u2581"
SPECIALS = {"[PAD]": 0, "[UNK]": 100, "[CLS]": 101, "[SEP]": 102, "[MASK]": 103}  # bert-base-uncased's ids
FIRST_PIECE = 999  # bert-base-uncased's first id after its [unusedN]
PUNCTUATION = list("!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~")
SUFFIXES = ["s", "es", "ed", "ing", "ly", "er", "est", "tion", "ment", "ness", "able", "al", "ic", "ous", "ive", "ful", "less"]
WORDS = """the of and to in is was for on that with as it at by from be this are or an not have has had were
but which their they his her she he we you your our my me him them its all any some one two three four five
first new more most many other such what when where who how why than then there here into over after before
about up down out off so if no yes can will would could should may might must do does did done make made get
got go going went come came see saw know known think take took give given find found tell told ask work call
try use used need feel become leave put mean keep let begin seem help show hear play run move live believe
bring happen write provide sit stand lose pay meet include continue set learn change lead understand watch
follow stop create speak read allow add spend grow open walk win offer remember love consider appear buy wait
serve die send expect build stay fall cut reach remain suggest raise pass sell require report decide pull time
year people way day man woman child world life hand part place case week company system program question
government number night point home water room mother area money story fact month lot right study book eye job
word business issue side kind head house service friend father power hour game line end member law car city
name president team minute idea kid body information back parent face others level office door health person
art war history party result morning reason research girl guy moment air teacher force education good great
little own old big high different small large next early young important few public bad same able best better
sure free long last quick brown fox jumps lazy dog cat sat mat hello paris france capital london weather rain
sun cloud cold hot warm snow today tomorrow computer code python model language text search query document
answer sentence vector embedding retrieval data science learning machine neural network food apple fruit eat
drink coffee tea music song movie film sport football river mountain city country street market school student
university library science energy light sound color paper letter table chair window garden tree flower animal
""".split()


@dataclass(frozen=True)
class BertShape:
    """A BERT encoder's shape, as its config.json and its llama.cpp GGUF give it."""

    name: str
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_vocab: int
    n_ctx: int  # max_position_embeddings: the position table's rows, and the most tokens an input takes
    pooling: str = "mean"  # gguf's PoolingType name: mean | cls | last | rank
    norm_eps: float = 1e-12
    n_token_types: int = 2  # type_vocab_size
    arch: str = "bert"

    def cut(self, layers: int | None = None, vocab: int | None = None) -> BertShape:
        """The same shape with only its first `layers` layers and/or a vocabulary of `vocab`
        tokens, named so (NAME-L2-V5000), as bench/synthetic.py's shapes cut."""
        s = self if layers in (None, self.n_layer) else replace(self, name=f"{self.name}-L{layers}", n_layer=layers)
        return s if vocab in (None, s.n_vocab) else replace(s, name=f"{s.name}-V{vocab}", n_vocab=vocab)


BERT_SHAPES = {s.name: s for s in [
    BertShape("bert-base", 12, 768, 3072, 12, 30_522, 512),
    # a cross-encoder of the same shape: rank pooling and RoBERTa's classification head (cls.*)
    BertShape("bert-base-reranker", 12, 768, 3072, 12, 30_522, 512, pooling="rank"),
    # nomic-embed-text-v1.5's shape (nomic-bert: RoPE, fused q/k/v, SwiGLU, no biases but the norms')
    BertShape("nomic-embed-text", 12, 768, 3072, 12, 30_522, 2048, norm_eps=1e-12, arch="nomic-bert"),
    # for tests: the same tensors and vocabulary in seconds
    BertShape("tiny-bert", 2, 256, 512, 4, 30_522, 512),
    BertShape("tiny-bert-reranker", 2, 256, 512, 4, 30_522, 512, pooling="rank"),
]}  # fmt: skip


def tensor_plan(s: BertShape) -> list[tuple[str, tuple[int, ...], str]]:
    """(name, shape in numpy order [rows, cols], kind) of every tensor, in the converter's
    order; kinds as bench/synthetic.py's TensorSpec: matrix (F16), table (F32 rows), norm, bias."""
    if s.arch == "nomic-bert":
        return nomic_plan(s)
    plan = [("token_embd.weight", (s.n_vocab, s.n_embd), "matrix"),
            ("token_types.weight", (s.n_token_types, s.n_embd), "table"),  # llama.cpp adds row 0 to every token
            ("position_embd.weight", (s.n_ctx, s.n_embd), "table"),
            ("token_embd_norm.weight", (s.n_embd,), "norm"), ("token_embd_norm.bias", (s.n_embd,), "bias")]  # fmt: skip
    for i in range(s.n_layer):
        p = f"blk.{i}."
        for kind in ("attn_q", "attn_k", "attn_v", "attn_output"):
            plan += [(f"{p}{kind}.weight", (s.n_embd, s.n_embd), "matrix"), (f"{p}{kind}.bias", (s.n_embd,), "bias")]
        plan += [(p + "attn_output_norm.weight", (s.n_embd,), "norm"), (p + "attn_output_norm.bias", (s.n_embd,), "bias"),
                 (p + "ffn_up.weight", (s.n_ff, s.n_embd), "matrix"), (p + "ffn_up.bias", (s.n_ff,), "bias"),
                 (p + "ffn_down.weight", (s.n_embd, s.n_ff), "matrix"), (p + "ffn_down.bias", (s.n_embd,), "bias"),
                 (p + "layer_output_norm.weight", (s.n_embd,), "norm"), (p + "layer_output_norm.bias", (s.n_embd,), "bias")]  # fmt: skip
    if s.pooling == "rank":  # classifier.dense and classifier.out_proj, one label
        plan += [("cls.weight", (s.n_embd, s.n_embd), "matrix"), ("cls.bias", (s.n_embd,), "bias"),
                 ("cls.output.weight", (1, s.n_embd), "matrix"), ("cls.output.bias", (1,), "bias")]  # fmt: skip
    return plan


def nomic_plan(s: BertShape) -> list[tuple[str, tuple[int, ...], str]]:
    """nomic-bert's tensors (tests/embedding_models.write_nomic_bert's): no position table,
    one attn_qkv, a gated FFN, biases only on the LayerNorms."""
    plan = [("token_embd.weight", (s.n_vocab, s.n_embd), "matrix"), ("token_types.weight", (s.n_token_types, s.n_embd), "table"),
            ("token_embd_norm.weight", (s.n_embd,), "norm"), ("token_embd_norm.bias", (s.n_embd,), "bias")]  # fmt: skip
    for i in range(s.n_layer):
        p = f"blk.{i}."
        plan += [(p + "attn_qkv.weight", (3 * s.n_embd, s.n_embd), "matrix"), (p + "attn_output.weight", (s.n_embd, s.n_embd), "matrix"),
                 (p + "attn_output_norm.weight", (s.n_embd,), "norm"), (p + "attn_output_norm.bias", (s.n_embd,), "bias"),
                 (p + "ffn_gate.weight", (s.n_ff, s.n_embd), "matrix"), (p + "ffn_up.weight", (s.n_ff, s.n_embd), "matrix"),
                 (p + "ffn_down.weight", (s.n_embd, s.n_ff), "matrix"),
                 (p + "layer_output_norm.weight", (s.n_embd,), "norm"), (p + "layer_output_norm.bias", (s.n_embd,), "bias")]  # fmt: skip
    return plan


def base_vocabulary() -> list[str]:
    """The pieces every size keeps (as written: specials and [unusedN] to id 998, then every
    punctuation mark, digit and letter both as a word start and as a continuation)."""
    by_id = {i: t for t, i in SPECIALS.items()}
    unused = (f"{PHANTOM_SPACE}[unused{n}]" for n in itertools.count())
    tokens = [by_id[i] if i in by_id else next(unused) for i in range(FIRST_PIECE)]
    chars = list(string.digits + string.ascii_lowercase)
    return tokens + [PHANTOM_SPACE + c for c in [*PUNCTUATION, *chars]] + chars


MIN_VOCAB = len(base_vocabulary())


def more_pieces() -> list[str]:
    """Pieces past the base, most useful first: words, suffixes, two-letter starts and
    continuations, three-letter starts, three-letter continuations."""
    letters = string.ascii_lowercase
    two = ["".join(p) for p in itertools.product(letters, repeat=2)]
    three = ["".join(p) for p in itertools.product(letters, repeat=3)]
    pieces = [PHANTOM_SPACE + w for w in WORDS] + SUFFIXES + [PHANTOM_SPACE + p for p in two] + two
    return pieces + [PHANTOM_SPACE + p for p in three] + three


def wordpiece_vocabulary(n_vocab: int) -> tuple[list[str], list[int]]:
    """n_vocab distinct pieces and their token types (CONTROL for the specials, NORMAL for
    the rest, UNUSED for padding past every piece above)."""
    from gguf import TokenType

    if n_vocab < MIN_VOCAB:
        raise ValueError(f"a BERT vocabulary here takes at least {MIN_VOCAB:,} tokens, not {n_vocab:,}")
    tokens = list(dict.fromkeys([*base_vocabulary(), *more_pieces()]))[:n_vocab]
    types = [int(TokenType.CONTROL if t in SPECIALS else TokenType.NORMAL) for t in tokens]
    pad = range(len(tokens), n_vocab)
    return tokens + [f"[PAD{i}]" for i in pad], types + [int(TokenType.UNUSED)] * len(pad)


def add_metadata(w, s: BertShape) -> None:  # w: gguf.GGUFWriter
    """BertModel.set_gguf_parameters and set_vocab's keys (those of tests/embedding_models.py):
    [CLS] the BOS and [SEP] the EOS, both added, no separator between a pair's texts."""
    from gguf import LlamaFileType, PoolingType

    w.add_name(f"synthetic {s.name}")
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    w.add_context_length(s.n_ctx)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_block_count(s.n_layer)
    w.add_head_count(s.n_head)
    w.add_layer_norm_eps(s.norm_eps)
    w.add_causal_attention(False)
    if s.arch == "nomic-bert":
        w.add_rope_freq_base(1000.0)  # nomic's rotary_emb_base
    w.add_pooling_type(PoolingType[s.pooling.upper()])
    if s.pooling == "rank":
        w.add_classifier_output_labels(["LABEL_0"])
    from localinfer_quant.bert import add_bert_base_specials, add_pieces

    add_pieces(w, *wordpiece_vocabulary(s.n_vocab), n_token_types=s.n_token_types)
    add_bert_base_specials(w, SPECIALS)
