"""The architecture variants the embedded model does not exercise, checked against
llama.cpp on tiny random-weight models written here with gguf-py's GGUFWriter:

  qwen2   NeoX RoPE, q/k/v biases, an untied output matrix, 4 query heads over 2 kv heads
  llama   linear RoPE scaling (factor 2) and 3 kv heads for 6 query heads

Weights are F32, so neither engine quantizes an activation and the logits must agree
closely; the vocabulary is the embedded model's, so llama.cpp can load the files.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader, GGUFWriter

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native import NativeBackend

from ..conftest import THREADS

N_EMBD, N_FF, N_LAYER = 64, 128, 2


@pytest.fixture(scope="module")
def vocabulary(model_path: Path) -> dict[str, object]:
    fields = GGUFReader(model_path).fields
    return {key: fields[key].contents() for key in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges")}


def tiny_model(path: Path, arch: str, vocab: dict[str, object], n_head: int, n_head_kv: int, rng: np.random.Generator) -> Path:
    tokens = vocab["tokenizer.ggml.tokens"]
    head_dim = N_EMBD // n_head
    w = GGUFWriter(str(path), arch)
    w.add_block_count(N_LAYER)
    w.add_context_length(512)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(N_FF)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head_kv)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-6)
    if arch == "llama":
        w.add_rope_dimension_count(head_dim)
        w.add_rope_scaling_type(__import__("gguf").RopeScalingType.LINEAR)
        w.add_rope_scaling_factor(2.0)
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types(vocab["tokenizer.ggml.token_type"])
    w.add_token_merges(vocab["tokenizer.ggml.merges"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)

    def weight(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) / np.sqrt(cols)).astype(np.float32)

    def norm() -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(N_EMBD)).astype(np.float32)

    w.add_tensor("token_embd.weight", weight(len(tokens), N_EMBD) * 4)
    w.add_tensor("output_norm.weight", norm())
    if arch == "qwen2":
        w.add_tensor("output.weight", weight(len(tokens), N_EMBD))
    for i in range(N_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", norm())
        w.add_tensor(p + "attn_q.weight", weight(n_head * head_dim, N_EMBD))
        w.add_tensor(p + "attn_k.weight", weight(n_head_kv * head_dim, N_EMBD))
        w.add_tensor(p + "attn_v.weight", weight(n_head_kv * head_dim, N_EMBD))
        if arch == "qwen2":
            w.add_tensor(p + "attn_q.bias", (0.5 * rng.standard_normal(n_head * head_dim)).astype(np.float32))
            w.add_tensor(p + "attn_k.bias", (0.5 * rng.standard_normal(n_head_kv * head_dim)).astype(np.float32))
            w.add_tensor(p + "attn_v.bias", (0.5 * rng.standard_normal(n_head_kv * head_dim)).astype(np.float32))
        w.add_tensor(p + "attn_output.weight", weight(N_EMBD, n_head * head_dim))
        w.add_tensor(p + "ffn_norm.weight", norm())
        w.add_tensor(p + "ffn_gate.weight", weight(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_up.weight", weight(N_FF, N_EMBD))
        w.add_tensor(p + "ffn_down.weight", weight(N_EMBD, N_FF))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.mark.parametrize("arch, n_head, n_head_kv", [("qwen2", 4, 2), ("llama", 6, 3)])
@pytest.mark.parametrize("kernels", ["c", "numba"])
def test_tiny_model_matches_llama_cpp(arch: str, n_head: int, n_head_kv: int, kernels: str, vocabulary, tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    path = tiny_model(tmp_path / f"tiny-{arch}.gguf", arch, vocabulary, n_head, n_head_kv, rng)
    tokens = rng.integers(100, 40000, size=200).tolist()  # deep enough for RoPE to matter
    batch = Batch.for_sequence(tokens, 0, all_logits=True)
    reference = LlamaCppBackend.load(path, LoadParams(n_ctx=256, n_threads=THREADS))
    theirs = reference.forward(batch)
    reference.close()
    native = NativeBackend.load(path, LoadParams(n_ctx=256, n_threads=THREADS, kernels=kernels))
    assert native.config.rope_layout == ("neox" if arch == "qwen2" else "normal")
    ours = native.forward(batch)
    native.close()
    diff = np.abs(ours - theirs)
    assert np.mean(ours.argmax(axis=1) == theirs.argmax(axis=1)) >= 0.99
    assert diff.mean() < 0.01 * np.abs(theirs).mean() and diff.max() < 0.05 * np.abs(theirs).max(), (diff.mean(), diff.max())
