"""The pooling a sentence-transformers folder asks for, as GGUF's `{arch}.pooling_type`.

sentence-transformers lists a model's stages in `modules.json`; its Pooling stage's
`config.json` (usually `1_Pooling/config.json`) says how token vectors become one vector.
llama.cpp's converter reads the same two files and knows three of the modes, tried in
this order: mean, cls, last token. A Dense stage after the pooling has no place in a
GGUF: converting without it would give other vectors than the model's, so it is refused.
"""

from __future__ import annotations

from pathlib import Path

import gguf

from localinfer_quant.hf import UnsupportedSource, read_json

POOLING_MODULE = "sentence_transformers.models.Pooling"
DENSE_MODULE = "sentence_transformers.models.Dense"
# 1_Pooling/config.json's flags, in the order llama.cpp's converter tries them
MODES = (("pooling_mode_mean_tokens", gguf.PoolingType.MEAN),
         ("pooling_mode_cls_token", gguf.PoolingType.CLS),
         ("pooling_mode_lasttoken", gguf.PoolingType.LAST))  # fmt: skip


def sentence_pooling(folder: Path) -> gguf.PoolingType | None:
    """The pooling modules.json's Pooling stage names, or None for a folder without one."""
    path = folder / "modules.json"
    if not path.is_file():
        return None
    modules = read_json(path)
    if not isinstance(modules, list) or not all(isinstance(m, dict) for m in modules):
        raise UnsupportedSource(f"{path} is not a list of sentence-transformers modules")
    dense = [m.get("path") for m in modules if m.get("type") == DENSE_MODULE]
    if dense:
        raise UnsupportedSource(f"{path} has a Dense layer after the pooling ({dense[0]}), which a GGUF cannot hold")
    stage = next((m for m in modules if m.get("type") == POOLING_MODULE), None)
    if stage is None:
        return None
    config_path = folder / str(stage.get("path", "")) / "config.json"
    if not config_path.is_file():
        raise UnsupportedSource(f"{path} names a Pooling stage, but {config_path} is missing")
    config = read_json(config_path)
    if not isinstance(config, dict):
        raise UnsupportedSource(f"{config_path} is not a pooling configuration (a JSON object)")
    for key, kind in MODES:
        if config.get(key):
            return kind
    asked = [k.removeprefix("pooling_mode_") for k, v in config.items() if k.startswith("pooling_mode_") and v]
    raise UnsupportedSource(f"{config_path} asks for {' and '.join(asked) or 'no'} pooling; a GGUF pools by mean, cls token or last token")
