"""Will the model fit? Weights + KV cache + compute buffers, against free RAM and VRAM.

The estimate is the same arithmetic the seeds give for the KV cache:
2 (K and V) x layers x context x kv_heads x head_dim x bytes per element.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import psutil

from localinfer.devices import Device
from localinfer.errors import OutOfMemory
from localinfer.kvtypes import AUTO_CACHE, position_bytes
from localinfer.modelfile import GGUFInfo

GiB = 1024**3
# Left free on each discrete GPU for what the plan does not itemise: the CUDA context,
# cuBLAS's workspace, ggml's memory pool. An H200 with 1.2 GiB free and no headroom ran
# out of memory in the first decode (docs/benchmarks.md); 1 GiB is what llama.cpp's own
# --fit leaves by default (common.h, fit_params_target).
GPU_HEADROOM = 1 * GiB


def size_text(n: float) -> str:
    """Bytes as a person reads them: MiB below a GiB, else GiB."""
    return f"{n / 2**20:.0f} MiB" if n < GiB else f"{n / GiB:.2f} GiB"


@dataclass
class MemoryPlan:
    weights: int
    kv_cache: int
    compute: int
    n_gpu_layers: int
    ram_free: int
    vram_free: int  # free memory on the devices the layers go to
    warnings: list[str] = field(default_factory=list)
    cache_types: tuple[str, str] = ("f16", "f16")  # K and V
    cache_note: str = ""  # why --cache-type auto chose what it chose
    placement: str = "every layer on the CPU"  # where the layers went, and why
    gpu_bytes: int = 0  # the layers put on the GPU, with the compute buffer there
    # a mixture of experts: the weights one token reads (0 for a dense model). `weights`
    # still counts every expert: the router may pick any of them, so all must be in memory
    active_weights: int = 0

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache + self.compute

    def describe(self) -> str:
        active = f" (all experts; {self.active_weights / GiB:.2f} GiB of them read per token)" if self.active_weights else ""
        return (
            f"weights {self.weights / GiB:.2f} GiB{active} + KV cache {self.kv_cache / GiB:.2f} GiB ({'/'.join(self.cache_types)})"
            f" + compute {self.compute / GiB:.2f} GiB = {self.total / GiB:.2f} GiB"
        )


def kv_cache_bytes(info: GGUFInfo, n_ctx: int, cache_types: tuple[str, str] = ("f16", "f16")) -> int:
    """Every layer's every position: what a cache that keeps them all takes."""
    return int(info.n_layer * n_ctx * position_bytes(info.n_head_kv, info.head_dim, cache_types))


KVBytes = Callable[[tuple[str, str]], int]  # a cache's bytes for its K/V types (the engine's Backend.kv_cache_bytes)


def plan_cache(info: GGUFInfo, n_ctx: int, gpu_layers: int | str, cache: tuple[str, str] | str, devices: Sequence[Device] = (), ram_free: int | None = None,
               kv_bytes: KVBytes | None = None) -> MemoryPlan:  # fmt: skip
    """plan() with the KV-cache types given, or for cache "auto" the first of f16, q8_0, q4_0
    that fits (saying why), before refusing. `kv_bytes`: what the chosen engine's cache takes
    (default: every position of every layer, n_ctx in all)."""
    kv_bytes = kv_bytes or (lambda types: kv_cache_bytes(info, n_ctx, types))
    if cache != "auto":
        return plan(info, n_ctx, gpu_layers, devices, ram_free, cache, kv_bytes)  # type: ignore[arg-type]
    refused: OutOfMemory | None = None
    for types in AUTO_CACHE:
        try:
            result = plan(info, n_ctx, gpu_layers, devices, ram_free, types, kv_bytes)
        except OutOfMemory as e:
            refused = e  # the last: the smallest cache tried
            continue
        if types != AUTO_CACHE[0]:
            f16 = kv_bytes(AUTO_CACHE[0])
            result.cache_note = f"KV cache {'/'.join(types)}: an f16 cache ({f16 / GiB:.2f} GiB) would not fit in {result.ram_free / GiB:.2f} GiB free"
        else:
            result.cache_note = "KV cache f16/f16: it fits"
        return result
    assert refused is not None
    raise OutOfMemory(f"{refused} (even with a q4_0 KV cache)")


def active_weights(info: GGUFInfo) -> int:
    """A mixture of experts' bytes read per token, for the plan to report; 0 for a dense model."""
    return info.active_tensor_bytes if info.n_expert else 0


def compute_bytes(info: GGUFInfo, n_ctx: int, n_ubatch: int = 512, logits: bool = True) -> int:
    """Rough size of llama.cpp's compute buffer: the logits of one micro-batch (on the
    device that holds the output layer), its attention scores, and a few activations of
    width n_embd."""
    return 4 * n_ubatch * ((info.n_vocab if logits else 0) + n_ctx * info.n_head // 4 + 8 * info.n_embd)


def plan(info: GGUFInfo, n_ctx: int, gpu_layers: int | str, devices: Sequence[Device] = (), ram_free: int | None = None,
         cache_types: tuple[str, str] = ("f16", "f16"), kv_bytes: KVBytes | None = None) -> MemoryPlan:  # fmt: skip
    """Choose GPU layers (for "auto") and check that the rest fits in RAM; raises OutOfMemory.

    `devices` are the ones the chosen engine can offload to (none on a CPU-only build).
    Layers go to the discrete GPUs if there are any (their free memory added up: llama.cpp
    splits layers across them), else to a GPU that shares the system's RAM (an integrated
    GPU, Apple silicon), whose layers still count against RAM.
    llama.cpp counts the output layer as one more, so "all layers" is n_layer + 1.
    """
    kv = kv_bytes(cache_types) if kv_bytes else kv_cache_bytes(info, n_ctx, cache_types)
    weights, compute = info.tensor_bytes, compute_bytes(info, n_ctx)
    ram_free = psutil.virtual_memory().available if ram_free is None else ram_free
    n_layer = max(1, info.n_layer)
    discrete = [d for d in devices if d.kind == "GPU" and not d.unified]
    targets = discrete or [d for d in devices if d.unified]
    shared = bool(targets) and not discrete
    vram_free = sum(d.free_bytes for d in targets)
    usable = max(0, vram_free - GPU_HEADROOM * len(discrete))
    warnings = []
    per_layer = (weights + kv) / n_layer
    if not targets:
        if gpu_layers not in ("auto", 0):
            warnings.append("this engine has no GPU to offload to, so --gpu-layers is ignored and every layer runs on the CPU")
        n_gpu = 0
    elif gpu_layers == "auto":
        n_gpu = max(0, min(n_layer + 1, int((usable - compute) // per_layer)))
    else:
        n_gpu = n_layer + 1 if gpu_layers == "all" else int(gpu_layers)
    on_gpu = int(min(n_gpu, n_layer) * per_layer + compute) if n_gpu else 0
    if gpu_layers not in ("auto", 0) and targets and on_gpu > usable:
        warnings.append(f"{min(n_gpu, n_layer)} layers take {on_gpu / GiB:.2f} GiB but the GPU has {vram_free / GiB:.2f} GiB free"
                        f"{f' ({GPU_HEADROOM * len(discrete) / GiB:.0f} GiB of it kept for the GPU runtime)' if discrete else ''}; "
                        "loading may fail (--gpu-layers auto takes what fits)")  # fmt: skip
    on_gpu_fraction = 0.0 if shared else min(n_gpu, n_layer) / n_layer
    needed_ram = (weights + kv) * (1 - on_gpu_fraction) + (compute if n_gpu == 0 or shared else 0)
    where = placement(n_gpu, n_layer, gpu_layers, targets, vram_free, per_layer, compute, GPU_HEADROOM * len(discrete))
    result = MemoryPlan(weights, kv, compute, n_gpu, ram_free, vram_free, warnings, cache_types, placement=where, gpu_bytes=on_gpu,
                        active_weights=active_weights(info))  # fmt: skip
    if needed_ram > ram_free:
        raise OutOfMemory(
            f"the model needs {needed_ram / GiB:.2f} GiB of RAM ({result.describe()}) "
            f"but only {ram_free / GiB:.2f} GiB is free; try a smaller --ctx or a smaller quantization"
        )
    return result


def placement(n_gpu: int, n_layer: int, asked: int | str, targets: Sequence[Device], vram_free: int, per_layer: float, compute: int, kept: int) -> str:
    """Where the layers go and why, in words (`run --verbose`)."""
    if not targets:
        return "every layer on the CPU"
    names = ", ".join(f"{d.name} ({d.description})" for d in targets)
    n = min(n_gpu, n_layer + 1)
    where = f"{n} of {n_layer + 1} layers (the output layer counted) on {names}" if n else f"every layer on the CPU, none on {names}"
    if asked != "auto":
        return f"{where}: --gpu-layers {asked}"
    kept_note = f" less {kept / GiB:.0f} GiB kept for the GPU runtime" if kept else ""
    free = f"{vram_free / GiB:.2f} GiB free{kept_note}, {per_layer / GiB:.3f} GiB a layer with its KV cache, {compute / GiB:.2f} GiB for compute"
    return f"{where}: {'all fit' if n == n_layer + 1 else 'what fits'} in {free}"


@dataclass(frozen=True)
class WorkerShare:
    """What one RPC worker holds: `layers` consecutive repeating layers (from `first`), the
    output layer too where `output`, and what they take there with a compute buffer."""

    endpoint: str
    offer: int
    first: int
    layers: int
    output: bool
    bytes: int


def layer_weights(info: GGUFInfo) -> tuple[list[int], int, int]:
    """(bytes of each repeating layer's tensors, the output layer's, the input embedding's).
    A model whose output shares the embedding (tied) gets a copy of it where the output goes."""
    layers = [0] * max(1, info.n_layer)
    named = {t.name: t.nbytes for t in info.tensors}
    for t in info.tensors:
        if t.name.startswith("blk."):
            index = int(t.name.split(".")[1])
            if index < len(layers):
                layers[index] += t.nbytes
    embedding = named.get("token_embd.weight", 0)
    output = named.get("output.weight", embedding) + named.get("output_norm.weight", 0)
    return layers, output, embedding


def plan_workers(info: GGUFInfo, n_ctx: int, workers: Sequence[tuple[str, int]], cache_types: tuple[str, str], kv_bytes: KVBytes,
                 ram_free: int | None = None) -> tuple[MemoryPlan, list[WorkerShare]]:  # fmt: skip
    """Split the layers between this machine and RPC workers, each (endpoint, bytes offered).

    llama.cpp gives the last layers to the devices in the order listed and the output layer
    to the last, so the workers are filled from the last one back, each with as many of the
    last layers still unplaced as its offer holds (the layer, its KV cache, its share of a
    compute buffer); this machine keeps the rest and the input embedding. A worker offered
    too little for its part holds nothing and is left out. Raises OutOfMemory, with every
    machine's numbers, if what is left does not fit here.
    """
    layers, output, embedding = layer_weights(info)
    kv = kv_bytes(cache_types)
    kv_layer = kv / len(layers)
    shares: list[WorkerShare] = []
    top = len(layers)  # layers [top, n) are placed
    for endpoint, offer in reversed(workers):
        takes_output = not any(s.output for s in shares)
        used = compute_bytes(info, n_ctx, logits=takes_output) + (output if takes_output else 0)
        n = 0
        while n < top and used + layers[top - n - 1] + kv_layer <= offer:
            used += layers[top - n - 1] + kv_layer
            n += 1
        if used > offer or (n == 0 and not takes_output):
            shares.append(WorkerShare(endpoint, offer, top, 0, False, 0))
            continue
        top -= n
        shares.append(WorkerShare(endpoint, offer, top, n, takes_output, int(used)))
    shares.reverse()
    held = [s for s in shares if s.layers or s.output]
    local_output = not held
    compute = compute_bytes(info, n_ctx, logits=local_output)
    needed = int(sum(layers[:top]) + kv_layer * top + embedding + (output if local_output else 0) + compute)
    ram_free = psutil.virtual_memory().available if ram_free is None else ram_free
    n_remote = sum(s.layers for s in held) + (1 if held else 0)
    plan = MemoryPlan(info.tensor_bytes, kv, compute, n_remote, ram_free, sum(s.offer for s in held), cache_types=cache_types,
                      placement=describe_split(top, shares), gpu_bytes=sum(s.bytes for s in held), active_weights=active_weights(info))  # fmt: skip
    for s in shares:
        if not (s.layers or s.output):
            plan.warnings.append(f"the worker at {s.endpoint} offers {size_text(s.offer)}, too little for a layer of this model with its KV cache and compute buffer; it holds none")
    if needed > ram_free:
        there = "; ".join(f"{s.endpoint} holds {s.layers} layers ({size_text(s.bytes)} of the {size_text(s.offer)} it offers)" for s in shares)
        raise OutOfMemory(
            f"the model does not fit: {there}; this machine would hold {top} layers and needs {size_text(needed)} "
            f"but has {size_text(ram_free)} free; offer more with a worker's --mem, add a worker, or use a smaller --ctx or quantization"
        )
    return plan, held


def describe_split(top: int, shares: Sequence[WorkerShare]) -> str:
    """Which layers go where, in words (`run --verbose`)."""
    def span(first: int, n: int) -> str:
        return f"layer {first}" if n == 1 else f"layers {first}-{first + n - 1}"

    parts = [f"{span(0, top) if top else 'no layer'} and the input on this machine"]
    for s in shares:
        if s.layers or s.output:
            what = " and ".join(x for x in (span(s.first, s.layers) if s.layers else "", "the output" if s.output else "") if x)
            parts.append(f"{what} on {s.endpoint} ({size_text(s.bytes)} of {size_text(s.offer)} offered)")
    return f"{'; '.join(parts)}: each worker holds the last layers its offer fits, this machine the rest"
