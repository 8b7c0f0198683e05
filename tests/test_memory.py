"""`--gpu-layers auto`: the layer choice against device lists shaped like the ones llama.cpp
reports on real machines, for a 7B-class model (Llama-2-7B Q4_K_M's sizes, as its GGUF
header gives them) and for the embedded model (its real header)."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from localinfer.devices import Device
from localinfer.errors import OutOfMemory
from localinfer.memory import GPU_HEADROOM, GiB, compute_bytes, kv_cache_bytes, plan
from localinfer.modelfile import GGUFInfo, inspect

from .native.test_architectures import MOE, tiny_model

CPU = Device("CPU", "Intel(R) Core(TM) i7-12700", "CPU", 0, 0)
GTX_1650 = Device("CUDA0", "NVIDIA GeForce GTX 1650", "GPU", int(3.6 * GiB), 4 * GiB)  # 4 GB card, desktop using some
RTX_3070 = Device("CUDA0", "NVIDIA GeForce RTX 3070", "GPU", int(7.5 * GiB), 8 * GiB)
IRIS_XE = Device("Vulkan0", "Intel(R) Iris(R) Xe Graphics", "iGPU", int(7.8 * GiB), int(15.6 * GiB))  # reports shared RAM
RTX_4090 = Device("CUDA0", "NVIDIA GeForce RTX 4090", "GPU", int(22.9 * GiB), 24 * GiB)
RTX_3060 = Device("CUDA1", "NVIDIA GeForce RTX 3060", "GPU", int(11.6 * GiB), 12 * GiB)
M2_PRO = Device("MTL0", "Apple M2 Pro", "GPU", int(21.3 * GiB), int(21.3 * GiB))  # Metal: type GPU, the working-set limit of 32 GB
RAM = 16 * GiB


def seven_b() -> GGUFInfo:
    return GGUFInfo(
        path=None, file_size=4_081_004_224, architecture="llama", name="Llama 2 7B", n_params=6_738_415_616,
        context_length=4096, n_layer=32, n_embd=4096, n_head=32, n_head_kv=32, head_dim=128, n_vocab=32000,
        tensor_types={"Q4_K": 193, "Q6_K": 33, "F32": 65}, tensor_bytes=4_080_263_168, chat_template=None, license=None,
    )  # fmt: skip


def layer_bytes(info: GGUFInfo, n_ctx: int) -> float:
    return (info.tensor_bytes + kv_cache_bytes(info, n_ctx)) / info.n_layer


def test_no_gpu_runs_everything_on_the_cpu() -> None:
    p = plan(seven_b(), 4096, "auto", [], ram_free=RAM)
    assert p.n_gpu_layers == 0 and p.warnings == []
    p = plan(seven_b(), 4096, "auto", [CPU], ram_free=RAM)  # a CPU-only build lists only the CPU
    assert p.n_gpu_layers == 0


def test_explicit_layers_without_a_gpu_are_ignored_and_ram_still_checked() -> None:
    p = plan(seven_b(), 4096, 99, [CPU], ram_free=RAM)
    assert p.n_gpu_layers == 0 and "no GPU to offload to" in p.warnings[0]
    with pytest.raises(OutOfMemory):
        plan(seven_b(), 4096, 99, [CPU], ram_free=2 * GiB)  # counted as on the CPU: does not fit


def test_8_gb_card_takes_the_whole_7b_model() -> None:
    info = seven_b()
    p = plan(info, 4096, "auto", [CPU, RTX_3070], ram_free=RAM)
    assert p.n_gpu_layers == info.n_layer + 1  # every layer and the output
    assert p.vram_free == RTX_3070.free_bytes


def test_4_gb_card_takes_what_fits() -> None:
    info, n_ctx = seven_b(), 4096
    p = plan(info, n_ctx, "auto", [CPU, GTX_1650], ram_free=RAM)
    assert 0 < p.n_gpu_layers < info.n_layer
    used = p.n_gpu_layers * layer_bytes(info, n_ctx) + compute_bytes(info, n_ctx)
    assert used <= GTX_1650.free_bytes - GPU_HEADROOM < used + layer_bytes(info, n_ctx)  # one more layer would not fit
    # the rest stays in RAM, and is checked there
    with pytest.raises(OutOfMemory):
        plan(info, n_ctx, "auto", [CPU, GTX_1650], ram_free=1 * GiB)


def test_integrated_gpu_shares_ram() -> None:
    """An iGPU's memory is the system's: offloading to it frees no RAM, so RAM must hold all of it."""
    info = seven_b()
    p = plan(info, 4096, "auto", [CPU, IRIS_XE], ram_free=RAM)
    assert p.n_gpu_layers == info.n_layer + 1
    with pytest.raises(OutOfMemory):
        plan(info, 4096, "auto", [CPU, IRIS_XE], ram_free=4 * GiB)  # a discrete card's layers would have left RAM


def test_headroom_is_kept_on_a_discrete_card() -> None:
    """A card with exactly the plan's bytes free gets fewer layers: the CUDA context, cuBLAS's
    workspace and ggml's pool need room the plan does not itemise (an H200 left with 1.2 GiB
    free ran out of memory in its first decode without it)."""
    info, n_ctx = seven_b(), 4096
    whole = info.tensor_bytes + kv_cache_bytes(info, n_ctx) + compute_bytes(info, n_ctx)
    tight = Device("CUDA0", "NVIDIA GeForce RTX 3070", "GPU", whole, 8 * GiB)
    p = plan(info, n_ctx, "auto", [CPU, tight], ram_free=RAM)
    assert 0 < p.n_gpu_layers < info.n_layer
    assert p.n_gpu_layers == int((whole - GPU_HEADROOM - compute_bytes(info, n_ctx)) // layer_bytes(info, n_ctx))
    every = int((info.n_layer + 1) * layer_bytes(info, n_ctx)) + compute_bytes(info, n_ctx)  # auto counts the output as a layer
    roomy = Device("CUDA0", "NVIDIA GeForce RTX 3070", "GPU", every + GPU_HEADROOM, 8 * GiB)
    assert plan(info, n_ctx, "auto", [CPU, roomy], ram_free=RAM).n_gpu_layers == info.n_layer + 1
    p = plan(info, n_ctx, "all", [CPU, tight], ram_free=RAM)  # asked for: done, with the reason it may fail
    assert "1 GiB of it kept for the GPU runtime" in p.warnings[0]


def test_discrete_gpu_is_preferred_to_an_integrated_one() -> None:
    p = plan(seven_b(), 4096, "auto", [CPU, IRIS_XE, GTX_1650], ram_free=RAM)
    assert p.vram_free == GTX_1650.free_bytes


def test_embedded_model_fits_any_card(model_path) -> None:
    info = inspect(model_path)
    for card in (GTX_1650, RTX_3070, IRIS_XE):
        assert plan(info, 4096, "auto", [CPU, card], ram_free=RAM).n_gpu_layers == info.n_layer + 1


def test_all_layers_asked_for() -> None:
    """`--gpu-layers all` (llama-bench's -ngl 99): every layer and the output, with a warning
    where the arithmetic says they will not fit, since the user asked for it."""
    info = seven_b()
    p = plan(info, 4096, "all", [CPU, RTX_3070], ram_free=RAM)
    assert p.n_gpu_layers == info.n_layer + 1 and p.warnings == []
    assert p.placement == f"{info.n_layer + 1} of {info.n_layer + 1} layers (the output layer counted) on CUDA0 (NVIDIA GeForce RTX 3070): --gpu-layers all"
    p = plan(info, 4096, "all", [CPU, GTX_1650], ram_free=RAM)
    assert p.n_gpu_layers == info.n_layer + 1 and "loading may fail" in p.warnings[0]
    assert plan(info, 4096, "all", [CPU], ram_free=RAM).n_gpu_layers == 0  # no GPU: ignored, as a number is


def test_placement_says_where_and_why() -> None:
    info, n_ctx = seven_b(), 4096
    assert plan(info, n_ctx, "auto", [CPU], ram_free=RAM).placement == "every layer on the CPU"
    whole = plan(info, n_ctx, "auto", [CPU, RTX_3070], ram_free=RAM).placement
    assert whole.startswith("33 of 33 layers (the output layer counted) on CUDA0 (NVIDIA GeForce RTX 3070): all fit in 7.50 GiB free")
    part = plan(info, n_ctx, "auto", [CPU, GTX_1650], ram_free=RAM)
    per_layer = layer_bytes(info, n_ctx) / GiB
    assert part.placement.startswith(f"{part.n_gpu_layers} of 33 layers") and f"what fits in 3.60 GiB free less 1 GiB kept for the GPU runtime, {per_layer:.3f} GiB a layer" in part.placement


def thirty_b() -> GGUFInfo:
    """A 30B-class model at Q4_K_M (60 layers, 8 KV heads): 18.6 GiB of weights."""
    return GGUFInfo(
        path=None, file_size=int(18.6 * GiB), architecture="llama", name="30B", n_params=32_500_000_000,
        context_length=32768, n_layer=60, n_embd=6656, n_head=52, n_head_kv=8, head_dim=128, n_vocab=32000,
        tensor_types={"Q4_K": 400, "Q6_K": 60}, tensor_bytes=int(18.6 * GiB), chat_template=None, license=None,
    )  # fmt: skip


def test_24_gb_card() -> None:
    """The whole 7B with room to spare; a 30B at 8k context does not fit whole, so the
    layers that fit go to the card, the rest stay in RAM."""
    assert plan(seven_b(), 4096, "auto", [CPU, RTX_4090], ram_free=RAM).n_gpu_layers == seven_b().n_layer + 1
    info, n_ctx = thirty_b(), 16384
    p = plan(info, n_ctx, "auto", [CPU, RTX_4090], ram_free=RAM)
    used = p.n_gpu_layers * layer_bytes(info, n_ctx) + compute_bytes(info, n_ctx)
    assert 0 < p.n_gpu_layers < info.n_layer and used <= RTX_4090.free_bytes - GPU_HEADROOM < used + layer_bytes(info, n_ctx)


def test_two_cards_add_up() -> None:
    """llama.cpp splits layers across the cards, so their free memory adds up: the 30B fits on
    a 24 GB and a 12 GB card together, where the 24 GB alone took only part of it."""
    info, n_ctx = thirty_b(), 16384
    p = plan(info, n_ctx, "auto", [CPU, RTX_4090, RTX_3060], ram_free=RAM)
    assert p.vram_free == RTX_4090.free_bytes + RTX_3060.free_bytes
    assert p.n_gpu_layers == info.n_layer + 1
    assert (info.tensor_bytes + kv_cache_bytes(info, n_ctx)) + compute_bytes(info, n_ctx) <= p.vram_free - 2 * GPU_HEADROOM  # kept on each card
    assert "CUDA0 (NVIDIA GeForce RTX 4090), CUDA1 (NVIDIA GeForce RTX 3060)" in p.placement


def test_apple_silicon_shares_ram() -> None:
    """A Metal device is reported as a plain GPU, but its memory is the system's: the layers go
    to it, and RAM must still hold them (unlike a discrete card's)."""
    info = seven_b()
    assert M2_PRO.unified and not RTX_3070.unified and IRIS_XE.unified
    p = plan(info, 4096, "auto", [CPU, M2_PRO], ram_free=RAM)
    assert p.n_gpu_layers == info.n_layer + 1 and p.vram_free == M2_PRO.free_bytes
    with pytest.raises(OutOfMemory):
        plan(info, 4096, "auto", [CPU, M2_PRO], ram_free=4 * GiB)
    plan(info, 4096, "auto", [CPU, RTX_3070], ram_free=4 * GiB)  # the same RAM does for a discrete card


# --- --rpc: layers split between this machine and workers, by what each offers ------------


def embedded() -> GGUFInfo:
    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    return inspect(local_path(resolve(None)))


def kv_of(info: GGUFInfo, n_ctx: int):  # noqa: ANN201
    return lambda types: kv_cache_bytes(info, n_ctx, types)


def test_workers_take_the_last_layers_the_last_one_the_output_and_this_machine_the_rest() -> None:
    from localinfer.memory import layer_weights, plan_workers

    info = embedded()
    layers, output, embedding = layer_weights(info)
    assert sum(layers) + output == info.tensor_bytes and output > embedding  # tied: the output is the embedding's copy and the final norm
    per = max(layers) + kv_cache_bytes(info, 256) / info.n_layer
    small = compute_bytes(info, 256, logits=False) + 5 * per  # five layers, no logits
    large = compute_bytes(info, 256) + output + 7 * per  # the output, its logits, seven layers
    p, held = plan_workers(info, 256, [("a:1", int(small)), ("b:2", int(large))], ("f16", "f16"), kv_of(info, 256), ram_free=RAM)
    assert [(s.endpoint, s.layers, s.output) for s in held] == [("a:1", 5, False), ("b:2", 7, True)]
    assert held[1].first == info.n_layer - 7 and held[0].first == info.n_layer - 12  # consecutive, in llama.cpp's order
    assert p.n_gpu_layers == 13  # llama.cpp's count: 12 layers and the output layer
    assert f"layers 0-{info.n_layer - 13} and the input on this machine" in p.placement
    assert all(s.bytes <= s.offer for s in held)


def test_a_worker_offering_too_little_holds_nothing_and_says_so() -> None:
    from localinfer.memory import plan_workers

    info = embedded()
    p, held = plan_workers(info, 256, [("a:1", 1 << 20), ("b:2", 1 << 20)], ("f16", "f16"), kv_of(info, 256), ram_free=RAM)
    assert held == [] and p.n_gpu_layers == 0
    assert len(p.warnings) == 2 and "a:1 offers" in p.warnings[0] and "holds none" in p.warnings[0]


def test_a_model_that_does_not_fit_even_with_the_workers_is_refused_with_each_machines_numbers() -> None:
    from localinfer.memory import plan_workers

    info = embedded()
    with pytest.raises(OutOfMemory) as e:
        plan_workers(info, 256, [("a:1", 200 << 20)], ("f16", "f16"), kv_of(info, 256), ram_free=10 << 20)
    assert "a:1 holds" in str(e.value) and "this machine would hold" in str(e.value) and "10 MiB free" in str(e.value)


def test_a_mixture_of_experts_is_planned_with_every_expert_and_says_what_a_token_reads(tmp_path) -> None:
    """The router may pick any expert, so all must be in memory: the plan's weights are every
    tensor of the file. What one token reads (2 of 8 experts) is reported beside them."""
    vocab = {"tokenizer.ggml.tokens": [f"t{i}" for i in range(64)], "tokenizer.ggml.token_type": [1] * 64, "tokenizer.ggml.merges": []}
    path = tiny_model(tmp_path / "tiny-qwen3moe.gguf", "qwen3moe", vocab, 4, 2, np.random.default_rng(0))
    tensors = GGUFReader(path).tensors
    total = sum(int(t.n_bytes) for t in tensors)
    experts = sum(int(t.n_bytes) for t in tensors if t.name.endswith("_exps.weight"))
    n_expert, n_used = MOE["qwen3moe"]
    p = plan(inspect(path), 256, "auto", [CPU], ram_free=RAM)
    assert p.weights == total and p.active_weights == total - experts + experts * n_used // n_expert
    assert p.describe().startswith(f"weights {total / GiB:.2f} GiB (all experts; {p.active_weights / GiB:.2f} GiB of them read per token) + KV cache")
    with pytest.raises(OutOfMemory, match=r"all experts"):
        plan(inspect(path), 256, "auto", [CPU], ram_free=total // 2)  # what a token reads would fit; the experts do not
    dense = plan(seven_b(), 4096, "auto", [CPU], ram_free=RAM)
    assert dense.active_weights == 0 and "experts" not in dense.describe()
