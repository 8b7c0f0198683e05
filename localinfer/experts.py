"""A mixture of experts beside a GPU: its bytes layer by layer, each layer's routed experts
apart from the rest, and where they go.

llama.cpp keeps experts in RAM through tensor buffer overrides: regexes over tensor names,
each with the buffer type its tensors go to. `--cpu-moe` and `--n-cpu-moe N` are its two
shorthands (common/arg.cpp), and `expert_patterns` writes the same patterns. `ExpertLayout`
places a model as llama.cpp's `--fit` does for one: the attention, norms, router and shared
weights of every layer first, since every token reads all of them; then the experts, layer
by layer from the last back, while they fit (a token reads only its chosen few, so they
cost the GPU most bytes for the least gain); the rest stays in RAM.
"""

from __future__ import annotations

import re

from localinfer.modelfile import GGUFInfo

# The routed experts' tensors that llama.cpp's --cpu-moe keeps on the CPU: common.h's
# LLM_FFN_EXPS_REGEX, matched anywhere in a name (std::regex_search), so a layer's
# ffn_{up,down,gate,gate_up}_{,ch}exps weights and their biases. A shared expert (_shexp)
# and the router (ffn_gate_inp) are read by every token and are not among them.
EXPERTS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"
EXPERTS = re.compile(EXPERTS_REGEX)


def expert_patterns(n_cpu_moe: int) -> tuple[str, ...]:
    """llama.cpp's override patterns that keep experts on the CPU: for n_cpu_moe < 0 every
    layer's (--cpu-moe's one pattern), else the first n_cpu_moe layers' (--n-cpu-moe's one
    a layer: llm_ffn_exps_block_regex puts "blk\\.N" before the experts' pattern)."""
    if n_cpu_moe < 0:
        return (EXPERTS_REGEX,)
    return tuple(rf"blk\.{i}{EXPERTS_REGEX}" for i in range(n_cpu_moe))


def layer_index(name: str) -> int | None:
    """N of a repeating layer's tensor `blk.N.…`; None for any other tensor."""
    parts = name.split(".")
    return int(parts[1]) if len(parts) > 2 and parts[0] == "blk" and parts[1].isdigit() else None


class ExpertLayout:
    """A mixture of experts' bytes as the GGUF has them, per repeating layer: `shared`
    (attention, norms, router, shared expert) and `experts` (the routed experts), with
    the KV cache spread evenly over the layers. Counts follow llama.cpp's n_gpu_layers:
    the output is one layer more, and the last layers are the ones offloaded."""

    def __init__(self, info: GGUFInfo, kv: int, compute: int) -> None:
        self.n_layer = max(1, info.n_layer)
        self.shared, self.experts = [0] * self.n_layer, [0] * self.n_layer
        for t in info.tensors:
            index = layer_index(t.name)
            if index is not None and index < self.n_layer:
                (self.experts if EXPERTS.search(t.name) else self.shared)[index] += t.nbytes
        named = {t.name: t.nbytes for t in info.tensors}
        norm = named.get("output_norm.weight", 0)
        self.output = named.get("output.weight", named.get("token_embd.weight", 0)) + norm  # tied: a copy of the embedding goes
        self.output_moved = named.get("output.weight", 0) + norm  # what leaves RAM with it (the embedding stays)
        self.kv_layer, self.compute = kv / self.n_layer, compute
        self.resident = info.tensor_bytes + kv
        self.read_share = min(info.n_expert_used, info.n_expert) / max(1, info.n_expert)  # of a layer's experts, what a token reads

    def gpu_layers(self, n_gpu: int) -> range:
        """The repeating layers llama.cpp offloads for n_gpu_layers (i_gpu_start onwards)."""
        return range(max(0, self.n_layer + 1 - n_gpu), self.n_layer)

    def experts_on_gpu(self, n_gpu: int, n_cpu_moe: int) -> list[int]:
        return [i for i in self.gpu_layers(n_gpu) if i >= n_cpu_moe]

    def _moved(self, n_gpu: int, n_cpu_moe: int) -> float:
        """The repeating layers' bytes on the GPU, their KV cache with them."""
        return sum(self.shared[i] + self.kv_layer for i in self.gpu_layers(n_gpu)) + sum(self.experts[i] for i in self.experts_on_gpu(n_gpu, n_cpu_moe))

    def gpu_bytes(self, n_gpu: int, n_cpu_moe: int) -> int:
        """What the GPU holds: its layers with their KV cache, the output, the compute buffer."""
        return int(self._moved(n_gpu, n_cpu_moe) + self.output + self.compute) if n_gpu > 0 else 0

    def ram_bytes(self, n_gpu: int, n_cpu_moe: int) -> int:
        """What stays in RAM: the rest of the weights and KV cache (the compute buffer too
        when nothing is offloaded)."""
        if n_gpu <= 0:
            return self.resident + self.compute
        return int(self.resident - self._moved(n_gpu, n_cpu_moe) - self.output_moved)

    def reads(self, n_gpu: int, n_cpu_moe: int) -> tuple[int, int]:
        """The weights one token reads on the GPU and in RAM: every shared byte, and its
        chosen experts' share of each layer's experts, on the side that holds them."""
        on_gpu = set(self.gpu_layers(n_gpu))
        experts_on_gpu = set(self.experts_on_gpu(n_gpu, n_cpu_moe))
        gpu = sum(self.shared[i] for i in on_gpu) + self.read_share * sum(self.experts[i] for i in experts_on_gpu)
        everything = sum(self.shared) + self.read_share * sum(self.experts) + self.output
        gpu += self.output if n_gpu > 0 else 0
        return int(gpu), int(everything - gpu)

    def fit(self, usable: int, n_gpu: int | None, n_cpu_moe: int | None) -> tuple[int, int]:
        """(n_gpu_layers, n_cpu_moe) for `usable` bytes of GPU: each as given, or where None
        chosen as --fit chooses. Every layer's shared weights first, with as few layers'
        experts left in RAM as fit beside them; where even those do not all fit, every
        expert stays in RAM and the last layers that fit go (none: n_cpu_moe 0)."""
        top, n = self.n_layer + 1, self.n_layer
        if n_gpu is not None:  # the layers as asked: as few layers' experts in RAM as fit beside them
            if n_cpu_moe is None:
                n_cpu_moe = next((c for c in range(n + 1) if self.gpu_bytes(n_gpu, c) <= usable), n)
            return n_gpu, n_cpu_moe
        if n_cpu_moe is None:
            fewest = next((c for c in range(n + 1) if self.gpu_bytes(top, c) <= usable), None)
            if fewest is not None:
                return top, fewest
        keep = n if n_cpu_moe is None else n_cpu_moe
        n_gpu = next((k for k in range(top, 0, -1) if self.gpu_bytes(k, keep) <= usable), 0)
        return n_gpu, keep if n_gpu or n_cpu_moe is not None else 0
