"""A BERT sentence-transformers folder, written here as transformers and sentence-transformers
save one, converted by `localinfer quantize`: llama.cpp's vectors from the GGUF must equal
those of a numpy BERT forward pass over the folder's own weights.

The weights are tiny and random (hidden 64, 2 layers, 4 heads, FFN 128, 128 positions, two
token types); the vocabulary is a few hundred WordPiece pieces in bert-base-uncased's layout.
llama.cpp tokenizes the converted file; a WordPiece tokenizer written here over vocab.txt
must give the same ids, so the vocabulary's phantom-space form is checked on its own, and
both forward passes then read the same ids.
"""

from __future__ import annotations

import json
import math
import shutil
import unicodedata
from pathlib import Path

import gguf
import numpy as np
import pytest

from localinfer.backends.llamacpp import Tokenizer
from localinfer_quant.hf import read_safetensors, write_safetensors
from localinfer_quant.source import TensorPlan

from ..conftest import run_cli
from ..embedding_models import llamacpp_embeddings

N_EMBD, N_LAYER, N_HEAD, N_FF, N_CTX, N_TYPES, EPS = 64, 2, 4, 128, 128, 2, 1e-12
SPECIALS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
WORDS = """the a an of and to in is was it on for with as at by from this that be are or not
he she they we you i my your his her their our what when where who how why which there here
quick brown fox jumps over lazy dog cat sat mat play game run walk talk sing read write book
house car city country river sea sky sun moon star rain snow wind tree flower bird fish water
fire earth light dark day night time year week good bad new old big small long short high low
hot cold happy sad fast slow hello world paris france london rome capital weather today model
vector search query document text sentence word number one two three four five six seven
eight nine ten first last next open close learn teach work rest music song movie coffee tea
""".split()
SUFFIXES = ["s", "es", "ed", "ing", "er", "est", "ly", "ness", "ful", "less"]
TEXTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Hello, world! Playing games is the happiest thing.",
    "Where is the capital of France? Paris, of course.",
    "Xylophones cost 42€ today",  # words that fall back to letters, or to [UNK]
]


# --- the folder, as transformers and sentence-transformers write it ------------------------
def vocabulary() -> list[str]:
    """bert-base-uncased's layout in small: [PAD], [unusedN], [UNK] [CLS] [SEP] [MASK], then
    punctuation, letters and digits, whole words, and "##" continuations."""
    tokens = ["[PAD]", *(f"[unused{i}]" for i in range(8)), "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    chars = list("abcdefghijklmnopqrstuvwxyz0123456789")
    tokens += list(dict.fromkeys([*".,!?;:'\"-()", *chars, *WORDS]))
    tokens += ["##" + c for c in dict.fromkeys([*chars, *SUFFIXES])]
    return tokens


def tokenizer_files(tokens: list[str]) -> dict[str, object]:
    """tokenizer.json (BertTokenizerFast), tokenizer_config.json, special_tokens_map.json."""
    ids = {t: i for i, t in enumerate(tokens)}
    added = [{"id": ids[t], "content": t, "single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
             for t in sorted(SPECIALS, key=ids.get)]  # fmt: skip
    special = lambda t, type_id: {"SpecialToken": {"id": t, "type_id": type_id}}  # noqa: E731
    sequence = lambda s, type_id: {"Sequence": {"id": s, "type_id": type_id}}  # noqa: E731
    tokenizer = {
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added,
        "normalizer": {"type": "BertNormalizer", "clean_text": True, "handle_chinese_chars": True, "strip_accents": None, "lowercase": True},
        "pre_tokenizer": {"type": "BertPreTokenizer"},
        "post_processor": {
            "type": "TemplateProcessing",
            "single": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0)],
            "pair": [special("[CLS]", 0), sequence("A", 0), special("[SEP]", 0), sequence("B", 1), special("[SEP]", 1)],
            "special_tokens": {t: {"id": t, "ids": [ids[t]], "tokens": [t]} for t in ("[CLS]", "[SEP]")},
        },
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": True},
        "model": {"type": "WordPiece", "unk_token": "[UNK]", "continuing_subword_prefix": "##", "max_input_chars_per_word": 100, "vocab": ids},
    }  # fmt: skip
    names = {"cls_token": "[CLS]", "mask_token": "[MASK]", "pad_token": "[PAD]", "sep_token": "[SEP]", "unk_token": "[UNK]"}
    config = {
        "added_tokens_decoder": {str(a["id"]): {k: v for k, v in a.items() if k != "id"} for a in added},
        "clean_up_tokenization_spaces": True, "do_basic_tokenize": True, "do_lower_case": True, "model_max_length": N_CTX,
        "never_split": None, "strip_accents": None, "tokenize_chinese_chars": True, "tokenizer_class": "BertTokenizer", **names,
    }  # fmt: skip
    return {"tokenizer.json": tokenizer, "tokenizer_config.json": config, "special_tokens_map.json": names}


def bert_weights(n_vocab: int, rng: np.random.Generator) -> dict[str, np.ndarray]:
    """BertModel's state dict as save_pretrained writes it (float32, pooler included)."""
    def linear(name: str, rows: int, cols: int) -> dict[str, np.ndarray]:
        return {name + ".weight": rng.standard_normal((rows, cols)) / np.sqrt(cols), name + ".bias": 0.1 * rng.standard_normal(rows)}

    def layer_norm(name: str) -> dict[str, np.ndarray]:
        return {name + ".weight": 1 + 0.1 * rng.standard_normal(N_EMBD), name + ".bias": 0.1 * rng.standard_normal(N_EMBD)}

    w = {"embeddings.word_embeddings.weight": rng.standard_normal((n_vocab, N_EMBD)),
         "embeddings.position_embeddings.weight": 0.5 * rng.standard_normal((N_CTX, N_EMBD)),
         "embeddings.token_type_embeddings.weight": 0.5 * rng.standard_normal((N_TYPES, N_EMBD)),
         **layer_norm("embeddings.LayerNorm")}  # fmt: skip
    for i in range(N_LAYER):
        p = f"encoder.layer.{i}."
        for part in ("query", "key", "value"):
            w |= linear(p + "attention.self." + part, N_EMBD, N_EMBD)
        w |= linear(p + "attention.output.dense", N_EMBD, N_EMBD) | layer_norm(p + "attention.output.LayerNorm")
        w |= linear(p + "intermediate.dense", N_FF, N_EMBD) | linear(p + "output.dense", N_EMBD, N_FF) | layer_norm(p + "output.LayerNorm")
    w |= linear("pooler.dense", N_EMBD, N_EMBD)
    return {k: v.astype(np.float32) for k, v in w.items()}


def pooling_config(mode: str) -> dict[str, object]:
    flags = {f"pooling_mode_{m}": m == mode for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")}
    return {"word_embedding_dimension": N_EMBD, **flags, "include_prompt": True}


def write_folder(folder: Path, pooling: str | None = "mean_tokens", seed: int = 0) -> Path:
    """A sentence-transformers BERT folder; `pooling` None leaves out its pooling files."""
    folder.mkdir(parents=True)
    tokens = vocabulary()
    write_json = lambda name, data: (folder / name).write_text(json.dumps(data, indent=2) + "\n")  # noqa: E731
    write_json("config.json", {
        "architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "classifier_dropout": None, "hidden_act": "gelu",
        "hidden_dropout_prob": 0.1, "hidden_size": N_EMBD, "initializer_range": 0.02, "intermediate_size": N_FF,
        "layer_norm_eps": EPS, "max_position_embeddings": N_CTX, "model_type": "bert", "num_attention_heads": N_HEAD,
        "num_hidden_layers": N_LAYER, "pad_token_id": 0, "position_embedding_type": "absolute", "torch_dtype": "float32",
        "transformers_version": "4.44.2", "type_vocab_size": N_TYPES, "use_cache": True, "vocab_size": len(tokens),
    })  # fmt: skip
    for name, data in tokenizer_files(tokens).items():
        write_json(name, data)
    (folder / "vocab.txt").write_text("\n".join(tokens) + "\n")
    weights = bert_weights(len(tokens), np.random.default_rng(seed))
    write_safetensors(folder / "model.safetensors", [TensorPlan(k, v.shape, v.dtype, lambda v=v: v) for k, v in weights.items()])
    if pooling is not None:
        write_json("modules.json", [
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ])  # fmt: skip
        write_json("sentence_bert_config.json", {"max_seq_length": N_CTX, "do_lower_case": False})
        (folder / "1_Pooling").mkdir()
        write_json("1_Pooling/config.json", pooling_config(pooling))
        (folder / "2_Normalize").mkdir()
    return folder


@pytest.fixture(scope="module")
def bert_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_folder(tmp_path_factory.mktemp("hf") / "tiny-bert")


# --- the references ----------------------------------------------------------------------
def punctuation(c: str) -> bool:
    """BERT's _is_punctuation: ASCII's non-alphanumeric symbols, and Unicode's P* (not "€")."""
    return (c.isascii() and c.isprintable() and not c.isalnum() and c != " ") or unicodedata.category(c).startswith("P")


def wordpiece(text: str, vocab: dict[str, int]) -> list[int]:
    """BERT's uncased tokenizer on ASCII text: lowercase, split at spaces and punctuation,
    then each word's longest known prefix, and "##" pieces after it; [UNK] for a word that
    does not split; [CLS] ... [SEP] around it all."""
    ids = [vocab["[CLS]"]]
    for word in "".join(f" {c} " if punctuation(c) else c for c in text.lower()).split():
        pieces, start = [], 0
        while start < len(word):
            end = len(word)
            while end > start and ("##" if start else "") + word[start:end] not in vocab:
                end -= 1
            if end == start:
                pieces = [vocab["[UNK]"]]
                break
            pieces.append(vocab[("##" if start else "") + word[start:end]])
            start = end
        ids += pieces
    return ids + [vocab["[SEP]"]]


def layer_norm(x: np.ndarray, w: np.ndarray, b: np.ndarray) -> np.ndarray:
    mean = x.mean(-1, keepdims=True)
    var = ((x - mean) ** 2).mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(var + EPS) * w + b


def gelu(x: np.ndarray) -> np.ndarray:
    """BERT's GELU, with erf (HF's "gelu"): x * Phi(x)."""
    return x * 0.5 * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0)))


def bert_forward(w: dict[str, np.ndarray], ids: list[int]) -> np.ndarray:
    """BertModel's last hidden states [n_tokens, n_embd], in float64, every token of type 0."""
    w = {k: v.astype(np.float64) for k, v in w.items()}
    lin = lambda x, name: x @ w[name + ".weight"].T + w[name + ".bias"]  # noqa: E731  (HF Linear: weight [out, in])
    norm = lambda x, name: layer_norm(x, w[name + ".weight"], w[name + ".bias"])  # noqa: E731
    n, d = len(ids), N_EMBD // N_HEAD
    x = w["embeddings.word_embeddings.weight"][ids] + w["embeddings.position_embeddings.weight"][:n] + w["embeddings.token_type_embeddings.weight"][0]
    x = norm(x, "embeddings.LayerNorm")  # [n, n_embd]
    for i in range(N_LAYER):
        p = f"encoder.layer.{i}."
        q, k, v = (lin(x, p + "attention.self." + part).reshape(n, N_HEAD, d).transpose(1, 0, 2) for part in ("query", "key", "value"))
        scores = q @ k.transpose(0, 2, 1) / math.sqrt(d)  # [head, n, n]: every token sees every token
        probs = np.exp(scores - scores.max(-1, keepdims=True))
        probs /= probs.sum(-1, keepdims=True)
        context = (probs @ v).transpose(1, 0, 2).reshape(n, N_EMBD)
        x = norm(x + lin(context, p + "attention.output.dense"), p + "attention.output.LayerNorm")  # post-norm
        x = norm(x + lin(gelu(lin(x, p + "intermediate.dense")), p + "output.dense"), p + "output.LayerNorm")
    return x


def sentence_vector(hidden: np.ndarray, pooling: str) -> np.ndarray:
    """sentence-transformers' Pooling then Normalize."""
    pooled = {"mean_tokens": hidden.mean(0), "cls_token": hidden[0], "lasttoken": hidden[-1]}[pooling]
    return pooled / np.linalg.norm(pooled)


def reference_vectors(folder: Path, gguf_path: Path, pooling: str) -> np.ndarray:
    weights = read_safetensors(folder / "model.safetensors")
    tokenizer = Tokenizer.load(gguf_path)
    try:
        ids = [tokenizer.tokenize(t, add_special=True) for t in TEXTS]
    finally:
        tokenizer.close()
    return np.stack([sentence_vector(bert_forward(weights, i), pooling) for i in ids])


def quantize(folder: Path, qtype: str, out: Path) -> Path:
    result = run_cli("quantize", str(folder), qtype, "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    return out


def field(path: Path, key: str) -> object:
    f = gguf.GGUFReader(path).get_field(key)
    return None if f is None else f.contents()


def model_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.iterdir() if p.name.endswith(".gguf") or ".partial" in p.name)


@pytest.fixture(scope="module")
def bert_f16(bert_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return quantize(bert_folder, "F16", tmp_path_factory.mktemp("gguf") / "tiny-bert-F16.gguf")


# --- the converted file ------------------------------------------------------------------
def test_tensors_and_metadata_are_llama_cpps(bert_f16: Path) -> None:
    reader = gguf.GGUFReader(bert_f16)
    types = {t.name: t.tensor_type.name for t in reader.tensors}
    block = ["attn_q", "attn_k", "attn_v", "attn_output", "attn_output_norm", "ffn_up", "ffn_down", "layer_output_norm"]
    expected = {"token_embd.weight", "token_types.weight", "position_embd.weight", "token_embd_norm.weight", "token_embd_norm.bias"}
    expected |= {f"blk.{i}.{t}.{s}" for i in range(N_LAYER) for t in block for s in ("weight", "bias")}
    assert set(types) == expected  # the pooler is gone
    for name, qtype in types.items():
        vector = name.endswith(".bias") or "_norm." in name
        # the converter keeps position and token-type embeddings F32, and llama.cpp's quantizer leaves them
        assert qtype == ("F32" if vector or name in ("token_types.weight", "position_embd.weight") else "F16"), name
    want = {
        "general.architecture": "bert", "bert.context_length": N_CTX, "bert.embedding_length": N_EMBD,
        "bert.feed_forward_length": N_FF, "bert.block_count": N_LAYER, "bert.attention.head_count": N_HEAD,
        "bert.attention.causal": False, "bert.pooling_type": int(gguf.PoolingType.MEAN),
        "tokenizer.ggml.model": "bert", "tokenizer.ggml.token_type_count": N_TYPES,
    }  # fmt: skip
    for key, value in want.items():
        assert reader.get_field(key).contents() == value, key
    assert reader.get_field("bert.attention.layer_norm_epsilon").contents() == pytest.approx(EPS)


def test_wordpiece_vocabulary_in_llama_cpps_form(bert_folder: Path, bert_f16: Path) -> None:
    hf = vocabulary()
    tokens = field(bert_f16, "tokenizer.ggml.tokens")
    types = field(bert_f16, "tokenizer.ggml.token_type")
    assert len(tokens) == len(hf)
    for i, piece in enumerate(hf):
        if piece in SPECIALS:
            assert (tokens[i], types[i]) == (piece, gguf.TokenType.CONTROL), piece  # kept as it is
        elif piece.startswith("##"):
            assert (tokens[i], types[i]) == (piece[2:], gguf.TokenType.NORMAL), piece  # a continuation: bare
        else:
            assert (tokens[i], types[i]) == ("\u2581" + piece, gguf.TokenType.NORMAL), piece  # a word start: phantom space
    ids = {t: i for i, t in enumerate(hf)}
    # as gguf's SpecialVocab reads tokenizer_config.json: [CLS] is the BOS, [SEP] the EOS (no CLS key)
    keys = gguf.Keys.Tokenizer
    special = {keys.BOS_ID: "[CLS]", keys.EOS_ID: "[SEP]", keys.SEP_ID: "[SEP]", keys.PAD_ID: "[PAD]", keys.UNK_ID: "[UNK]", keys.MASK_ID: "[MASK]"}
    for key, token in special.items():
        assert field(bert_f16, key) == ids[token], key
    assert (field(bert_f16, keys.ADD_BOS), field(bert_f16, keys.ADD_EOS)) == (True, True)  # "[CLS] $A [SEP]"
    # llama.cpp's WordPiece over the converted vocabulary splits as BERT's does over vocab.txt
    tokenizer = Tokenizer.load(bert_f16)
    try:
        for text in TEXTS:
            assert tokenizer.tokenize(text, add_special=True) == wordpiece(text, ids), text
    finally:
        tokenizer.close()
    assert ids["[UNK]"] in wordpiece(TEXTS[-1], ids) and ids["##ing"] in wordpiece(TEXTS[1], ids)  # the texts reach both


def test_vectors_equal_a_numpy_bert(bert_folder: Path, bert_f16: Path) -> None:
    ours = llamacpp_embeddings(bert_f16, TEXTS)
    reference = reference_vectors(bert_folder, bert_f16, "mean_tokens")
    assert_close_to_f16_llama_cpp(ours, reference)


def assert_close_to_f16_llama_cpp(ours: np.ndarray, reference: np.ndarray) -> None:
    """Unit vectors of 64 (components near 0.12), against a float64 pass over the float32
    weights. llama.cpp holds the matrices in F16 (2^-11 relative each), rounds activations,
    K and V to F16 for its products and runs the FFN with the tanh GELU where BERT has erf
    (at most 4.7e-4 apart, at 2.7). Measured over three poolings: max |delta| 2.3e-4,
    cosine 1 - 2.5e-7. A wrong tensor, transpose, norm or pooling moves them by 0.1 and more."""
    assert np.abs(ours - reference).max() < 2e-3
    assert (ours * reference).sum(1).min() > 1 - 1e-5


@pytest.mark.parametrize("pooling", ["cls_token", "lasttoken"])
def test_pooling_comes_from_the_sentence_transformers_files(pooling: str, tmp_path: Path) -> None:
    folder = write_folder(tmp_path / "st", pooling, seed=1)
    path = quantize(folder, "F16", tmp_path / "st.gguf")
    kind = {"cls_token": gguf.PoolingType.CLS, "lasttoken": gguf.PoolingType.LAST}[pooling]
    assert field(path, "bert.pooling_type") == int(kind)
    assert_close_to_f16_llama_cpp(llamacpp_embeddings(path, TEXTS), reference_vectors(folder, path, pooling))


def test_without_pooling_files_a_bert_pools_by_mean(bert_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    shutil.copytree(bert_folder, folder, ignore=shutil.ignore_patterns("modules.json", "1_Pooling", "2_Normalize", "sentence_bert_config.json"))
    path = quantize(folder, "F16", tmp_path / "plain.gguf")
    assert field(path, "bert.pooling_type") == int(gguf.PoolingType.MEAN)


def test_q8_0_stays_close(bert_folder: Path, tmp_path: Path) -> None:
    path = quantize(bert_folder, "Q8_0", tmp_path / "tiny-bert-Q8_0.gguf")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    matrices = {n for n in types if n.endswith(".weight") and "_norm." not in n} - {"token_types.weight", "position_embd.weight"}
    assert {types[n] for n in matrices} == {"Q8_0"}
    assert {types[n] for n in set(types) - matrices} == {"F32"}  # norms, biases, positions and token types
    ours = llamacpp_embeddings(path, TEXTS)
    reference = reference_vectors(bert_folder, path, "mean_tokens")
    # Q8_0 moves each weight by up to 1/254 of its block of 32's largest, and llama.cpp rounds
    # the activations to Q8_0 for those products too: measured max |delta| 6.0e-3, cosine 1 - 8.8e-5
    assert np.abs(ours - reference).max() < 0.03
    assert (ours * reference).sum(1).min() > 1 - 1e-3


@pytest.mark.parametrize("qtype", ["BF16", "Q4_0", "Q5_K_M", "IQ4_NL"])
def test_other_types_follow(qtype: str, bert_folder: Path, tmp_path: Path) -> None:
    """Any type the quantizer takes: rows of 64 are too short for the K-quants' blocks of 256,
    so llama.cpp falls back to Q5_0/Q5_1/Q8_0 for those, as it does for any such model."""
    path = quantize(bert_folder, qtype, tmp_path / f"tiny-bert-{qtype}.gguf")
    types = {t.name: t.tensor_type.name for t in gguf.GGUFReader(path).tensors}
    assert types["position_embd.weight"] == types["token_types.weight"] == "F32"
    ours = llamacpp_embeddings(path, TEXTS)
    # 4 and 5 bits per weight of a 64-wide random model: measured cosine 1 - 0.017 at worst (Q4_0)
    assert (ours * reference_vectors(bert_folder, path, "mean_tokens")).sum(1).min() > 0.95


# --- what is refused ---------------------------------------------------------------------
def broken(folder: Path, case: str) -> None:
    """Damage a copy of the folder the way `case` says."""
    config = json.loads((folder / "config.json").read_text())
    if case == "no tokenizer":
        (folder / "tokenizer.json").unlink()
    elif case == "bad config":
        (folder / "config.json").write_text('{"model_type": "bert", "hidden_size": 64,')
    elif case == "roberta":
        (folder / "config.json").write_text(json.dumps({**config, "model_type": "roberta", "architectures": ["RobertaModel"]}))
    elif case == "max pooling":
        (folder / "1_Pooling" / "config.json").write_text(json.dumps(pooling_config("max_tokens")))
    elif case == "missing layer":
        (folder / "config.json").write_text(json.dumps({**config, "num_hidden_layers": N_LAYER + 1}))
    elif case == "classifier":
        (folder / "config.json").write_text(json.dumps({**config, "architectures": ["BertForSequenceClassification"]}))


@pytest.mark.parametrize(
    "case, message",
    [
        ("no tokenizer", "has no tokenizer.json"),
        ("bad config", "config.json is not valid JSON"),
        ("roberta", "unsupported model_type 'roberta' in {folder}/config.json; supported: llama, mistral, qwen2, qwen3, bert"),
        ("max pooling", "asks for max_tokens pooling; a GGUF pools by mean, cls token or last token"),
        ("missing layer", "lacks 16 tensor(s) a BERT needs, e.g. blk.2.attn_k.bias"),
        ("classifier", "unsupported architecture 'BertForSequenceClassification'"),
    ],
)
def test_bad_folders_are_one_line_and_leave_nothing(case: str, message: str, bert_folder: Path, tmp_path: Path) -> None:
    folder = tmp_path / "damaged"
    shutil.copytree(bert_folder, folder)
    broken(folder, case)
    result = run_cli("quantize", str(folder), "Q8_0", "-o", str(tmp_path / "out.gguf"))
    assert result.returncode == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and message.format(folder=folder) in lines[0], result.stderr
    assert model_files(tmp_path) == []
