"""Will the model fit? Weights + KV cache + compute buffers, against free RAM and VRAM.

The estimate is the same arithmetic the seeds give for the KV cache:
2 (K and V) x layers x context x kv_heads x head_dim x bytes per element.
"""

from __future__ import annotations

from dataclasses import dataclass

import psutil

from localinfer.errors import OutOfMemory
from localinfer.modelfile import GGUFInfo

GiB = 1024**3
KV_BYTES_PER_ELEMENT = 2  # f16 cache, llama.cpp's default


@dataclass
class MemoryPlan:
    weights: int
    kv_cache: int
    compute: int
    n_gpu_layers: int
    ram_free: int
    vram_free: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute

    def describe(self) -> str:
        return (
            f"weights {self.weights / GiB:.2f} GiB + KV cache {self.kv_cache / GiB:.2f} GiB"
            f" + compute {self.compute / GiB:.2f} GiB = {self.total / GiB:.2f} GiB"
        )


def kv_cache_bytes(info: GGUFInfo, n_ctx: int) -> int:
    return 2 * info.n_layer * n_ctx * info.n_head_kv * info.head_dim * KV_BYTES_PER_ELEMENT


def compute_bytes(info: GGUFInfo, n_ctx: int, n_ubatch: int = 512) -> int:
    """Rough size of llama.cpp's compute buffer: the logits of one micro-batch,
    its attention scores, and a few activations of width n_embd."""
    return 4 * n_ubatch * (info.n_vocab + n_ctx * info.n_head // 4 + 8 * info.n_embd)


def plan(info: GGUFInfo, n_ctx: int, gpu_layers: int | str, vram_free: int = 0) -> MemoryPlan:
    """Choose GPU layers (for "auto") and check that the rest fits in RAM; raises OutOfMemory."""
    weights, kv, compute = info.tensor_bytes, kv_cache_bytes(info, n_ctx), compute_bytes(info, n_ctx)
    ram_free = psutil.virtual_memory().available
    n_layer = max(1, info.n_layer)
    if gpu_layers == "auto":
        per_layer = (weights + kv) / n_layer
        room = vram_free - compute
        n_gpu = 0 if vram_free <= 0 else max(0, min(n_layer + 1, int(room // per_layer)))
    else:
        n_gpu = int(gpu_layers)
    on_gpu_fraction = min(n_gpu, n_layer) / n_layer
    needed_ram = (weights + kv) * (1 - on_gpu_fraction) + (compute if n_gpu == 0 else 0)
    result = MemoryPlan(weights, kv, compute, n_gpu, ram_free, vram_free)
    if needed_ram > ram_free:
        raise OutOfMemory(
            f"the model needs {needed_ram / GiB:.2f} GiB of RAM ({result.describe()}) "
            f"but only {ram_free / GiB:.2f} GiB is free; try a smaller --ctx or a smaller quantization"
        )
    return result
