"""A mixture of experts' FFN over a kernel set, in llama.cpp's order (build_moe_ffn).

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


ROUTERS = {"softmax_norm": route_softmax_norm}


class MixtureOfExperts:
    """One layer's experts, each bound once to the kernel set; called as the FFN:
    `moe(h, out, n_fast)` writes out [n, n_embd] from the normed input h [n, n_embd]."""

    def __init__(self, ffn: MoeFFN, kernels: Kernels) -> None:
        if ffn.gating not in ROUTERS:
            raise ValueError(f"no router '{ffn.gating}'")
        self.route, self.k, self.swiglu = ROUTERS[ffn.gating], ffn.n_used, kernels.swiglu
        self.n_expert, self.n_ff = ffn.n_expert, ffn.gate.rows // ffn.n_expert
        self.router = kernels.matmul_op([ffn.router])
        self.gate_up = [kernels.matmul_op([ffn.expert(ffn.gate, e), ffn.expert(ffn.up, e)]) for e in range(ffn.n_expert)]
        self.down = [kernels.matmul_op([ffn.expert(ffn.down, e)]) for e in range(ffn.n_expert)]

    def __call__(self, h: np.ndarray, out: np.ndarray, n_fast: int = 0) -> None:
        n, k = len(h), self.k
        logits = np.empty((n, self.n_expert), np.float32)
        self.router(h, (logits,))  # every row the decode path's way: a prompt row routes as it would alone
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
            self.swiglu(gate[:m], up[:m])
            self.down[e](gate[:m], (y,), fast)
            slots[rows, slot] = y * weights[rows, slot][:, None]  # ggml_mul: rounded before the sum
        out[:] = slots[:, 0]
        for j in range(1, k):  # ggml_add slot after slot
            out += slots[:, j]
