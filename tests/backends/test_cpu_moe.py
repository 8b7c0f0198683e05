"""`--cpu-moe` and `--n-cpu-moe` through real llama.cpp, on a tiny qwen3moe written here
(2 layers, 8 experts, top-2, F32): the loader turns them into tensor buffer overrides that
llama.cpp applies (its own log names each tensor it sends to the CPU's buffer), and the
model answers the same greedy tokens as without them. On a machine without a GPU the experts
were on the CPU already, so each flag is also the one-line warning that says so."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
from gguf import GGUFReader

from localinfer.backends import get_backend
from localinfer.backends.llamacpp import log_listener
from localinfer.engine.loader import LoadOptions, offload_devices, open_engine
from localinfer.engine.prompt_cache import CacheOptions
from localinfer.engine.types import SamplingParams

from ..conftest import THREADS
from ..native.test_architectures import first_tokens, tiny_model, vocabulary_of

OVERRIDDEN = re.compile(r"tensor (\S+) \([^)]*\) buffer type overridden to CPU")


def answer(path: Path, cpu_moe: int | str) -> tuple[list[int], list[str], list[str]]:
    """Greedy tokens, the tensors llama.cpp's log says it kept on the CPU, and the warnings."""
    lines: list[str] = []
    options = LoadOptions(engine="llama.cpp", ctx=128, threads=THREADS, gpu_layers=0, cpu_moe=cpu_moe, prompt_cache=CacheOptions(enabled=False))
    with log_listener(lines.append):
        engine = open_engine(str(path), options)
    try:
        out = engine.complete(engine.tokenize_prompt("The quick brown fox"), SamplingParams(temperature=0, max_tokens=32, ignore_eos=True))
    finally:
        engine.close()
    return out.tokens, OVERRIDDEN.findall("".join(lines)), engine.warnings


def test_experts_kept_on_the_cpu_load_and_answer_the_same_greedy_tokens(model_path: Path, tmp_path: Path) -> None:
    path = tiny_model(tmp_path / "tiny-qwen3moe.gguf", "qwen3moe", first_tokens(vocabulary_of(model_path), 1024), 4, 2, np.random.default_rng(5))
    experts = sorted(t.name for t in GGUFReader(path).tensors if t.name.endswith("_exps.weight"))
    plain, none_kept, plain_warnings = answer(path, "auto")
    first, first_kept, first_warnings = answer(path, 1)  # --n-cpu-moe 1
    every, every_kept, every_warnings = answer(path, "all")  # --cpu-moe
    assert len(plain) == 32 and first == plain and every == plain
    assert none_kept == [] and sorted(first_kept) == [name for name in experts if name.startswith("blk.0.")] and sorted(every_kept) == experts
    assert plain_warnings == []
    if not offload_devices(get_backend("llama.cpp").capabilities()):  # this build or machine has no GPU
        assert first_warnings == ["--n-cpu-moe only matters beside a GPU, and this engine has none to offload to: every expert runs on the CPU anyway"]
        assert every_warnings == ["--cpu-moe only matters beside a GPU, and this engine has none to offload to: every expert runs on the CPU anyway"]
