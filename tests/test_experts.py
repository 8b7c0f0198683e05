"""A mixture of experts beside a GPU (issue 47): `--gpu-layers auto` places it as llama.cpp's
`--fit` does, and `--cpu-moe` / `--n-cpu-moe` override it. The planner's arithmetic on this
machine, which has no GPU: device lists shaped like llama.cpp's, and a real tiny qwen3moe
GGUF (2 layers, 8 experts, top-2) written here. Each expected figure is summed from the
file's own tensor sizes as gguf-py's reader gives them, not from the planner's tables."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFReader

from localinfer.devices import Device
from localinfer.errors import OutOfMemory
from localinfer.experts import expert_patterns
from localinfer.memory import GPU_HEADROOM, GiB, compute_bytes, kv_cache_bytes, plan, size_text
from localinfer.modelfile import GGUFInfo, inspect

from .native.test_architectures import MOE, N_LAYER, tiny_model
from .test_memory import CPU, RAM, RTX_3070, seven_b

N_CTX = 256


@pytest.fixture(scope="module")
def moe(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, GGUFInfo]:
    vocab = {"tokenizer.ggml.tokens": [f"t{i}" for i in range(64)], "tokenizer.ggml.token_type": [1] * 64, "tokenizer.ggml.merges": []}
    path = tiny_model(tmp_path_factory.mktemp("moe") / "tiny-qwen3moe.gguf", "qwen3moe", vocab, 4, 2, np.random.default_rng(0))
    return path, inspect(path)


class Sizes:
    """The file's bytes as the planner should count them, from GGUFReader."""

    def __init__(self, path: Path, info: GGUFInfo) -> None:
        tensors = {t.name: int(t.n_bytes) for t in GGUFReader(path).tensors}
        self.experts = [sum(n for name, n in tensors.items() if name.startswith(f"blk.{i}.") and name.endswith("_exps.weight")) for i in range(N_LAYER)]
        self.shared = [sum(n for name, n in tensors.items() if name.startswith(f"blk.{i}.")) - self.experts[i] for i in range(N_LAYER)]
        self.output = tensors["output.weight"] + tensors["output_norm.weight"]  # untied: it leaves RAM for the GPU
        self.total = sum(tensors.values())
        self.kv_layer = kv_cache_bytes(info, N_CTX) / N_LAYER
        self.compute = compute_bytes(info, N_CTX)
        assert min(self.experts) > 0 and min(self.shared) > 0

    def gpu(self, layers: range, n_cpu_moe: int) -> int:
        """What the GPU holds with `layers` offloaded and the output, the first n_cpu_moe layers' experts kept back."""
        return int(self.compute + self.output + sum(self.shared[i] + self.kv_layer + (self.experts[i] if i >= n_cpu_moe else 0) for i in layers))

    def ram(self, layers: range, n_cpu_moe: int) -> int:
        return int(self.total + self.kv_layer * N_LAYER - (self.gpu(layers, n_cpu_moe) - self.compute))


def card(free: int) -> Device:
    return Device("CUDA0", "NVIDIA GeForce RTX 4060", "GPU", GPU_HEADROOM + free, 8 * GiB)


EVERY = range(N_LAYER)


def test_every_expert_goes_to_the_gpu_when_the_model_fits(moe) -> None:
    path, info = moe
    s = Sizes(path, info)
    p = plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, 0))], ram_free=RAM)
    assert (p.n_gpu_layers, p.n_cpu_moe) == (N_LAYER + 1, 0)
    assert p.gpu_bytes == s.gpu(EVERY, 0) and p.ram_bytes == s.ram(EVERY, 0)
    assert "no layer's experts kept on the CPU" in p.placement and p.warnings == []


def test_when_vram_is_short_the_first_layers_experts_stay_in_ram(moe) -> None:
    """Every layer's attention and shared weights first; then the experts of the last
    layers, while they fit: one byte short of a layer's experts keeps one more layer's back."""
    path, info = moe
    s = Sizes(path, info)
    for n_cpu_moe in range(N_LAYER + 1):
        exact = plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, n_cpu_moe))], ram_free=RAM)
        assert (exact.n_gpu_layers, exact.n_cpu_moe) == (N_LAYER + 1, n_cpu_moe)
        assert exact.gpu_bytes == s.gpu(EVERY, n_cpu_moe) and exact.ram_bytes == s.ram(EVERY, n_cpu_moe)
        if n_cpu_moe < N_LAYER:
            short = plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, n_cpu_moe) - 1)], ram_free=RAM)
            assert (short.n_gpu_layers, short.n_cpu_moe) == (N_LAYER + 1, n_cpu_moe + 1)
    p = plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, 1))], ram_free=RAM)
    assert "3 of 3 layers (the output layer counted) on CUDA0 (NVIDIA GeForce RTX 4060), the first layer's experts kept on the CPU" in p.placement
    assert p.split.startswith(f"CUDA0: {size_text(s.gpu(EVERY, 1))} (attention and shared weights of 2 layers, experts of 1, the output; ")
    assert f" · CPU: {size_text(s.ram(EVERY, 1))} (experts of 1 layer, the input embedding; " in p.split


def test_what_each_device_reads_per_token_is_the_active_share_of_its_experts(moe) -> None:
    path, info = moe
    s = Sizes(path, info)
    n_expert, n_used = MOE["qwen3moe"]
    p = plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, 1))], ram_free=RAM)
    cpu_read = s.experts[0] * n_used / n_expert
    gpu_read = sum(s.shared) + s.experts[1] * n_used / n_expert + s.output
    assert re.search(rf"; {size_text(int(gpu_read))} read per token\) · CPU: .*; {size_text(int(cpu_read))} read per token\)$", p.split), p.split
    assert gpu_read + cpu_read == pytest.approx(p.active_weights - (s.total - sum(s.shared) - sum(s.experts) - s.output), abs=2)  # the rest: the input embedding


def test_when_not_even_every_layers_shared_weights_fit_the_experts_stay_in_ram_and_the_last_layers_go(moe) -> None:
    path, info = moe
    s = Sizes(path, info)
    last = range(N_LAYER - 1, N_LAYER)
    p = plan(info, N_CTX, "auto", [CPU, card(s.gpu(last, N_LAYER))], ram_free=RAM)
    assert (p.n_gpu_layers, p.n_cpu_moe) == (N_LAYER, N_LAYER)  # layer 1 and the output, no expert
    assert p.gpu_bytes == s.gpu(last, N_LAYER) and p.ram_bytes == s.ram(last, N_LAYER)
    assert "every layer's experts kept on the CPU" in p.placement
    assert "CPU: " + size_text(s.ram(last, N_LAYER)) + " (attention and shared weights of 1 layer, experts of 2 layers, the input embedding; " in p.split


def test_a_tiny_gpu_takes_nothing(moe) -> None:
    path, info = moe
    s = Sizes(path, info)
    p = plan(info, N_CTX, "auto", [CPU, card(s.compute + s.output - 1)], ram_free=RAM)
    assert (p.n_gpu_layers, p.n_cpu_moe, p.gpu_bytes) == (0, 0, 0)
    assert p.ram_bytes == s.total + int(s.kv_layer * N_LAYER) + s.compute and p.split.startswith("CPU: ")
    assert "every layer on the CPU, none on CUDA0" in p.placement and "not even the output layer with the compute buffer fits" in p.placement


def test_cpu_moe_and_n_cpu_moe_override_the_planner(moe) -> None:
    path, info = moe
    s = Sizes(path, info)
    roomy = card(s.gpu(EVERY, 0) * 4)
    assert plan(info, N_CTX, "auto", [CPU, roomy], ram_free=RAM, cpu_moe=1).n_cpu_moe == 1
    every = plan(info, N_CTX, "auto", [CPU, roomy], ram_free=RAM, cpu_moe="all")
    assert (every.n_gpu_layers, every.n_cpu_moe) == (N_LAYER + 1, N_LAYER) and "--cpu-moe; the last layers that fit" in every.placement
    assert plan(info, N_CTX, "auto", [CPU, roomy], ram_free=RAM, cpu_moe=99).n_cpu_moe == N_LAYER  # more than there are: every layer's
    # --n-cpu-moe 0 where not every expert fits: the layers give way instead (the last that fit go)
    p = plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, 1))], ram_free=RAM, cpu_moe=0)
    assert (p.n_gpu_layers, p.n_cpu_moe) == (N_LAYER, 0) and p.gpu_bytes == s.gpu(range(1, N_LAYER), 0)
    # --gpu-layers given, the experts planned beside them; both given: as asked, with a warning where it will not fit
    p = plan(info, N_CTX, "all", [CPU, card(s.gpu(EVERY, 1))], ram_free=RAM)
    assert (p.n_gpu_layers, p.n_cpu_moe) == (N_LAYER + 1, 1) and p.warnings == []
    p = plan(info, N_CTX, "all", [CPU, card(s.gpu(EVERY, 1))], ram_free=RAM, cpu_moe=0)
    assert (p.n_gpu_layers, p.n_cpu_moe) == (N_LAYER + 1, 0) and len(p.warnings) == 1 and "loading may fail" in p.warnings[0]
    assert p.placement.endswith(": --gpu-layers all --n-cpu-moe 0")


def test_the_experts_kept_in_ram_are_counted_against_ram(moe) -> None:
    path, info = moe
    s = Sizes(path, info)
    needed = s.ram(EVERY, N_LAYER)
    assert plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, 0))], ram_free=needed, cpu_moe="all").ram_bytes == needed
    with pytest.raises(OutOfMemory, match=r"the model needs .* GiB of RAM \(weights .* \(all experts; "):
        plan(info, N_CTX, "auto", [CPU, card(s.gpu(EVERY, 0))], ram_free=needed - 1, cpu_moe="all")


def test_without_a_gpu_the_flags_only_warn_and_still_reach_the_engine(moe) -> None:
    """No GPU (a CPU-only build, or the native engine): every expert is on the CPU anyway,
    so the flag is a one-line warning; the count still reaches llama.cpp, which then keeps
    the experts on the CPU as it would have."""
    _, info = moe
    p = plan(info, N_CTX, "auto", [CPU], ram_free=RAM, cpu_moe=1)
    assert p.n_gpu_layers == 0 and p.n_cpu_moe == 1
    assert p.warnings == ["--n-cpu-moe only matters beside a GPU, and this engine has none to offload to: every expert runs on the CPU anyway"]
    assert plan(info, N_CTX, "auto", [], ram_free=RAM, cpu_moe="all").warnings[0].startswith("--cpu-moe only matters beside a GPU")
    assert plan(info, N_CTX, "auto", [CPU], ram_free=RAM).warnings == []


def test_a_dense_model_with_cpu_moe_warns_that_it_has_no_experts_and_plans_as_before() -> None:
    info = seven_b()
    before = plan(info, 4096, "auto", [CPU, RTX_3070], ram_free=RAM)
    p = plan(info, 4096, "auto", [CPU, RTX_3070], ram_free=RAM, cpu_moe="all")
    assert p.warnings == ["--cpu-moe keeps a mixture of experts' experts on the CPU, and this model has no experts: it changes nothing"]
    assert (p.n_gpu_layers, p.n_cpu_moe, p.gpu_bytes, p.placement) == (before.n_gpu_layers, 0, before.gpu_bytes, before.placement)
    assert p.split.startswith("CUDA0: ") and "32 layers and the output" in p.split


def test_the_patterns_are_llama_cpps_and_match_the_experts_of_the_layers_asked(moe) -> None:
    """common.h's LLM_FFN_EXPS_REGEX for --cpu-moe, and llm_ffn_exps_block_regex's
    "blk\\.N" + it a layer for --n-cpu-moe, searched in each tensor's name as std::regex_search does."""
    path, _ = moe
    names = [t.name for t in GGUFReader(path).tensors]
    experts = {name for name in names if name.endswith("_exps.weight")}

    def kept(n: int) -> set[str]:
        return {name for name in names if any(re.search(p, name) for p in expert_patterns(n))}

    assert expert_patterns(-1) == (r"\.ffn_(up|down|gate|gate_up)_(ch|)exps",)
    assert kept(-1) == experts and kept(0) == set()
    assert kept(1) == {name for name in experts if name.startswith("blk.0.")}
    assert kept(N_LAYER) == experts
    assert not re.search(expert_patterns(2)[1], "blk.11.ffn_up_exps.weight")  # layer 1's pattern is not layer 11's
