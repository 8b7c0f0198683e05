"""localinfer: a local LLM runtime. The engine is in `localinfer.engine`, backends in `localinfer.backends`."""

__version__ = "0.1.0"
