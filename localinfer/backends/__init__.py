"""Inference backends behind one interface (base.py). Each is imported only when chosen,
so a missing optional engine never breaks the others."""

from __future__ import annotations

from importlib import import_module

from localinfer.backends.base import Backend
from localinfer.errors import BackendError, UserError

# In --engine auto's order: the first that runs a model (its Capabilities) takes it. The
# native engine decodes and prefills faster than llama.cpp on a CPU where it runs a model
# (docs/benchmarks.md); llama.cpp runs every architecture and offloads to GPUs.
BACKENDS = {
    "native": "localinfer.backends.native:NativeBackend",
    "llama.cpp": "localinfer.backends.llamacpp:LlamaCppBackend",
}


def get_backend(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise UserError(f"unknown engine '{name}'; choose one of: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    try:
        return getattr(import_module(module), cls)
    except (ImportError, OSError, RuntimeError) as e:  # e.g. a CUDA build on a machine without the driver
        raise BackendError(f"the {name} engine cannot start: {import_failure(e)}; 'localinfer doctor' says more") from None


def import_failure(e: BaseException) -> str:
    """One line for why a compiled library did not import (its messages run over several)."""
    text = " ".join(str(e).split())
    return text or type(e).__name__
