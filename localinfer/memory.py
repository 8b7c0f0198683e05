"""Will the model fit? Weights + KV cache + compute buffers, against free RAM and VRAM.

The estimate is the same arithmetic the seeds give for the KV cache:
2 (K and V) x layers x context x kv_heads x head_dim x bytes per element.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import psutil

from localinfer.backends.devices import Device
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
    vram_free: int  # free memory on the devices the layers go to
    warnings: list[str] = field(default_factory=list)

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


def plan(info: GGUFInfo, n_ctx: int, gpu_layers: int | str, devices: Sequence[Device] = (), ram_free: int | None = None) -> MemoryPlan:
    """Choose GPU layers (for "auto") and check that the rest fits in RAM; raises OutOfMemory.

    `devices` are the ones this llama.cpp build can offload to (none on a CPU-only build).
    Layers go to the discrete GPUs if there are any, else to an integrated GPU; an
    integrated GPU's memory is the system's RAM, so its layers still count against RAM.
    llama.cpp counts the output layer as one more, so "all layers" is n_layer + 1.
    """
    weights, kv, compute = info.tensor_bytes, kv_cache_bytes(info, n_ctx), compute_bytes(info, n_ctx)
    ram_free = psutil.virtual_memory().available if ram_free is None else ram_free
    n_layer = max(1, info.n_layer)
    discrete = [d for d in devices if d.kind == "GPU"]
    targets = discrete or [d for d in devices if d.kind == "iGPU"]
    shared = bool(targets) and not discrete
    vram_free = sum(d.free_bytes for d in targets)
    warnings = []
    if not targets:
        if gpu_layers not in ("auto", 0):
            warnings.append("this llama.cpp build cannot offload to a GPU, so --gpu-layers is ignored and every layer runs on the CPU")
        n_gpu = 0
    elif gpu_layers == "auto":
        per_layer = (weights + kv) / n_layer
        n_gpu = max(0, min(n_layer + 1, int((vram_free - compute) // per_layer)))
    else:
        n_gpu = int(gpu_layers)
    on_gpu_fraction = 0.0 if shared else min(n_gpu, n_layer) / n_layer
    needed_ram = (weights + kv) * (1 - on_gpu_fraction) + (compute if n_gpu == 0 or shared else 0)
    result = MemoryPlan(weights, kv, compute, n_gpu, ram_free, vram_free, warnings)
    if needed_ram > ram_free:
        raise OutOfMemory(
            f"the model needs {needed_ram / GiB:.2f} GiB of RAM ({result.describe()}) "
            f"but only {ram_free / GiB:.2f} GiB is free; try a smaller --ctx or a smaller quantization"
        )
    return result
