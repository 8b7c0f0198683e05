"""The KV cache's element types: one table, by ggml's names, for every layer that needs one.

A type's id and its bytes come from gguf's own tables (ggml's enum and block sizes), so
nothing here can drift from the files and the engines; which of them an engine keeps is
its own capability (`Capabilities.kv_types`). A leaf below memory.py and the backends,
which both size a cache with it.
"""

from __future__ import annotations

from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# Every type a KV cache may hold in llama.cpp, smallest loss first.
KV_TYPES: dict[str, GGMLQuantizationType] = {
    name: GGMLQuantizationType[name.upper()] for name in ("f16", "q8_0", "q5_1", "q5_0", "q4_1", "q4_0", "iq4_nl")
}
AUTO_CACHE = (("f16", "f16"), ("q8_0", "q8_0"), ("q4_0", "q4_0"))  # --cache-type auto tries these in order


def bytes_per_value(name: str) -> float:
    """Bytes one cached value takes: f16's two, or a block's bytes over its values."""
    block, size = GGML_QUANT_SIZES[KV_TYPES[name]]
    return size / block


def position_bytes(n_head_kv: int, head_dim: int, types: tuple[str, str]) -> float:
    """Bytes one position of one layer takes in the cache, its K and its V."""
    return n_head_kv * head_dim * (bytes_per_value(types[0]) + bytes_per_value(types[1]))


def ggml_id(name: str) -> int:
    """ggml's enum value for the type (what llama.cpp's context parameters take)."""
    return int(KV_TYPES[name])
