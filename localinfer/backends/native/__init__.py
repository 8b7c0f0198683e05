"""localinfer's own engine: a llama-family forward pass over GGUF blocks, on our kernels."""

from localinfer.backends.native.backend import NativeBackend

__all__ = ["NativeBackend"]
