"""A mixture of experts' FFN over any kernel set's products, in llama.cpp's order
(build_moe_ffn): the Numba set's moe_op, and the reference the C set's moe.c is tested
against.

The router picks each row's experts; each chosen expert then runs its gate/up and down
products once, over all the rows that chose it (each expert's slice of the stacked
tensors, bound once as a product of its own), so a token reads only its experts'
weights; the weighted results are summed in the router's order. Every product's rows are
independent (the kernels' contract), each row is routed alone, and its sum runs in a
fixed order, so a row's result never depends on the rows beside it: a speculative
verify still equals decoding.
"""

from __future__ import annotations

import numpy as np

from localinfer_native import Kernels
from localinfer_native.types import MoeFFN

# ggml_clamp's floor on the sum of the chosen weights before they are divided by it
WEIGHT_SUM_FLOOR = np.float32(6.103515625e-5)


def route_softmax_norm(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's k experts and their weights, as llama.cpp routes qwen3moe: a softmax over
    every expert (ggml's: exp(x - max) in float32, the sum in double, times 1/sum), the k
    most probable in descending order (ties to the lower id), their probabilities divided
    by their sum (in double, rounded, at least WEIGHT_SUM_FLOOR). logits [n, n_expert];
    returns ids int64 [n, k] and weights float32 [n, k]."""
    e = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = e * (1.0 / e.sum(axis=1, dtype=np.float64)).astype(np.float32)[:, None]
    ids = np.argsort(-p, axis=1, kind="stable")[:, :k]
    w = np.take_along_axis(p, ids, axis=1)
    total = np.maximum(w.sum(axis=1, dtype=np.float64).astype(np.float32), WEIGHT_SUM_FLOOR)
    return ids, w / total[:, None]


def route_topk_softmax(logits: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """As llama.cpp routes gpt-oss: the k largest logits in descending order (ties to the
    lower id), then a softmax over those k alone (ggml's, as above)."""
    ids = np.argsort(-logits, axis=1, kind="stable")[:, :k]
    chosen = np.take_along_axis(logits, ids, axis=1)
    e = np.exp(chosen - chosen[:, :1])
    return ids, e * (1.0 / e.sum(axis=1, dtype=np.float64)).astype(np.float32)[:, None]


ROUTERS = {"softmax_norm": route_softmax_norm, "topk_softmax": route_topk_softmax}

SWIGLU_OAI_ALPHA, SWIGLU_OAI_LIMIT = np.float32(1.702), np.float32(7.0)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> None:
    """gate = gpt-oss's clamped SwiGLU, in place, as ggml computes it: x = min(g, 7),
    y = clamp(u, -7, 7), x / (1 + e^(-1.702 x)) * (y + 1) (an infinite e^ gives -0)."""
    x = np.minimum(gate, SWIGLU_OAI_LIMIT)
    y = np.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    with np.errstate(over="ignore"):
        gate[:] = x / (np.float32(1) + np.exp(SWIGLU_OAI_ALPHA * -x)) * (y + np.float32(1))


class MixtureOfExperts:
    """One layer's experts, each bound once to the kernel set; called as the FFN:
    `moe(h, out, n_fast)` writes out [n, n_embd] from the normed input h [n, n_embd]."""

    def __init__(self, ffn: MoeFFN, kernels: Kernels) -> None:
        if ffn.gating not in ROUTERS:
            raise ValueError(f"no router '{ffn.gating}'")
        activations = {"swiglu": kernels.swiglu, "geglu": kernels.geglu, "swiglu_oai": swiglu_oai}
        if ffn.activation not in activations:
            raise ValueError(f"no expert activation '{ffn.activation}'")
        self.ffn, self.route, self.k, self.activate = ffn, ROUTERS[ffn.gating], ffn.n_used, activations[ffn.activation]
        self.n_expert, self.n_ff = ffn.n_expert, ffn.gate.rows // ffn.n_expert
        self.router = kernels.matmul_op([ffn.router])
        self.gate_up = [kernels.matmul_op([ffn.expert(ffn.gate, e), ffn.expert(ffn.up, e)]) for e in range(ffn.n_expert)]
        self.down = [kernels.matmul_op([ffn.expert(ffn.down, e)]) for e in range(ffn.n_expert)]

    def __call__(self, h: np.ndarray, out: np.ndarray, n_fast: int = 0) -> None:
        n, k, ffn = len(h), self.k, self.ffn
        logits = np.empty((n, self.n_expert), np.float32)
        self.router(h, (logits,))  # every row the decode path's way: a prompt row routes as it would alone
        if ffn.router_bias is not None:
            logits += ffn.router_bias
        ids, weights = self.route(logits, k)
        # The (row, slot) pairs grouped by expert, rows ascending within each group: a
        # group's rows < n_fast (prompt rows, first in the batch) lead it, as the fast path needs.
        pairs = np.argsort(ids.ravel(), kind="stable")
        bounds = np.concatenate(([0], np.cumsum(np.bincount(ids.ravel(), minlength=self.n_expert))))
        slots = np.empty((n, k, h.shape[1]), np.float32)  # each slot's weighted expert output
        gate, up = np.empty((n, self.n_ff), np.float32), np.empty((n, self.n_ff), np.float32)
        for e in np.flatnonzero(np.diff(bounds)):
            chosen = pairs[bounds[e] : bounds[e + 1]]
            rows, slot = chosen // k, chosen % k
            m, fast = len(rows), int(np.searchsorted(rows, n_fast))
            y = np.empty((m, h.shape[1]), np.float32)
            self.gate_up[e](h[rows], (gate[:m], up[:m]), fast)
            if ffn.gate_bias is not None:
                gate[:m] += ffn.gate_bias[e]
            if ffn.up_bias is not None:
                up[:m] += ffn.up_bias[e]
            self.activate(gate[:m], up[:m])
            self.down[e](gate[:m], (y,), fast)
            if ffn.down_bias is not None:
                y += ffn.down_bias[e]
            slots[rows, slot] = y * weights[rows, slot][:, None]  # ggml_mul: rounded before the sum
        out[:] = slots[:, 0]
        for j in range(1, k):  # ggml_add slot after slot
            out += slots[:, j]
