"""The native engine's logits deep in a context against a float64 forward pass written here
from the GGUF's own tensors (gguf-py reads and dequantizes them), as llama.cpp's graph builders
compute qwen2 and qwen3: RMSNorm, q/k/v (qwen2: biases; qwen3: per-head RMSNorm of q and k),
NeoX RoPE, causal grouped-query attention, SwiGLU, an untied output.

Why not llama.cpp here: its CPU flash attention keeps the running weighted sum of V in f16
(ggml-cpu's VKQ16 accumulator), so on qwen2's tiny model, whose V biases give every value row
a large common part, its logits drift from float64 with the position (0.27 at 1,100 positions,
1.44 at 4,000, 2.5 at 6,000 on logits of 21), while ours stay within 0.004. A test against
llama.cpp cannot tell a drift of ours from that one; float64 can.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader
from gguf.quants import dequantize

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.native import NativeBackend

from ..conftest import THREADS
from .test_architectures import tiny_model, vocabulary  # noqa: F401 - vocabulary: the fixture

N_PROMPT = 3000  # llama.cpp's drift is 0.27 by 1,100 positions: a bound of 0.02 would see it ten times over
# The f16 cache rounds each key and value (and the kernel each query) to 11 bits: 0.001-0.004 on
# these logits (max |logit| about 20), and float64 with only K and V rounded to f16 differs from
# float64 by as much (0.004 at 200 positions, less deeper), so that rounding is the whole
# difference. 0.02 leaves 5x that for the order of sums, and is 10x under an f16 accumulator's drift.
TOLERANCE = 0.02


def gguf_tensors(path: Path) -> tuple[dict[str, np.ndarray], dict[str, object]]:
    """Every tensor as float64 in numpy's order, and the metadata (tokenizer left out): the
    reference reads the file the engine reads, not the arrays the test wrote."""
    reader = GGUFReader(str(path))
    tensors = {t.name: dequantize(t.data, t.tensor_type).astype(np.float64).reshape([int(d) for d in reversed(t.shape)]) for t in reader.tensors}
    meta = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("tokenizer.")}
    return tensors, meta


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    """RMSNorm over the last axis, times its weight (llama.cpp's ggml_rms_norm then ggml_mul)."""
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * weight


def rope_neox(x: np.ndarray, base: float) -> np.ndarray:
    """NeoX RoPE of x [n, heads, hd] at positions 0..n-1: dimension i turns with i + hd/2."""
    n, hd = x.shape[0], x.shape[-1]
    angle = np.arange(n, dtype=np.float64)[:, None] * base ** (-2.0 * np.arange(hd // 2) / hd)  # [n, hd/2]
    cos, sin = np.cos(angle)[:, None], np.sin(angle)[:, None]
    x0, x1 = x[..., : hd // 2], x[..., hd // 2 :]
    return np.concatenate([x0 * cos - x1 * sin, x0 * sin + x1 * cos], -1)


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, rows: np.ndarray, chunk: int = 512) -> np.ndarray:
    """Causal grouped-query attention of the query rows `rows` (q [n, heads, hd], k and v
    [n, kv_heads, hd]), in chunks of rows so the scores stay a few MB: [len(rows), heads * hd]."""
    n_head, hd = q.shape[1:]
    group = n_head // k.shape[1]
    out = np.empty((len(rows), n_head, hd))
    for start in range(0, len(rows), chunk):
        r = rows[start : start + chunk]
        seen = np.arange(r.max() + 1)[None, :] <= r[:, None]  # [m, last + 1]
        for h in range(n_head):
            s = np.where(seen, q[r, h] @ k[: r.max() + 1, h // group].T / np.sqrt(hd), -np.inf)
            w = np.exp(s - s.max(axis=1, keepdims=True))
            out[start : start + len(r), h] = (w / w.sum(axis=1, keepdims=True)) @ v[: r.max() + 1, h // group]
    return out.reshape(len(rows), n_head * hd)


def qkv(t: dict[str, np.ndarray], p: str, h: np.ndarray, n_head: int, n_kv: int, eps: float) -> tuple[np.ndarray, ...]:
    """A layer's q, k, v [n, heads, hd] before RoPE: the projections, their biases where the
    file has them (qwen2), and the per-head norms of q and k where it has those (qwen3)."""
    out = []
    for name, heads in (("q", n_head), ("k", n_kv), ("v", n_kv)):
        x = h @ t[f"{p}attn_{name}.weight"].T + t.get(f"{p}attn_{name}.bias", 0.0)
        x = x.reshape(len(h), heads, -1)
        if f"{p}attn_{name}_norm.weight" in t:
            x = rms_norm(x, t[f"{p}attn_{name}_norm.weight"], eps)
        out.append(x)
    return tuple(out)


def reference_logits(path: Path, tokens: list[int], rows: np.ndarray) -> np.ndarray:
    """The model's logits [len(rows), vocab] after `tokens`, in float64; the last layer
    computes only `rows` (the earlier ones need every position's keys and values)."""
    t, meta = gguf_tensors(path)
    arch = meta["general.architecture"]
    n_layer, n_head, n_kv = (int(meta[f"{arch}.{key}"]) for key in ("block_count", "attention.head_count", "attention.head_count_kv"))
    eps, base = float(meta[f"{arch}.attention.layer_norm_rms_epsilon"]), float(meta[f"{arch}.rope.freq_base"])
    x = t["token_embd.weight"][tokens]  # [n, n_embd]
    for layer in range(n_layer):
        p = f"blk.{layer}."
        q, k, v = qkv(t, p, rms_norm(x, t[p + "attn_norm.weight"], eps), n_head, n_kv, eps)
        keep = rows if layer == n_layer - 1 else np.arange(len(tokens))
        x = x[keep] + attention(rope_neox(q, base), rope_neox(k, base), v, keep) @ t[p + "attn_output.weight"].T
        h = rms_norm(x, t[p + "ffn_norm.weight"], eps)
        gate, up = h @ t[p + "ffn_gate.weight"].T, h @ t[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ t[p + "ffn_down.weight"].T
    return rms_norm(x, t["output_norm.weight"], eps) @ t["output.weight"].T


@pytest.mark.parametrize("arch", ["qwen2", "qwen3"])
@pytest.mark.parametrize("kernels", ["c", "numba"])
def test_logits_deep_in_a_context_match_float64(arch: str, kernels: str, vocabulary, tmp_path: Path, record_property) -> None:
    """After a 3,000-token prefill, four rows batched on the cache and one decoded alone (the
    tiled and the decode attention) are within the f16 cache's rounding of float64 logits, on
    either kernel set. qwen2's V biases are what made llama.cpp's f16 accumulator drift; qwen3
    checks the q/k norms and heads wider than n_embd / n_head the same way."""
    path = tiny_model(tmp_path / f"tiny-{arch}.gguf", arch, vocabulary, 4, 2, np.random.default_rng(13), output_scale=4.0)
    prompt = np.random.default_rng(17).integers(100, 40000, size=N_PROMPT).tolist()
    native = NativeBackend.load(path, LoadParams(n_ctx=N_PROMPT + 64, n_threads=THREADS, cache_types=("f16", "f16"), kernels=kernels))
    try:
        native.forward(Batch.for_sequence(prompt[:-5], 0))
        batched = native.forward(Batch.for_sequence(prompt[-5:-1], N_PROMPT - 5, all_logits=True))
        decoded = native.forward(Batch.for_sequence(prompt[-1:], N_PROMPT - 1))
    finally:
        native.close()
    ours = np.concatenate([batched, decoded]).astype(np.float64)
    theirs = reference_logits(path, prompt, np.arange(N_PROMPT - 5, N_PROMPT))
    diff = np.abs(ours - theirs).max()
    record_property("agreement", f"{arch} {kernels}: max |diff| {diff:.4f} of max |logit| {np.abs(theirs).max():.1f} at {N_PROMPT} positions")
    assert np.abs(theirs).max() > 5  # peaked logits: the bound is a small part of them
    assert diff < TOLERANCE, diff
