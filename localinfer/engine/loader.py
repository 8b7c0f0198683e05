"""From a MODEL reference to a ready Engine: resolve, pull if needed, check, load.

The CLI, the TUI and the server all open models through here, so they agree on
defaults, memory checks and errors.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from localinfer import memory
from localinfer.backends import get_backend
from localinfer.backends.base import LoadParams
from localinfer.engine.engine import Engine
from localinfer.engine.speculative import DraftConfig
from localinfer.engine.types import SamplingParams
from localinfer.modelfile import inspect
from localinfer.store.pull import Progress, ensure_local
from localinfer.store.refs import resolve

DEFAULT_CTX = 4096
SAMPLING_KEYS = {"temperature", "top_k", "top_p", "min_p", "repeat_penalty", "repeat_last_n"}


@dataclass
class LoadOptions:
    engine: str = "llama.cpp"
    ctx: int | None = None  # per sequence; None: the catalog's value, else min(4096, trained context)
    threads: int | None = None
    gpu_layers: int | str = "auto"
    n_seq_max: int = 1
    kernels: str | None = None  # native engine only: auto | c | numba
    verbose: bool = False  # let the backend print its own log (LOCALINFER_DEBUG=1)
    draft: DraftConfig | None = None  # prompt-lookup speculation; None: off
    # KV-cache K and V types (None: the catalog's cache_type / cache_type_k / cache_type_v,
    # else f16), or "auto": the first of f16, q8_0, q4_0 that fits
    cache: tuple[str | None, str | None] | str = (None, None)


def cache_types(asked: tuple[str | None, str | None] | str, defaults: dict[str, object]) -> tuple[str, str] | str:
    """The options' KV-cache types, each one not given taken from the catalog entry, else f16."""
    if asked == "auto" or (asked == (None, None) and defaults.get("cache_type") == "auto"):
        return "auto"
    both = defaults.get("cache_type")
    both = None if both == "auto" else both
    k = asked[0] or defaults.get("cache_type_k") or both or "f16"
    v = asked[1] or defaults.get("cache_type_v") or both or "f16"
    return (str(k), str(v))


def open_engine(ref: str | None, options: LoadOptions | None = None, progress: Progress | None = None) -> Engine:
    options = options or LoadOptions()
    src = resolve(ref)
    path = ensure_local(src, progress)
    backend_cls = get_backend(options.engine)

    t0 = time.perf_counter()
    info = inspect(path)
    n_ctx = options.ctx or int(src.defaults.get("ctx", 0)) or min(DEFAULT_CTX, info.context_length or DEFAULT_CTX)
    devices = []
    if options.engine == "llama.cpp":
        from localinfer.backends.devices import list_devices
        from localinfer.backends.llamacpp import supports_gpu_offload

        devices = list_devices() if supports_gpu_offload() else []
    # n_ctx is per sequence; the cache holds one for each (llama.cpp's is one shared pool)
    total_ctx = n_ctx * options.n_seq_max
    plan = memory.plan_cache(info, total_ctx, options.gpu_layers if options.engine == "llama.cpp" else 0, cache_types(options.cache, src.defaults), devices)
    backend = backend_cls.load(
        path,
        LoadParams(
            n_ctx=total_ctx if options.engine == "llama.cpp" else n_ctx,
            n_threads=options.threads,
            n_gpu_layers=plan.n_gpu_layers,
            n_seq_max=options.n_seq_max,
            kernels=options.kernels,
            verbose=options.verbose,
            cache_types=plan.cache_types,
        ),
    )
    load_ms = (time.perf_counter() - t0) * 1e3

    defaults = SamplingParams().with_overrides(**{k: v for k, v in src.defaults.items() if k in SAMPLING_KEYS})
    engine = Engine(backend, defaults, load_ms, draft=options.draft)
    engine.name = src.name
    engine.info = info
    engine.memory = plan
    return engine
