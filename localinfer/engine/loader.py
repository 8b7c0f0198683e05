"""From a MODEL reference to a ready Engine: resolve, pull if needed, choose the engine,
check, load.

The CLI, the TUI and the server all open models through here, so they agree on
defaults, memory checks and errors.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from pathlib import Path

from localinfer import memory
from localinfer.backends import BACKENDS, get_backend
from localinfer.backends.base import Backend, Capabilities, LoadParams
from localinfer.backends.isolated import IsolatedBackend
from localinfer.engine.budget import DEFAULT_SLOWDOWN
from localinfer.engine.draft_model import DraftModel, check_vocab
from localinfer.engine.engine import DEFAULT_PREFILL_CHUNK, Engine
from localinfer.engine.prompt_cache import DEFAULT_DISK, CacheOptions, PromptCache, default_ram
from localinfer.engine.speculative import DraftConfig
from localinfer.engine.types import EngineChoice, SamplingParams
from localinfer.engine.yes_no import ranks_by_logits
from localinfer.errors import BackendError, UserError
from localinfer.modelfile import GGUFInfo, inspect
from localinfer.projector import Projector, for_model
from localinfer.store.pull import Progress, ensure_local, local_path
from localinfer.store.refs import ModelSource, resolve

DEFAULT_CTX = 4096
EMBED_SEQUENCES = 32  # inputs one forward of an embedding model may carry
EMBED_BATCH = 2048  # and tokens (an encoder's forward: one whole input of its context, at least)
SAMPLING_KEYS = {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n"}


@dataclass
class LoadOptions:
    engine: str = "auto"  # a BACKENDS name, or "auto": the first in BACKENDS' order that runs the model
    ctx: int | None = None  # per sequence; None: the catalog's value, else min(4096, trained context)
    threads: int | None = None
    gpu_layers: int | str = "auto"
    # a mixture of experts' experts kept in RAM beside a GPU: of the first N layers
    # (--n-cpu-moe N), of "all" (--cpu-moe), or "auto": planned with --gpu-layers
    cpu_moe: int | str = "auto"
    n_seq_max: int = 1  # sequences decoded at once: the engine's slots
    kernels: str | None = None  # native engine only: auto | c | numba
    verbose: bool = False  # let the backend print its own log (LOCALINFER_DEBUG=1)
    draft: DraftConfig | None = None  # speculation's settings; None: off
    # A draft model beside prompt lookup (with `draft` set): a reference, "auto" (the catalog's
    # pair for the model, where it is downloaded), or None: prompt lookup alone
    draft_model: str | None = None
    draft_engine: str | None = None  # the draft model's engine; None: the target's
    draft_optional: bool = False  # a named draft that cannot be used is a warning, as auto's is
    # KV-cache K and V types (None: the catalog's cache_type / cache_type_k / cache_type_v,
    # else f16), or "auto": the first of f16, q8_0, q4_0 that fits
    cache: tuple[str | None, str | None] | str = (None, None)
    prefill_chunk: int = DEFAULT_PREFILL_CHUNK  # most prompt tokens one step prefills
    decode_slowdown: float = DEFAULT_SLOWDOWN  # how much longer than a decode step a prefilling step may take
    prompt_cache: CacheOptions = CacheOptions()  # KV blocks kept across requests and restarts
    rpc: tuple[str, ...] = ()  # RPC workers (HOST:PORT) to split the layers with (--rpc)
    pooling: str | None = None  # an embedding model's pooling instead of its file's (--pooling); None: the file's
    # a vision model's projector (--mmproj FILE), "none" for text alone, or None: an
    # mmproj-*.gguf beside the model file that pairs with it (projector.py)
    mmproj: str | None = None


def cache_types(asked: tuple[str | None, str | None] | str, defaults: dict[str, object]) -> tuple[str, str] | str:
    """The options' KV-cache types, each one not given taken from the catalog entry, else f16."""
    if asked == "auto" or (asked == (None, None) and defaults.get("cache_type") == "auto"):
        return "auto"
    both = defaults.get("cache_type")
    both = None if both == "auto" else both
    k = asked[0] or defaults.get("cache_type_k") or both or "f16"
    v = asked[1] or defaults.get("cache_type_v") or both or "f16"
    return (str(k), str(v))


def offload_devices(caps: Capabilities) -> list:
    """The devices an engine with these capabilities could put layers on (none without offload)."""
    if not caps.gpu_offload:
        return []
    from localinfer.devices import list_devices

    return [d for d in list_devices() if d.kind in ("GPU", "iGPU")]


def choose_engine(asked: str, info: GGUFInfo, gpu_layers: int | str, cache: tuple[str, str] | str = "auto", rpc: bool = False,
                  images: Projector | None = None) -> EngineChoice:  # fmt: skip
    """`asked`, or for "auto" the first engine (in BACKENDS' order, fastest on a CPU first)
    that runs the model's architecture and every tensor type, keeps the KV-cache types
    asked for, offloads where layers are to go to a GPU, distributes where --rpc asks, and
    reads images where the model has a projector."""
    if asked != "auto":
        if rpc and not get_backend(asked).capabilities().rpc:
            raise UserError(f"the {asked} engine runs a model on this machine alone; --rpc needs an engine that reaches RPC workers (llama.cpp, built by install.sh)")
        if images is not None and not get_backend(asked).capabilities().vision:
            raise UserError(f"the {asked} engine reads no images, and the model has the projector {images.path.name}: use --engine auto, or --mmproj none for text alone")
        return EngineChoice(asked, "asked for with --engine")
    engines: dict[str, Capabilities | BackendError] = {}
    for name in BACKENDS:
        try:
            engines[name] = get_backend(name).capabilities()
        except BackendError as e:  # an engine that cannot start here leaves the model to the next
            engines[name] = e
    to_gpu = gpu_layers != 0 and any(offload_devices(c) for c in engines.values() if isinstance(c, Capabilities))
    passed: list[str] = []
    for name, caps in engines.items():
        if isinstance(caps, BackendError):
            passed.append(f"{name} engine cannot start ({caps})")
            continue
        why_not = caps.refusal(info.architecture, info.tensor_types, auto=True, pooling=info.pooling)
        lacking = sorted(set(() if cache == "auto" else cache) - set(caps.kv_types))
        if why_not is None and lacking:
            why_not = f"a {'/'.join(lacking)} KV cache"
        if why_not is None and rpc and not caps.rpc:
            why_not = "a model across machines (--rpc)"
        elif why_not is None and images is not None and not caps.vision:
            why_not = f"images (the projector {images.path.name}; --mmproj none for text alone)"
        elif why_not is None and to_gpu and not caps.gpu_offload and not rpc:
            why_not = "GPU offload (layers are to go to the GPU)"
        if why_not is None:
            reason = f"it runs {info.architecture} and every tensor type in this file" + (f"; the {', '.join(passed)}" if passed else "")
            return EngineChoice(name, reason)
        passed.append(f"{name} engine does not run {why_not}")
    raise UserError(f"no engine runs this model: {'; '.join(passed)}")


def kv_types_of(name: str) -> tuple[str, ...]:
    """An engine's KV-cache types; none where it cannot start here."""
    try:
        return get_backend(name).capabilities().kv_types
    except BackendError:
        return ()


def check_cache_types(name: str, caps: Capabilities, types: tuple[str, str] | str) -> None:
    """Refuse a KV-cache type the engine lacks before any weights are mapped."""
    for t in () if types == "auto" else types:
        if t not in caps.kv_types:
            others = [other for other in BACKENDS if other != name and t in kv_types_of(other)]
            hint = f"; a {t} cache needs --engine {others[0]}" if others else ""
            raise UserError(f"the {name} engine's KV cache is {', '.join(caps.kv_types)}{hint}")


def open_engine(ref: str | None, options: LoadOptions | None = None, progress: Progress | None = None) -> Engine:
    options = options or LoadOptions()
    src = resolve(ref)
    path = ensure_local(src, progress)
    t0 = time.perf_counter()
    info = inspect(path)
    if options.pooling is None and src.defaults.get("pooling"):  # the catalog's (a file that names none), unless --pooling
        options = replace(options, pooling=str(src.defaults["pooling"]))
    asked = options.pooling or info.pooling
    if asked != "none":
        options = for_embeddings(options, info, context_of(options, src, info))
    computed = backend_pooling(asked, info)
    types = cache_types(options.cache, src.defaults)
    warnings: list[str] = []
    images = for_model(options.mmproj, path, info, warnings) if asked == "none" else None
    choice = choose_engine(options.engine, replace(info, pooling=computed), options.gpu_layers, types, rpc=bool(options.rpc), images=images)
    backend_cls: type[Backend] = get_backend(choice.name)
    caps = backend_cls.capabilities()
    check_cache_types(choice.name, caps, types)
    n_ctx = context_of(options, src, info)
    plan, split = plan_memory(info, n_ctx, options, backend_cls, types)
    warnings += plan.warnings
    if options.rpc and options.gpu_layers not in ("auto", 0):
        warnings.append("--gpu-layers is ignored with --rpc: the workers hold what they offer, this machine the rest on its CPU")
    if options.rpc and options.cpu_moe != "auto":
        warnings.append("--cpu-moe and --n-cpu-moe are ignored with --rpc: the workers hold whole layers")
    draft = plan_draft(options, src, choice.name, plan, n_ctx, warnings, progress) if options.draft is not None and options.draft_model else None
    params = LoadParams(n_ctx=n_ctx, n_threads=options.threads, n_gpu_layers=plan.n_gpu_layers, n_seq_max=options.n_seq_max,
                        kernels=options.kernels, verbose=options.verbose, cache_types=plan.cache_types, rpc_split=split,
                        n_cpu_moe=-1 if plan.n_cpu_moe >= info.n_layer > 0 else plan.n_cpu_moe, pooling=computed, mmproj=images.path if images else None,
                        n_batch=max(EMBED_BATCH, n_ctx) if asked != "none" else LoadParams.n_batch)  # fmt: skip
    if split:  # llama.cpp ends its process when a worker goes: it runs in a child, so only the requests end
        backend: Backend = IsolatedBackend(choice.name, path, params, explain=lambda: workers_now(options.rpc))
    else:
        backend = backend_cls.load(path, params)
    drafter = load_draft(draft, backend, params, warnings) if draft is not None else None
    load_ms = (time.perf_counter() - t0) * 1e3

    defaults = SamplingParams().with_overrides(**{k: v for k, v in src.defaults.items() if k in SAMPLING_KEYS})
    try:
        return Engine(
            backend, slots=options.n_seq_max, defaults=defaults, load_ms=load_ms, prefill_chunk=options.prefill_chunk, decode_slowdown=options.decode_slowdown,
            draft=options.draft, drafter=drafter, name=src.name, info=info, memory=plan, choice=choice, warnings=warnings,
            prompt_cache=open_prompt_cache(options.prompt_cache, path, info.architecture, choice.name, params), pooling=asked, projector=images,
        )  # fmt: skip
    except BaseException:  # a model the Engine refuses (a yes/no reranker without those tokens): its memory goes now
        if drafter is not None:
            drafter.close()
        backend.close()
        raise


def backend_pooling(asked: str, info: GGUFInfo) -> str:
    """What the backend computes of the pooling asked: rank of a causal model without a
    classifier head is scored above it from its logits (yes_no.py), so the backend runs it
    as the generative model it is ("none"); anything else, as asked."""
    return "none" if asked == "rank" and ranks_by_logits(info) else asked


def for_embeddings(options: LoadOptions, info: GGUFInfo, n_ctx: int) -> LoadOptions:
    """An embedding model's options: no drafting, and a sequence id for each of the many
    inputs one forward carries: EMBED_SEQUENCES for an encoder, which keeps no cache, or
    for a decoder as many as have n_ctx-token caches within EMBED_BATCH tokens."""
    n_seq = EMBED_SEQUENCES if not info.causal else min(EMBED_SEQUENCES, max(1, EMBED_BATCH // n_ctx))
    return replace(options, n_seq_max=max(options.n_seq_max, n_seq), draft=None, draft_model=None)


def context_of(options: LoadOptions, src: ModelSource, info: GGUFInfo) -> int:
    """One sequence's context: --ctx, else the catalog's, else the model's, at most DEFAULT_CTX."""
    return options.ctx or int(src.defaults.get("ctx", 0)) or min(DEFAULT_CTX, info.context_length or DEFAULT_CTX)


def plan_memory(info: GGUFInfo, n_ctx: int, options: LoadOptions, backend_cls: type[Backend], types: tuple[str, str] | str) -> tuple[memory.MemoryPlan, tuple[tuple[str, int], ...]]:
    """The memory plan of a load (refused with OutOfMemory where it does not fit), and
    llama.cpp's split across RPC workers where there are any."""

    def kv_bytes(kv: tuple[str, str]) -> int:  # every sequence holds n_ctx, in one shared pool or a cache each
        return backend_cls.kv_cache_bytes(info, n_ctx, options.n_seq_max, kv)

    if options.rpc:
        return plan_rpc(options.rpc, info, n_ctx * options.n_seq_max, types, kv_bytes)
    devices = offload_devices(backend_cls.capabilities())
    return memory.plan_cache(info, n_ctx * options.n_seq_max, options.gpu_layers, types, devices, kv_bytes=kv_bytes, cpu_moe=options.cpu_moe), ()


def plan_rpc(endpoints: tuple[str, ...], info: GGUFInfo, n_ctx: int, types: tuple[str, str] | str, kv_bytes: memory.KVBytes) -> tuple[memory.MemoryPlan, tuple[tuple[str, int], ...]]:
    """Ask every worker what it offers (each problem one line naming it), split the layers
    by the offers, and return the plan and llama.cpp's split: (endpoint, layers) in order."""
    from localinfer.backends.rpc.probe import probe

    offers = [(endpoint, probe(endpoint).free_bytes) for endpoint in endpoints]
    plan, held = memory.plan_workers(info, n_ctx, offers, ("f16", "f16") if types == "auto" else types, kv_bytes)
    return plan, tuple((s.endpoint, s.layers + s.output) for s in held)


def workers_now(endpoints: tuple[str, ...]) -> str:
    """After a loss: which workers answer now, in a few words (for /health and the error)."""
    from localinfer.backends.rpc.probe import probe

    gone = []
    for endpoint in endpoints:
        try:
            probe(endpoint, timeout=1.0)
        except UserError as e:
            gone.append(str(e))
    return "; ".join(gone) if gone else "every worker answers now: load the model again"


def open_prompt_cache(options: CacheOptions, model: Path, architecture: str, engine: str, params: LoadParams) -> PromptCache | None:
    """The prompt cache for a model loaded so, or None where it is off. What makes the KV
    bytes mean what they mean is in its identity: the engine, its kernels, the CPU, the KV
    types, the layers on a GPU and which GPUs, by backend and name (CUDA0 and Vulkan0 on one
    card round differently)."""
    import logging

    from localinfer.devices import cpu_name, list_devices
    from localinfer.paths import prompt_cache_dir

    ram = default_ram() if options.ram_bytes is None else options.ram_bytes
    disk = DEFAULT_DISK if options.disk_bytes is None else options.disk_bytes
    if not options.enabled or ram + disk == 0:
        return None
    describe = {"architecture": architecture, "engine": engine, "kernels": params.kernels or os.environ.get("LOCALINFER_KERNELS") or "auto", "cpu": cpu_name(), "kv_types": list(params.cache_types), "gpu_layers": params.n_gpu_layers,
                **({"rpc": [list(part) for part in params.rpc_split]} if params.rpc_split else {}),
                **({"cpu_moe": params.n_cpu_moe} if params.n_cpu_moe and params.n_gpu_layers else {}),
                **({"gpus": [f"{d.name}: {d.description}" for d in list_devices() if d.kind in ("GPU", "iGPU")]} if params.n_gpu_layers else {})}  # fmt: skip
    return PromptCache(describe, model, ram, disk, options.folder or prompt_cache_dir(), logging.getLogger("localinfer.prompt_cache").warning)


# --draft auto speculates only with a draft of at most this share of the target's weights. A
# K-token draft yields (1 - a^(K+1)) / (1 - a) tokens for a verify of about 1 + 0.05 K plain
# steps and K draft steps of c each (c: the bytes share, decode being memory-bound). At a
# per-token acceptance a of 0.65 (same-family pairs on code and chat: 0.6-0.8) the best K gains
# 1.22x at c = 0.30, 1.14x at c = 0.40 and 1.10x at c = 0.45; Qwen2.5-Coder 0.5B drafting for
# 1.5B (c = 0.44) measured 0.87-1.35x. At c = 0.30 a 1.2x gain needs a >= 0.65, at 0.45 a >= 0.85.
AUTO_DRAFT_SHARE = 0.30


@dataclass
class DraftPlan:
    """A draft model checked before anything loads: its file, engine and memory."""

    name: str
    path: Path
    engine: str
    plan: memory.MemoryPlan
    lenient: bool  # --draft auto's, or optional: a failure to use it is a warning, not an error


def plan_draft(options: LoadOptions, src: ModelSource, target_engine: str, target: memory.MemoryPlan, n_ctx: int, warnings: list[str],
               progress: Progress | None) -> DraftPlan | None:  # fmt: skip
    """The draft model to load beside the target: the one named (pulled if need be), or for
    "auto" the catalog's pair where it is downloaded. Its memory counts on top of the target's.
    A draft that cannot be used is an error when named, a warning (and none) for auto or
    where the options call it optional."""
    auto = options.draft_model == "auto"
    ref = src.draft if auto else options.draft_model
    lenient = auto or options.draft_optional
    if ref is None:
        return None
    try:
        draft_src = resolve(ref)
        path = local_path(draft_src) if auto else ensure_local(draft_src, progress)
        if path is None:
            return None  # --draft auto: the pair is not downloaded (pull --with-draft fetches it)
        info = inspect(path)
        engine = options.draft_engine or target_engine
        backend_cls = get_backend(engine)
        caps = backend_cls.capabilities()
        why_not = caps.refusal(info.architecture, info.tensor_types)
        if why_not is not None:
            raise UserError(f"the {engine} engine does not run {why_not}")
        kv = target.cache_types if set(target.cache_types) <= set(caps.kv_types) else ("f16", "f16")
        plan = memory.plan(info, n_ctx * options.n_seq_max, 0, (), target.ram_free - target.total, kv,
                           lambda types: backend_cls.kv_cache_bytes(info, n_ctx, options.n_seq_max, types))  # fmt: skip
    except UserError as e:
        return _draft_failed(ref, e, lenient, warnings)
    if auto and plan.weights > AUTO_DRAFT_SHARE * target.weights:
        return None  # the catalog's pair is too large a share of its target to pay on this machine
    if plan.weights >= target.weights:
        warnings.append(f"the draft model {ref} is no smaller than its target ({plan.weights / 1e6:.0f} MB against {target.weights / 1e6:.0f} MB): drafting will slow decoding, not speed it")
    return DraftPlan(ref, path, engine, plan, lenient)


def load_draft(draft: DraftPlan, target: Backend, params: LoadParams, warnings: list[str]) -> DraftModel | None:
    """Load the draft with one KV sequence per target slot and check that it tokenizes as
    the target does."""
    try:
        backend = get_backend(draft.engine).load(draft.path, replace(params, n_gpu_layers=0, n_cpu_moe=0, cache_types=draft.plan.cache_types))
    except UserError as e:
        return _draft_failed(draft.name, e, draft.lenient, warnings)
    try:
        check_vocab(target, backend)
    except UserError as e:
        backend.close()
        return _draft_failed(draft.name, e, draft.lenient, warnings)
    return DraftModel(backend, params.n_seq_max, draft.name)


def _draft_failed(name: str, error: Exception, lenient: bool, warnings: list[str]) -> None:
    message = f"cannot use the draft model {name}: {error}"
    if not lenient:
        raise UserError(message)
    warnings.append(message + "; decoding with prompt lookup alone")
