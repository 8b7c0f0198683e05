"""Inference backends behind one interface (base.py). Each is imported only when chosen,
so a missing optional engine never breaks the others."""

from __future__ import annotations

from importlib import import_module

from localinfer.backends.base import Backend
from localinfer.errors import UserError

BACKENDS = {
    "llama.cpp": "localinfer.backends.llamacpp:LlamaCppBackend",
    "native": "localinfer.backends.native:NativeBackend",
}


def get_backend(name: str) -> type[Backend]:
    if name not in BACKENDS:
        raise UserError(f"unknown engine '{name}'; choose one of: {', '.join(BACKENDS)}")
    module, cls = BACKENDS[name].split(":")
    return getattr(import_module(module), cls)
