"""`localinfer show` on a mixture of experts: the expert count, the experts a token uses, and
the total and active parameters, against llama.cpp reading the same file.

The model is a tiny qwen3moe written in the test (tests/native/test_architectures.py's
tiny_model: 8 experts, 2 per token, llama.cpp's tensor names and keys). llama.cpp must load
it and run a token through it (so the names, shapes and keys are the ones it expects), and
the parameter total `show` prints must be llama_model_n_params. The active count is worked
out here from gguf-py's reader of the file: every tensor but the experts', and 2/8 of theirs.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from ..conftest import read_gguf, run_cli
from ..native.test_architectures import MOE, first_tokens, tiny_model, vocabulary  # noqa: F401 - vocabulary: the fixture

N_EXPERT, N_EXPERT_USED = MOE["qwen3moe"]


@pytest.fixture(scope="module")
def moe_path(vocabulary, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("moe") / "tiny-qwen3moe.gguf"
    return tiny_model(path, "qwen3moe", first_tokens(vocabulary, 1024), 4, 2, np.random.default_rng(0))


@pytest.fixture(scope="module")
def reference(moe_path: Path) -> dict[str, object]:
    """What llama.cpp reads in the file, after it ran two tokens through the experts (a wrong
    tensor shape or key fails the load or the graph), and the active count from gguf-py's
    reader: every tensor but the experts', and N_EXPERT_USED / N_EXPERT of theirs."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(moe_path), vocab_only=False, n_ctx=64, n_threads=1, verbose=False)
    try:
        llm.eval([5, 6])  # llama-cpp-python keeps no scores without logits_all (its array is left uninitialised): read llama.cpp's own
        assert np.isfinite(np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))).all()
        n_params, metadata = llm._model.n_params(), dict(llm.metadata)
    finally:
        llm.close()
    tensors = read_gguf(moe_path).tensors
    experts = [int(t.n_elements) for t in tensors if t.name.split(".")[-2] in ("ffn_gate_exps", "ffn_up_exps", "ffn_down_exps")]
    assert len(experts) == 3 * int(metadata["qwen3moe.block_count"])
    rest = sum(int(t.n_elements) for t in tensors) - sum(experts)
    return {"parameters": n_params, "active": rest + sum(experts) * N_EXPERT_USED // N_EXPERT, "metadata": metadata}


def rows(text: str) -> dict[str, str]:
    """show's table as {first word of the key: value}."""
    return {line.split(maxsplit=1)[0]: line.split(maxsplit=1)[1].strip() for line in text.splitlines() if len(line.split(maxsplit=1)) == 2}


def test_show_json_reports_experts_and_active_parameters(moe_path: Path, reference) -> None:
    r = run_cli("show", str(moe_path), "--json")
    assert r.returncode == 0, r.stderr
    info, metadata = json.loads(r.stdout), reference["metadata"]
    assert info["architecture"] == metadata["general.architecture"] == "qwen3moe"
    assert info["parameters"] == reference["parameters"]
    assert info["experts"] == int(metadata["qwen3moe.expert_count"]) == N_EXPERT
    assert info["experts_used"] == int(metadata["qwen3moe.expert_used_count"]) == N_EXPERT_USED
    assert info["active_parameters"] == reference["active"] < reference["parameters"]


def test_show_prints_experts_and_active_parameters(moe_path: Path, reference) -> None:
    r = run_cli("show", str(moe_path))
    assert r.returncode == 0, r.stderr
    shown = rows(r.stdout)
    assert shown["parameters"] == f"{reference['parameters'] / 1e6:.1f}M, {reference['active'] / 1e6:.1f}M active per token"
    assert shown["experts"] == f"{N_EXPERT}, {N_EXPERT_USED} used per token"


def test_a_dense_model_shows_no_experts(model_path: Path) -> None:
    info = json.loads(run_cli("show", str(model_path), "--json").stdout)
    assert not {"experts", "experts_used", "active_parameters"} & set(info)
    shown = rows(run_cli("show", str(model_path)).stdout)
    assert shown["parameters"] == f"{info['parameters'] / 1e6:.1f}M" and "experts" not in shown
