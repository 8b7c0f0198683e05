"""The C set's fused decode step (native/c/decode.c) against the forward's own
one-operation-at-a-time path, on the same weights: the logits of every decode token, and of
a verify's rows (the same tokens in one batch, as a speculative verify sends them), must be
the same bit for bit, for the embedded llama model (f16 and quantized KV caches) and for
tiny models of the other architectures (test_architectures.py's): qwen2's biases, qwen3's
q/k norms, gemma3's post-norms, GeGLU, local layers' RoPE and window (decoding past it),
phi3's fused tensors and long-context RoPE, qwen3moe's experts, gpt-oss's sinks, biases,
YaRN and alternating windows."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localinfer.backends.native.config import ModelConfig
from localinfer.backends.native.forward import Transformer
from localinfer.backends.native.kvcache import KVCache
from localinfer.backends.native.weights import Weights
from localinfer.modelfile import inspect
from localinfer_native.c_kernels import CKernels
from localinfer_native.types import DecodePlan

from ..conftest import THREADS
from .test_architectures import tiny_model, vocabulary

__all__ = ["vocabulary"]  # the fixture tiny_model's vocabulary comes from


class PerOperation(CKernels):
    """The C set without its fused step, so the forward calls each operation itself."""

    def decode_step(self, plan: DecodePlan) -> None:
        return None


def open_model(path: Path, kernels: CKernels, cache_types: tuple[str, str]) -> tuple[Transformer, Weights]:
    info = inspect(path)
    config = ModelConfig.from_gguf(info)
    weights = Weights.open(path, info, config, kernels)
    return Transformer(config, weights, kernels, KVCache(config, 64, 1, cache_types, kernels.tiled_keys)), weights


def run(model: Transformer, tokens: list[int], start: int, all_logits: bool) -> np.ndarray:
    n = len(tokens)
    want = np.ones(n, bool) if all_logits else np.arange(n) == n - 1
    return model.forward(np.array(tokens), np.arange(start, start + n, dtype=np.int32), np.zeros(n, np.int32), want)


def greedy_logits(path: Path, kernels: CKernels, cache_types: tuple[str, str], prompt: list[int], steps: int) -> tuple[list[np.ndarray], np.ndarray, bool]:
    """The logits of `steps` greedy decode tokens after `prompt`; the logits of the same
    tokens sent again as one verify batch; and whether the fused step ran them."""
    model, weights = open_model(path, kernels, cache_types)
    try:
        logits = run(model, prompt, 0, False)
        out, fed = [], []
        for i in range(steps):
            fed.append(int(logits[0].argmax()))
            logits = run(model, fed[-1:], len(prompt) + i, True)
            out.append(logits.copy())
        return out, run(model, fed, len(prompt), True), model.decode_step is not None
    finally:
        weights.close()


def assert_same_decode(path: Path, cache_types: tuple[str, str], steps: int = 8) -> None:
    prompt = [1, 504, 3458, 282, 4649, 314, 253, 1789, 28, 1041]
    fused, fused_verify, ran_fused = greedy_logits(path, CKernels(THREADS), cache_types, prompt, steps)
    per_op, per_op_verify, ran_per_op = greedy_logits(path, PerOperation(THREADS), cache_types, prompt, steps)
    assert ran_fused and not ran_per_op
    for step, (a, b) in enumerate(zip(fused, per_op)):
        assert np.array_equal(a, b), f"decode token {step}: the fused step's logits differ by up to {np.abs(a - b).max()}"
    assert np.array_equal(fused_verify, per_op_verify), "a verify batch through the fused step differs from the operations'"
    assert np.array_equal(fused_verify, np.concatenate(fused)), "a verify batch differs from decoding its tokens one by one"


@pytest.mark.parametrize("cache_types", [("f16", "f16"), ("q8_0", "q4_0")])
def test_fused_decode_equals_the_operations_on_the_embedded_model(model_path: Path, cache_types: tuple[str, str]) -> None:
    assert_same_decode(model_path, cache_types)


@pytest.mark.parametrize("arch", ["qwen2", "qwen3", "gemma3", "phi3", "qwen3moe", "gpt-oss"])
def test_fused_decode_equals_the_operations_on_each_architecture(arch: str, vocabulary, tmp_path: Path) -> None:
    path = tiny_model(tmp_path / f"{arch}.gguf", arch, vocabulary, 4, 2, np.random.default_rng(3))
    assert_same_decode(path, ("f16", "f16"), steps=16)  # to position 26: past gemma3's window of 16
