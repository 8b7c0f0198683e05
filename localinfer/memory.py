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
from localinfer.experts import ExpertLayout
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
    n_cpu_moe: int = 0  # a mixture of experts: the experts of the first n_cpu_moe layers stay in RAM
    ram_bytes: int = 0  # what the plan puts in RAM: weights, KV cache and compute not on a GPU
    split: str = ""  # bytes per device, in words (`run --verbose`, `doctor MODEL`)

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
               kv_bytes: KVBytes | None = None, cpu_moe: int | str = "auto") -> MemoryPlan:  # fmt: skip
    """plan() with the KV-cache types given, or for cache "auto" the first of f16, q8_0, q4_0
    that fits (saying why), before refusing. `kv_bytes`: what the chosen engine's cache takes
    (default: every position of every layer, n_ctx in all); `cpu_moe` as plan() takes it."""
    kv_bytes = kv_bytes or (lambda types: kv_cache_bytes(info, n_ctx, types))
    if cache != "auto":
        return plan(info, n_ctx, gpu_layers, devices, ram_free, cache, kv_bytes, cpu_moe)  # type: ignore[arg-type]
    refused: OutOfMemory | None = None
    for types in AUTO_CACHE:
        try:
            result = plan(info, n_ctx, gpu_layers, devices, ram_free, types, kv_bytes, cpu_moe)
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
         cache_types: tuple[str, str] = ("f16", "f16"), kv_bytes: KVBytes | None = None, cpu_moe: int | str = "auto") -> MemoryPlan:  # fmt: skip
    """Choose GPU layers (for "auto") and check that the rest fits in RAM; raises OutOfMemory.

    `devices` are the ones the chosen engine can offload to (none on a CPU-only build).
    Layers go to the discrete GPUs if there are any (their free memory added up: llama.cpp
    splits layers across them), else to a GPU that shares the system's RAM (an integrated
    GPU, Apple silicon), whose layers still count against RAM.
    llama.cpp counts the output layer as one more, so "all layers" is n_layer + 1.
    A mixture of experts beside a GPU is placed with its experts apart (`place_experts`);
    `cpu_moe` is --n-cpu-moe's N, "all" (--cpu-moe), or "auto": planned with the layers.
    """
    kv = kv_bytes(cache_types) if kv_bytes else kv_cache_bytes(info, n_ctx, cache_types)
    compute = compute_bytes(info, n_ctx)
    ram_free = psutil.virtual_memory().available if ram_free is None else ram_free
    room = GpuRoom.of(devices)
    warnings: list[str] = []
    n_cpu_moe = experts_asked(info, cpu_moe, bool(room.targets), warnings)
    if room.targets and info.n_expert and info.tensors:
        where = place_experts(ExpertLayout(info, kv, compute), gpu_layers, n_cpu_moe, room, warnings)
    else:
        where = place_layers(info, kv, compute, gpu_layers, room, warnings, n_cpu_moe or 0)
    result = MemoryPlan(info.tensor_bytes, kv, compute, where.n_gpu, ram_free, room.vram_free, warnings, cache_types, placement=where.where,
                        gpu_bytes=where.gpu_bytes, active_weights=active_weights(info), n_cpu_moe=where.n_cpu_moe, ram_bytes=where.ram_bytes,
                        split=where.split)  # fmt: skip
    if where.ram_bytes > ram_free:
        raise OutOfMemory(
            f"the model needs {where.ram_bytes / GiB:.2f} GiB of RAM ({result.describe()}) "
            f"but only {ram_free / GiB:.2f} GiB is free; try a smaller --ctx or a smaller quantization"
        )
    return result


@dataclass(frozen=True)
class GpuRoom:
    """The GPUs a plan may put layers on: the discrete ones if any, else one that shares RAM."""

    targets: tuple[Device, ...]
    vram_free: int  # their free memory added up
    kept: int  # of it, left for the GPU runtime (GPU_HEADROOM a discrete card)
    shared: bool  # an integrated GPU or Apple silicon: what it holds still takes RAM

    @classmethod
    def of(cls, devices: Sequence[Device]) -> GpuRoom:
        discrete = [d for d in devices if d.kind == "GPU" and not d.unified]
        targets = discrete or [d for d in devices if d.unified]
        return cls(tuple(targets), sum(d.free_bytes for d in targets), GPU_HEADROOM * len(discrete), bool(targets) and not discrete)

    @property
    def usable(self) -> int:
        return max(0, self.vram_free - self.kept)

    @property
    def names(self) -> str:
        return ", ".join(f"{d.name} ({d.description})" for d in self.targets)

    def free_text(self) -> str:
        return f"{self.vram_free / GiB:.2f} GiB free" + (f" less {self.kept / GiB:.0f} GiB kept for the GPU runtime" if self.kept else "")

    def too_small(self, what: str, on_gpu: int, auto: str) -> str:
        """The warning for layers asked for that the arithmetic says will not fit."""
        kept = f" ({self.kept / GiB:.0f} GiB of it kept for the GPU runtime)" if self.kept else ""
        return f"{what} take {size_text(on_gpu)} but the GPU has {size_text(self.vram_free)} free{kept}; loading may fail ({auto} what fits)"

    def split(self, gpu_bytes: int, gpu_what: str, ram_bytes: int, cpu_what: str) -> str:
        """Bytes per device in words: 'CUDA0: 7.90 GiB (...) · CPU: 5.10 GiB (...)'."""
        if not self.targets or not gpu_bytes:
            return f"CPU: {size_text(ram_bytes)} ({cpu_what})"
        gpu = f"{'+'.join(d.name for d in self.targets)}: {size_text(gpu_bytes)} ({gpu_what})"
        if self.shared:  # its bytes are RAM's too
            return f"{gpu} · CPU: {size_text(max(0, ram_bytes - gpu_bytes))} ({cpu_what}); {size_text(ram_bytes)} of RAM in all"
        return f"{gpu} · CPU: {size_text(ram_bytes)} ({cpu_what})"


@dataclass(frozen=True)
class Placement:
    """Where a plan puts the model: llama.cpp's n_gpu_layers and n_cpu_moe, what the GPU and
    RAM hold, and the why and the split in words."""

    n_gpu: int
    n_cpu_moe: int
    gpu_bytes: int
    ram_bytes: int
    where: str
    split: str


def experts_asked(info: GGUFInfo, cpu_moe: int | str, has_gpu: bool, warnings: list[str]) -> int | None:
    """--cpu-moe / --n-cpu-moe as a layer count (None: "auto", for the plan to choose), with
    one warning where it changes nothing: a dense model, or no GPU to keep experts off."""
    if cpu_moe == "auto":
        return None
    flag = "--cpu-moe" if cpu_moe == "all" else "--n-cpu-moe"
    if not info.n_expert:
        warnings.append(f"{flag} keeps a mixture of experts' experts on the CPU, and this model has no experts: it changes nothing")
        return 0
    if not has_gpu:
        warnings.append(f"{flag} only matters beside a GPU, and this engine has none to offload to: every expert runs on the CPU anyway")
    return info.n_layer if cpu_moe == "all" else max(0, min(int(cpu_moe), info.n_layer))


def place_layers(info: GGUFInfo, kv: int, compute: int, gpu_layers: int | str, room: GpuRoom, warnings: list[str], n_cpu_moe: int = 0) -> Placement:
    """Whole layers, the last ones to the GPU, as many as fit at the average layer's bytes
    with its KV cache (a dense model, or any model without a GPU)."""
    weights, n_layer = info.tensor_bytes, max(1, info.n_layer)
    per_layer = (weights + kv) / n_layer
    if not room.targets:
        if gpu_layers not in ("auto", 0):
            warnings.append("this engine has no GPU to offload to, so --gpu-layers is ignored and every layer runs on the CPU")
        n_gpu = 0
    elif gpu_layers == "auto":
        n_gpu = max(0, min(n_layer + 1, int((room.usable - compute) // per_layer)))
    else:
        n_gpu = n_layer + 1 if gpu_layers == "all" else int(gpu_layers)
    on_gpu = int(min(n_gpu, n_layer) * per_layer + compute) if n_gpu else 0
    if gpu_layers not in ("auto", 0) and room.targets and on_gpu > room.usable:
        warnings.append(room.too_small(f"{min(n_gpu, n_layer)} layers", on_gpu, "--gpu-layers auto takes"))
    on_gpu_fraction = 0.0 if room.shared else min(n_gpu, n_layer) / n_layer
    needed_ram = int((weights + kv) * (1 - on_gpu_fraction) + (compute if n_gpu == 0 or room.shared else 0))
    where = placement(n_gpu, n_layer, gpu_layers, room, per_layer, compute)
    repeating = max(0, min(n_gpu, n_layer + 1) - 1)  # the output is the first layer offloaded
    gpu_what = f"{layers_text(repeating)} and the output" if repeating else "the output"
    if not n_gpu:
        cpu_what = "every layer"
        if info.n_expert:  # a mixture of experts: all of it resident, a share of it read
            cpu_what += f"; {size_text(active_weights(info))} of the weights read per token"
    else:
        cpu_what = f"{layers_text(n_layer - repeating)} and the input embedding" if repeating < n_layer else "the input embedding"
    return Placement(n_gpu, n_cpu_moe, on_gpu, needed_ram, where, room.split(on_gpu, gpu_what, needed_ram, cpu_what))


def layers_text(n: int) -> str:
    return f"{n} layer{'s' * (n != 1)}"


def place_experts(layout: ExpertLayout, gpu_layers: int | str, n_cpu_moe: int | None, room: GpuRoom, warnings: list[str]) -> Placement:
    """A mixture of experts beside a GPU: every layer's shared weights, then experts while
    they fit (ExpertLayout.fit), each of --gpu-layers and --n-cpu-moe as given where given."""
    n_layer = layout.n_layer
    asked_gpu = None if gpu_layers == "auto" else n_layer + 1 if gpu_layers == "all" else int(gpu_layers)
    n_gpu, n_cpu_moe_now = layout.fit(room.usable, asked_gpu, n_cpu_moe)
    on_gpu = layout.gpu_bytes(n_gpu, n_cpu_moe_now)
    n_shared, n_experts = len(layout.gpu_layers(n_gpu)), len(layout.experts_on_gpu(n_gpu, n_cpu_moe_now))
    if on_gpu > room.usable:
        warnings.append(room.too_small(f"{layers_text(n_shared)} (the experts of {n_experts} of them) with the output", on_gpu, "--gpu-layers auto and no --n-cpu-moe take"))
    ram = layout.resident + layout.compute if room.shared else layout.ram_bytes(n_gpu, n_cpu_moe_now)
    gpu_read, cpu_read = layout.reads(n_gpu, n_cpu_moe_now)
    gpu_what = f"attention and shared weights of {layers_text(n_shared)}, {f'experts of {n_experts}' if n_experts else 'no experts'}, the output; {size_text(gpu_read)} read per token"
    cpu_parts = [f"attention and shared weights of {layers_text(n_layer - n_shared)}"] if n_shared < n_layer else []
    cpu_parts += [f"experts of {layers_text(n_layer - n_experts)}"] if n_experts < n_layer else []
    cpu_what = ", ".join([*cpu_parts, "the input embedding"]) + f"; {size_text(cpu_read)} read per token"
    where = expert_placement(layout, n_gpu, n_cpu_moe_now, gpu_layers, n_cpu_moe, room)
    return Placement(n_gpu, n_cpu_moe_now if n_gpu else (n_cpu_moe or 0), on_gpu, ram, where, room.split(on_gpu, gpu_what, ram, cpu_what))


def expert_placement(layout: ExpertLayout, n_gpu: int, n_cpu_moe: int, gpu_layers: int | str, asked_moe: int | None, room: GpuRoom) -> str:
    """Where a mixture of experts' layers and experts go and why, in words (`run --verbose`)."""
    top = layout.n_layer + 1
    n = min(n_gpu, top)
    if not n:
        where = f"every layer on the CPU, none on {room.names}"
    else:
        kept = "every layer's" if n_cpu_moe >= layout.n_layer else "no layer's" if not n_cpu_moe else f"the first {layers_text(n_cpu_moe)}'" if n_cpu_moe > 1 else "the first layer's"
        where = f"{n} of {top} layers (the output layer counted) on {room.names}, {kept} experts kept on the CPU"
    asked = [f"--gpu-layers {gpu_layers}"] if gpu_layers != "auto" else []
    asked += [] if asked_moe is None else ["--cpu-moe" if asked_moe >= layout.n_layer else f"--n-cpu-moe {asked_moe}"]
    if len(asked) == 2:
        return f"{where}: {' '.join(asked)}"
    if asked_moe is not None:
        why = "the last layers that fit beside them"
    elif gpu_layers != "auto":
        why = "as few layers' experts kept on the CPU as fit beside them"
    elif not n:
        why = "not even the output layer with the compute buffer fits"
    else:
        shared = sum(layout.shared) + layout.kv_layer * layout.n_layer + layout.output + layout.compute
        why = (f"the attention and shared weights of every layer first ({size_text(shared)} with the KV cache, output and compute), "
               f"then the experts of the last layers while they fit ({size_text(sum(layout.experts) / layout.n_layer)} a layer)")  # fmt: skip
    return f"{where}: {(', '.join(asked) + '; ') if asked else ''}{why}, in {room.free_text()}"


def placement(n_gpu: int, n_layer: int, asked: int | str, room: GpuRoom, per_layer: float, compute: int) -> str:
    """Where the layers go and why, in words (`run --verbose`)."""
    if not room.targets:
        return "every layer on the CPU"
    n = min(n_gpu, n_layer + 1)
    where = f"{n} of {n_layer + 1} layers (the output layer counted) on {room.names}" if n else f"every layer on the CPU, none on {room.names}"
    if asked != "auto":
        return f"{where}: --gpu-layers {asked}"
    free = f"{room.free_text()}, {per_layer / GiB:.3f} GiB a layer with its KV cache, {compute / GiB:.2f} GiB for compute"
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
