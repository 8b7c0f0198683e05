"""The real source models: the F16 widening of the embedded model and the HF folder round trip.

Everything runs on the real llama.cpp: the F16 GGUF must predict like the Q4_1 it came
from, and GGUF F16 -> HF folder -> GGUF F16 must give back the same tensors and logits.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gguf
import numpy as np
import pytest

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer_quant.hf import (
    UnsupportedSource,
    import_hf,
    permute_qk,
    read_checkpoint,
    read_safetensors,
    unpermute_qk,
    write_safetensors,
)
from localinfer_quant.source import TensorPlan, embedded_model_path

from ..conftest import THREADS

N_TOKENS = 128
TEXT = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk, carrying a small "
    "brass lamp and a notebook. He wrote down the color of the sky, the direction of the wind, "
    "and the names of the ships that passed the rocky point. Over forty years the notebooks "
    "filled three shelves in the kitchen. When the harbor office finally installed an automatic "
    "light in 1987, they asked him what he would do with his evenings. He said he would keep "
    "climbing the stairs, because the sea had not stopped changing, and someone ought to write "
    "it down. Children from the village still visit the tower to read his careful handwriting, "
    "and on stormy nights a light still burns in the upstairs window."
)
TOKENIZER_KEYS = [
    "tokenizer.ggml.model", "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
    "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
    "tokenizer.ggml.unknown_token_id", "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token",
    "tokenizer.chat_template",
]
HPARAM_KEYS = [
    "llama.block_count", "llama.context_length", "llama.embedding_length", "llama.feed_forward_length",
    "llama.attention.head_count", "llama.attention.head_count_kv", "llama.rope.freq_base",
    "llama.attention.layer_norm_rms_epsilon", "llama.rope.dimension_count", "general.file_type",
]


def teacher_forced(path: Path) -> tuple[list[int], np.ndarray]:
    """The first N_TOKENS tokens of TEXT and llama.cpp's logits at every position."""
    backend = LlamaCppBackend.load(path, LoadParams(n_ctx=512, n_threads=THREADS))
    try:
        tokens = backend.tokenize(TEXT, add_special=True)[:N_TOKENS]
        assert len(tokens) == N_TOKENS
        return tokens, backend.forward(Batch.for_sequence(tokens, 0, all_logits=True)).copy()
    finally:
        backend.close()


def field(reader: gguf.GGUFReader, key: str) -> object:
    f = reader.get_field(key)
    return None if f is None else f.contents()


@pytest.fixture(scope="module")
def f16_reader(f16_source_path: Path) -> gguf.GGUFReader:
    return gguf.GGUFReader(f16_source_path)


@pytest.fixture(scope="module")
def f16_logits(f16_source_path: Path) -> tuple[list[int], np.ndarray]:
    return teacher_forced(f16_source_path)


@pytest.fixture(scope="module")
def round_trip_path(hf_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return import_hf(hf_folder, tmp_path_factory.mktemp("round-trip") / "round-trip.F16.gguf")


# --- the F16 source ----------------------------------------------------------------------
def test_f16_source_is_f16_with_all_metadata(f16_reader: gguf.GGUFReader) -> None:
    q4 = gguf.GGUFReader(embedded_model_path())
    assert field(f16_reader, "general.file_type") == gguf.LlamaFileType.MOSTLY_F16
    for key in q4.fields:
        if not key.startswith("GGUF.") and key != "general.file_type":
            assert field(f16_reader, key) == field(q4, key), key
    assert [t.name for t in f16_reader.tensors] == [t.name for t in q4.tensors]
    for t in f16_reader.tensors:
        want = gguf.GGMLQuantizationType.F16 if len(t.shape) == 2 else gguf.GGMLQuantizationType.F32
        assert t.tensor_type == want, t.name


def test_f16_source_predicts_like_the_q4_1_it_came_from(f16_logits: tuple[list[int], np.ndarray]) -> None:
    tokens, f16 = f16_logits
    q4_tokens, q4 = teacher_forced(embedded_model_path())
    assert q4_tokens == tokens
    agreement = float((f16.argmax(1) == q4.argmax(1)).mean())
    mean_delta = float(np.abs(f16 - q4).mean())
    # Same weights; only llama.cpp's activation rounding differs (Q8_1 for Q4_1 dot products,
    # F16 for F16 ones): measured agreement 0.96, mean |delta| 0.16 against a logit std of 6.
    assert agreement >= 0.95, agreement
    assert mean_delta < 0.4, mean_delta


# --- the HF folder -----------------------------------------------------------------------
def test_hf_folder_is_a_llama_checkpoint(hf_folder: Path, f16_reader: gguf.GGUFReader) -> None:
    config = json.loads((hf_folder / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    meta = lambda key: f16_reader.get_field(f"llama.{key}").contents()  # noqa: E731 - what the GGUF says
    assert (config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]) == (meta("embedding_length"), meta("feed_forward_length"), meta("block_count"))
    assert (config["num_attention_heads"], config["num_key_value_heads"]) == (meta("attention.head_count"), meta("attention.head_count_kv"))
    assert config["vocab_size"] == len(f16_reader.get_field("tokenizer.ggml.tokens").contents())
    assert config["rms_norm_eps"] == pytest.approx(meta("attention.layer_norm_rms_epsilon")) and config["rope_theta"] == meta("rope.freq_base")
    assert config["tie_word_embeddings"] is True and config["torch_dtype"] == "float16"
    assert (config["bos_token_id"], config["eos_token_id"]) == (1, 2)

    tensors = read_safetensors(hf_folder / "model.safetensors")
    assert "lm_head.weight" not in tensors
    assert len(tensors) == 2 + 30 * 9
    assert tensors["model.embed_tokens.weight"].shape == (49152, 576)
    assert tensors["model.layers.0.self_attn.k_proj.weight"].shape == (192, 576)
    assert tensors["model.norm.weight"].dtype == np.float32

    # q/k rows are back in HF order: the GGUF's rows are the converter's permutation of them.
    gguf_q = {t.name: np.asarray(t.data) for t in f16_reader.tensors if t.name.startswith("blk.5.attn_")}
    hf_q = tensors["model.layers.5.self_attn.q_proj.weight"]
    hf_k = tensors["model.layers.5.self_attn.k_proj.weight"]
    assert not np.array_equal(hf_q, gguf_q["blk.5.attn_q.weight"])
    assert np.array_equal(permute_qk(hf_q, 9), gguf_q["blk.5.attn_q.weight"])
    assert np.array_equal(permute_qk(hf_k, 3), gguf_q["blk.5.attn_k.weight"])
    assert np.array_equal(tensors["model.layers.5.self_attn.v_proj.weight"], gguf_q["blk.5.attn_v.weight"])


def test_hf_tokenizer_files_carry_the_gguf_vocabulary(hf_folder: Path, f16_reader: gguf.GGUFReader) -> None:
    tokenizer = json.loads((hf_folder / "tokenizer.json").read_text())
    tokenizer_config = json.loads((hf_folder / "tokenizer_config.json").read_text())
    tokens = field(f16_reader, "tokenizer.ggml.tokens")
    vocab = tokenizer["model"]["vocab"]
    assert tokenizer["model"]["type"] == "BPE" and len(vocab) == len(tokens) == 49152
    assert all(vocab[t] == i for i, t in enumerate(tokens))
    assert tokenizer["model"]["merges"] == field(f16_reader, "tokenizer.ggml.merges")
    assert {a["content"] for a in tokenizer["added_tokens"] if a["special"]} >= {"<|im_start|>", "<|im_end|>"}
    assert tokenizer_config["chat_template"] == field(f16_reader, "tokenizer.chat_template")
    assert (tokenizer_config["bos_token"], tokenizer_config["eos_token"]) == ("<|im_start|>", "<|im_end|>")
    assert tokenizer_config["add_bos_token"] is False


# --- the round trip ----------------------------------------------------------------------
def test_round_trip_keeps_every_tensor_and_the_tokenizer(round_trip_path: Path, f16_reader: gguf.GGUFReader) -> None:
    back = gguf.GGUFReader(round_trip_path)
    assert [t.name for t in back.tensors] == [t.name for t in f16_reader.tensors]
    for a, b in zip(f16_reader.tensors, back.tensors):
        assert a.tensor_type == b.tensor_type and list(a.shape) == list(b.shape), a.name
        assert np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name
    for key in TOKENIZER_KEYS + HPARAM_KEYS:
        assert field(back, key) == field(f16_reader, key), key


def test_round_trip_keeps_the_logits(round_trip_path: Path, f16_logits: tuple[list[int], np.ndarray]) -> None:
    tokens, f16 = f16_logits
    back_tokens, back = teacher_forced(round_trip_path)
    assert back_tokens == tokens
    assert float(np.abs(back - f16).max()) <= 1e-3  # identical F16 weights: measured 0.0


def test_qwen2_import_keeps_hf_rope_order(hf_folder: Path, tmp_path: Path, f16_logits: tuple[list[int], np.ndarray]) -> None:
    """The same weights labelled qwen2 (HF q/k order, NeoX RoPE, zero q/k/v biases) predict
    like the llama GGUF (permuted q/k, interleaved RoPE): the permutation is the right one."""
    folder = tmp_path / "as-qwen2"
    folder.mkdir()
    for f in hf_folder.glob("*.json"):
        shutil.copy(f, folder)
    config = json.loads((hf_folder / "config.json").read_text())
    config.update(model_type="qwen2", architectures=["Qwen2ForCausalLM"])
    (folder / "config.json").write_text(json.dumps(config))
    tensors = read_checkpoint(hf_folder)
    plans = [TensorPlan(n, a.shape, a.dtype, lambda a=a: a) for n, a in tensors.items()]
    for i in range(config["num_hidden_layers"]):
        for proj in ("q", "k", "v"):
            rows = tensors[f"model.layers.{i}.self_attn.{proj}_proj.weight"].shape[0]
            plans.append(TensorPlan(f"model.layers.{i}.self_attn.{proj}_proj.bias", (rows,), np.dtype(np.float32),
                                    lambda rows=rows: np.zeros(rows, np.float32)))
    write_safetensors(folder / "model.safetensors", plans)
    path = import_hf(folder, tmp_path / "as-qwen2.gguf")
    assert field(gguf.GGUFReader(path), "general.architecture") == "qwen2"

    tokens, llama = f16_logits
    qwen_tokens, qwen = teacher_forced(path)
    assert qwen_tokens == tokens
    # Two RoPE kernels and F16 activations: measured max |delta| 0.037, mean 0.005.
    assert float(np.abs(qwen - llama).max()) < 0.25
    assert float(np.abs(qwen - llama).mean()) < 0.02


# --- small pieces ------------------------------------------------------------------------
def test_permutation_round_trips() -> None:
    w = np.arange(2 * 8 * 3, dtype=np.float32).reshape(16, 3)
    assert np.array_equal(unpermute_qk(permute_qk(w, 2), 2), w)
    # Within a head, rows (0..3 | 4..7) become pairs (0,4), (1,5), ...
    assert permute_qk(np.arange(8.0), 1).tolist() == [0, 4, 1, 5, 2, 6, 3, 7]


def test_safetensors_bf16_reads_as_float32(tmp_path: Path) -> None:
    values = np.array([1.0, -2.5, 0.15625], dtype=np.float32)
    bf16 = (values.view(np.uint32) >> 16).astype(np.uint16)
    header = json.dumps({"w": {"dtype": "BF16", "shape": [3], "data_offsets": [0, 6]}}).encode()
    (tmp_path / "x.safetensors").write_bytes(len(header).to_bytes(8, "little") + header + bf16.tobytes())
    assert read_safetensors(tmp_path / "x.safetensors")["w"].tolist() == values.tolist()


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"model_type": "gpt_neox", "architectures": ["GPTNeoXForCausalLM"]}, "gpt_neox"),
        ({"architectures": ["LlavaForConditionalGeneration"]}, "LlavaForConditionalGeneration"),
        ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ],
)
def test_unsupported_source_is_a_clear_error(hf_folder: Path, tmp_path: Path, changes: dict, named: str) -> None:
    config = json.loads((hf_folder / "config.json").read_text())
    (tmp_path / "config.json").write_text(json.dumps({**config, **changes}))
    with pytest.raises(UnsupportedSource, match=named):
        import_hf(tmp_path, tmp_path / "out.gguf")
