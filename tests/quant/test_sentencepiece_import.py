"""A Mistral-style Hugging Face folder with a SentencePiece tokenizer (tokenizer.model):
imported to GGUF, llama.cpp must tokenize exactly as the sentencepiece library does.

The tokenizer is trained here, by sentencepiece itself, on the shipped public-domain
text; the weights are tiny and random (what is under test is the folder's conversion)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer_quant.hf import import_hf, write_safetensors
from localinfer_quant.source import TensorPlan

from ..conftest import THREADS, run_cli

TEXT = Path(__file__).resolve().parents[1] / "data" / "alice_in_wonderland.txt"
N_VOCAB, N_EMBD, N_FF, N_LAYER, N_HEAD, N_HEAD_KV = 512, 64, 128, 2, 4, 2
SAMPLES = ["Alice was beginning to get very tired.", "'Curiouser and curiouser!' cried Alice", "naïve café 🐇 123"]


@pytest.fixture(scope="module")
def mistral_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hf") / "tiny-mistral"
    folder.mkdir()
    corpus = folder.parent / "corpus.txt"
    corpus.write_text(TEXT.read_text(encoding="utf-8")[:60000], encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(corpus), model_prefix=str(folder / "tokenizer"), vocab_size=N_VOCAB, model_type="bpe",
        byte_fallback=True, character_coverage=1.0, unk_id=0, bos_id=1, eos_id=2, pad_id=-1, minloglevel=2,
    )  # fmt: skip
    (folder / "tokenizer.vocab").unlink()
    (folder / "config.json").write_text(json.dumps({
        "architectures": ["MistralForCausalLM"], "model_type": "mistral", "hidden_size": N_EMBD, "intermediate_size": N_FF,
        "num_hidden_layers": N_LAYER, "num_attention_heads": N_HEAD, "num_key_value_heads": N_HEAD_KV, "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0, "max_position_embeddings": 512, "vocab_size": N_VOCAB, "tie_word_embeddings": False,
        "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "float16",
    }))  # fmt: skip
    (folder / "tokenizer_config.json").write_text(json.dumps({"add_bos_token": True, "add_eos_token": False, "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}))
    rng = np.random.default_rng(0)
    head_dim = N_EMBD // N_HEAD
    shapes = {"model.embed_tokens.weight": (N_VOCAB, N_EMBD), "model.norm.weight": (N_EMBD,), "lm_head.weight": (N_VOCAB, N_EMBD)}
    for i in range(N_LAYER):
        p = f"model.layers.{i}."
        shapes |= {
            p + "input_layernorm.weight": (N_EMBD,), p + "post_attention_layernorm.weight": (N_EMBD,),
            p + "self_attn.q_proj.weight": (N_HEAD * head_dim, N_EMBD), p + "self_attn.k_proj.weight": (N_HEAD_KV * head_dim, N_EMBD),
            p + "self_attn.v_proj.weight": (N_HEAD_KV * head_dim, N_EMBD), p + "self_attn.o_proj.weight": (N_EMBD, N_HEAD * head_dim),
            p + "mlp.gate_proj.weight": (N_FF, N_EMBD), p + "mlp.up_proj.weight": (N_FF, N_EMBD), p + "mlp.down_proj.weight": (N_EMBD, N_FF),
        }  # fmt: skip
    values = {name: (1.0 + 0.1 * rng.standard_normal(shape)) if len(shape) == 1 else rng.standard_normal(shape) / np.sqrt(shape[1]) for name, shape in shapes.items()}
    plans = [TensorPlan(name, shape, np.dtype(np.float16), lambda v=values[name]: v.astype(np.float16)) for name, shape in shapes.items()]
    write_safetensors(folder / "model.safetensors", plans)
    return folder


def test_llama_cpp_tokenizes_as_sentencepiece(mistral_folder: Path, tmp_path: Path) -> None:
    gguf_path = import_hf(mistral_folder, tmp_path / "tiny-mistral-F16.gguf")
    reference = spm.SentencePieceProcessor(model_file=str(mistral_folder / "tokenizer.model"))
    backend = LlamaCppBackend.load(gguf_path, LoadParams(n_ctx=128, n_threads=THREADS))
    try:
        assert backend.vocab.bos_id == 1 and backend.vocab.eos_id == 2 and backend.vocab.add_bos
        for text in SAMPLES:
            assert backend.tokenize(text, add_special=False) == reference.encode(text), text
            assert backend.tokenize(text, add_special=True) == [1, *reference.encode(text)]
        logits = backend.forward(Batch.for_sequence(backend.tokenize(SAMPLES[0]), 0))
        assert logits.shape == (1, N_VOCAB) and np.isfinite(logits).all()
    finally:
        backend.close()


def test_quantize_the_folder(mistral_folder: Path, tmp_path: Path) -> None:
    out = tmp_path / "tiny-mistral-Q8_0.gguf"
    result = run_cli("quantize", str(mistral_folder), "Q8_0", "-o", str(out), "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["output_tensor_types"]["Q8_0"] > 0
