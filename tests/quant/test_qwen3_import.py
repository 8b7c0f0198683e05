"""qwen3 among the converter's decoder families: a tiny qwen3 in llama.cpp's own tensor names
(tests/native/test_architectures.py's), written here as a Hugging Face Qwen3 checkpoint
under transformers' names, must come back from `localinfer quantize` as the same tensors,
metadata and logits.

Qwen3 differs from qwen2 in what the converter must carry: no q/k/v biases, a per-head
RMSNorm of q and k (q_norm/k_norm -> attn_q_norm/attn_k_norm), HF's q/k row order kept
(llama.cpp runs it with NeoX RoPE; a permutation would change the logits) and a head size
of its own (head_dim, 32 here where hidden/heads is 16). Qwen3-Embedding is saved by
sentence-transformers without the `model.` prefix and with last-token pooling: that
layout converts to the same file, with qwen3.pooling_type = last.
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
from localinfer_quant.hf import write_safetensors
from localinfer_quant.source import TensorPlan, widen_to_f16

from ..conftest import THREADS, run_cli
from ..embedding_models import llamacpp_embeddings
from ..native.test_architectures import N_EMBD, N_FF, N_LAYER, tiny_model, vocabulary_of
from .test_source_models import TEXT

N_HEAD, N_HEAD_KV, HEAD_DIM = 4, 2, 32  # test_architectures' qwen3: heads of 32, 4 x 32 = 128 query values from 64
# transformers' Qwen3ForCausalLM names, by llama.cpp's
HF_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm"}
HF_BLOCK = {
    "attn_norm": "input_layernorm", "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj", "attn_v": "self_attn.v_proj",
    "attn_q_norm": "self_attn.q_norm", "attn_k_norm": "self_attn.k_norm", "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm", "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj",
}  # fmt: skip
HPARAMS = ["block_count", "context_length", "embedding_length", "feed_forward_length", "attention.head_count",
           "attention.head_count_kv", "attention.key_length", "attention.value_length", "rope.freq_base",
           "attention.layer_norm_rms_epsilon"]  # fmt: skip
TEXTS = ["The lighthouse keeper climbed the stairs.", "Retrieval needs one vector per text."]


def hf_name(name: str, prefix: str) -> str:
    """blk.1.attn_q_norm.weight -> model.layers.1.self_attn.q_norm.weight (prefix "model.")."""
    base, _, suffix = name.rpartition(".")
    if base in HF_NAMES:
        return prefix + HF_NAMES[base].removeprefix("model.") + "." + suffix
    _, layer, kind = base.split(".")
    return f"{prefix}layers.{layer}.{HF_BLOCK[kind]}.{suffix}"


def write_qwen3_folder(source: gguf.GGUFReader, tokenizer_from: Path, folder: Path, sentence_transformers: bool) -> Path:
    """The F16 GGUF's tensors as a Qwen3 checkpoint: config.json as transformers writes a
    Qwen3Config, the tokenizer files of the same vocabulary, model.safetensors."""
    folder.mkdir(parents=True)
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        shutil.copy(tokenizer_from / name, folder / name)
    config = {
        "architectures": ["Qwen3ForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 1,
        "eos_token_id": 2, "head_dim": HEAD_DIM, "hidden_act": "silu", "hidden_size": N_EMBD, "initializer_range": 0.02,
        "intermediate_size": N_FF, "max_position_embeddings": 512, "max_window_layers": N_LAYER, "model_type": "qwen3",
        "num_attention_heads": N_HEAD, "num_hidden_layers": N_LAYER, "num_key_value_heads": N_HEAD_KV, "rms_norm_eps": 1e-6,
        "rope_scaling": None, "rope_theta": 10000.0, "sliding_window": None, "tie_word_embeddings": True,
        "torch_dtype": "float16", "use_cache": True, "use_sliding_window": False, "vocab_size": int(source.tensors[0].shape[1]),
    }  # fmt: skip
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    prefix = "" if sentence_transformers else "model."
    plans = []
    for t in source.tensors:
        shape = tuple(int(d) for d in reversed(t.shape))
        plans.append(TensorPlan(hf_name(t.name, prefix), shape, np.dtype(t.data.dtype), lambda t=t, shape=shape: np.asarray(t.data).reshape(shape)))
    write_safetensors(folder / "model.safetensors", plans)
    if sentence_transformers:  # Qwen3-Embedding's modules.json and 1_Pooling/config.json
        (folder / "modules.json").write_text(json.dumps([
            {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
            {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"},
            {"idx": 2, "name": "2", "path": "2_Normalize", "type": "sentence_transformers.models.Normalize"},
        ]))  # fmt: skip
        (folder / "1_Pooling").mkdir()
        modes = {f"pooling_mode_{m}": m == "lasttoken" for m in ("cls_token", "mean_tokens", "max_tokens", "mean_sqrt_len_tokens", "weightedmean_tokens", "lasttoken")}
        (folder / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": N_EMBD, **modes, "include_prompt": True}))
    return folder


def logits(path: Path) -> tuple[list[int], np.ndarray]:
    """TEXT's first 64 tokens as the file tokenizes them, and llama.cpp's logits at each."""
    backend = LlamaCppBackend.load(path, LoadParams(n_ctx=256, n_threads=THREADS))
    try:
        tokens = backend.tokenize(TEXT, add_special=False)[:64]
        return tokens, backend.forward(Batch.for_sequence(tokens, 0, all_logits=True)).copy()
    finally:
        backend.close()


@pytest.fixture(scope="module")
def qwen3_f16(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """test_architectures' tiny qwen3 over the embedded model's vocabulary, widened to F16
    (matrices F16, vectors F32: the layout the converter writes, so the round trip is exact)."""
    folder = tmp_path_factory.mktemp("qwen3")
    f32 = tiny_model(folder / "tiny-qwen3-F32.gguf", "qwen3", vocabulary_of(model_path), N_HEAD, N_HEAD_KV, np.random.default_rng(3))
    return widen_to_f16(f32, folder / "tiny-qwen3-F16.gguf")


@pytest.mark.parametrize("sentence_transformers", [False, True], ids=["causal-lm", "sentence-transformers"])
def test_qwen3_folder_converts_to_llama_cpps_qwen3(sentence_transformers: bool, qwen3_f16: Path, hf_folder: Path, tmp_path: Path) -> None:
    source = gguf.GGUFReader(qwen3_f16)
    folder = write_qwen3_folder(source, hf_folder, tmp_path / "Qwen3-tiny", sentence_transformers)
    out = tmp_path / "converted.gguf"
    result = run_cli("quantize", str(folder), "F16", "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    back = gguf.GGUFReader(out)
    meta = lambda reader, key: None if reader.get_field(key) is None else reader.get_field(key).contents()  # noqa: E731
    assert meta(back, "general.architecture") == "qwen3"
    for key in HPARAMS:
        assert meta(back, f"qwen3.{key}") == meta(source, f"qwen3.{key}"), key
    assert meta(back, "qwen3.pooling_type") == (int(gguf.PoolingType.LAST) if sentence_transformers else None)
    converted = {t.name: t for t in back.tensors}  # in llama.cpp's quantizer's order
    assert sorted(converted) == sorted(t.name for t in source.tensors)  # attn_q_norm and attn_k_norm among them
    for a in source.tensors:
        b = converted[a.name]
        assert a.tensor_type == b.tensor_type and np.array_equal(np.asarray(a.data), np.asarray(b.data)), a.name  # HF's q/k rows kept
    if sentence_transformers:  # an embedding model now: its vectors, last-token pooled as the file says
        want, got = llamacpp_embeddings(qwen3_f16, TEXTS, pooling="last"), llamacpp_embeddings(out, TEXTS)
    else:
        tokens, want = logits(qwen3_f16)
        back_tokens, got = logits(out)
        assert back_tokens == tokens  # the same vocabulary, merges and pre-tokenizer
    assert np.array_equal(got, want)  # the same bytes through the same graph: the same bits
