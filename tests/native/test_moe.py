"""A mixture of experts' FFN (moe_op) in every kernel set against a float64 reference.

The reference dequantizes the weights with gguf-py and routes, runs and sums the experts
in float64, as llama.cpp's build_moe_ffn orders them. The kernels quantize activations to
8 bits before their integer dots (into gate/up, and again into down), so the reference
rounds them the same way (test_c_kernels' activation_values): what is left is float32
rounding, and an 8-bit step where float32 and float64 round an activation to different
sides of a half. The C op is also held to moe.py's loop over the same set's products,
within float32 rounding of the softmax. The router here is steered: its rows are scaled unit vectors, so a
row's logits are chosen coordinates of x, far apart, and the reference and the kernels pick
the same experts (a near tie would make any comparison a coin toss).
"""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as Q

from localinfer_native.moe import MixtureOfExperts
from localinfer_native.types import MoeFFN, QMatrix
from tests.native.blocks import dequantized, random_qmatrix
from tests.native.test_c_kernels import activation_values

N_EMBD, N_FF, N_EXPERT = 256, 256, 8


def steered_router(scale: float = 1.0) -> QMatrix:
    """Router row e = scale * unit vector e: a row's logit for expert e is scale * x[e]."""
    return QMatrix.from_array(Q.F32, np.eye(N_EXPERT, N_EMBD, dtype=np.float32) * scale, N_EMBD)


def make_ffn(qtype: Q, gating: str, seed: int, biases: bool = False, activation: str = "swiglu", n_used: int = 2) -> MoeFFN:
    rng = np.random.default_rng(seed)

    def bias(*shape: int) -> np.ndarray | None:
        return (rng.standard_normal(shape) * 0.5).astype(np.float32) if biases else None

    return MoeFFN(
        router=steered_router(), gate=random_qmatrix(qtype, N_EXPERT * N_FF, N_EMBD, rng),
        up=random_qmatrix(qtype, N_EXPERT * N_FF, N_EMBD, rng), down=random_qmatrix(qtype, N_EXPERT * N_EMBD, N_FF, rng),
        n_expert=N_EXPERT, n_used=n_used, gating=gating, activation=activation,
        router_bias=(np.arange(N_EXPERT) * 0.01).astype(np.float32) if biases else None,
        gate_bias=bias(N_EXPERT, N_FF), up_bias=bias(N_EXPERT, N_FF), down_bias=bias(N_EXPERT, N_EMBD),
    )  # fmt: skip


def rows_with_scores(scores: np.ndarray, seed: int) -> np.ndarray:
    """Activation rows whose first N_EXPERT values are `scores` (the router's logits) and
    the rest noise of a normed hidden state's size."""
    x = np.random.default_rng(seed).standard_normal((len(scores), N_EMBD)).astype(np.float32)
    x[:, :N_EXPERT] = scores
    return x


def every_expert_rows() -> np.ndarray:
    """8 rows; row r ranks the experts (r + 7) % 8 first, (r + 6) % 8 second, ...: every
    expert is chosen, each by two rows, by logit margins of 0.5."""
    return rows_with_scores(np.array([[((e - r) % N_EXPERT) * 0.5 for e in range(N_EXPERT)] for r in range(N_EXPERT)]), 1)


def few_expert_rows() -> np.ndarray:
    """7 rows that choose among experts 0-2 only: experts 3-7 get no row."""
    scores = np.array([[(1.5 if e == r % 3 else 1.0 if e == (r + 1) % 3 else -0.5 * e) for e in range(N_EXPERT)] for r in range(7)])
    return rows_with_scores(scores, 2)


def swiglu64(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    return g / (1 + np.exp(-g)) * u


def swiglu_oai64(g: np.ndarray, u: np.ndarray) -> np.ndarray:
    x, y = np.minimum(g, 7.0), np.clip(u, -7.0, 7.0)
    with np.errstate(over="ignore"):
        return x / (1 + np.exp(-1.702 * x)) * (y + 1)


def reference(ffn: MoeFFN, x: np.ndarray) -> np.ndarray:
    """float64 build_moe_ffn: route, run each row's experts, sum the weighted outputs."""
    x = x.astype(np.float64)
    logits = x @ dequantized(ffn.router).T + (ffn.router_bias if ffn.router_bias is not None else 0)
    gate, up, down = (dequantized(m).reshape(ffn.n_expert, -1, m.cols) for m in (ffn.gate, ffn.up, ffn.down))
    act = {"swiglu": swiglu64, "swiglu_oai": swiglu_oai64}[ffn.activation]
    out = np.zeros_like(x)
    for r, row in enumerate(logits):
        if ffn.gating == "softmax_norm":
            p = np.exp(row - row.max())
            p /= p.sum()
            ids = np.argsort(-p, kind="stable")[: ffn.n_used]
            w = p[ids] / p[ids].sum()
        else:
            ids = np.argsort(-row, kind="stable")[: ffn.n_used]
            w = np.exp(row[ids] - row[ids].max())
            w /= w.sum()
        xq = activation_values(ffn.gate.type, x[r : r + 1])[0]
        for e, we in zip(ids, w):
            g, u = gate[e] @ xq, up[e] @ xq
            if ffn.gate_bias is not None:
                g, u = g + ffn.gate_bias[e], u + ffn.up_bias[e]
            a = activation_values(ffn.down.type, act(g, u)[None].astype(np.float32))[0]
            y = down[e] @ a + (ffn.down_bias[e] if ffn.down_bias is not None else 0)
            out[r] += we * y
    return out


def run(op, x: np.ndarray, n_fast: int = 0) -> np.ndarray:
    out = np.empty_like(x)
    op(x, out, n_fast)
    return out


CASES = [
    (Q.F32, "softmax_norm", False, "swiglu"),
    (Q.Q8_0, "softmax_norm", False, "swiglu"),
    (Q.Q4_K, "softmax_norm", False, "swiglu"),
    (Q.Q8_0, "topk_softmax", True, "swiglu_oai"),  # gpt-oss's: biases everywhere
    (Q.Q4_K, "topk_softmax", True, "swiglu_oai"),
]


@pytest.mark.parametrize("rows", [every_expert_rows, few_expert_rows], ids=["every-expert", "idle-experts"])
@pytest.mark.parametrize("qtype,gating,biases,activation", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_moe_op_matches_the_float64_reference(every_kernel_set, rows, qtype, gating, biases, activation, record_property):
    ffn = make_ffn(qtype, gating, seed=int(qtype) + 7 * biases, biases=biases, activation=activation)
    x = rows()
    got, want = run(every_kernel_set.moe_op(ffn), x), reference(ffn, x)
    diff = np.abs(got - want)
    record_property("max_abs_diff", float(diff.max()))
    # float32 sums of 256 products (~1e-6 relative) and, rarely, an activation one 8-bit
    # step away (1/127 of its block's largest value, times one weight column). Numba's
    # legacy dots scale x's 32-value blocks their own way (each product within ~3e-4 of
    # the one with gguf's Q8_0 values: test_numba_kernels), so they get that much more.
    loose = every_kernel_set.name == "numba" and qtype == Q.Q8_0
    worst, mean = (8e-3, 2e-3) if loose else (2e-3, 2e-4)
    assert np.isfinite(got).all()
    assert diff.max() <= worst * np.abs(want).max(), (diff.max(), np.abs(want).max())
    assert diff.mean() <= mean * np.abs(want).mean(), (diff.mean(), np.abs(want).mean())


@pytest.mark.parametrize("qtype,gating,biases,activation", CASES, ids=lambda v: getattr(v, "name", str(v)))
def test_c_op_equals_moe_py_over_the_same_products(kernels, qtype, gating, biases, activation):
    """moe.c and moe.py's loop share the products and their rounding; only the softmax's
    exponentials (libm's expf against numpy's) and the order of float32 adds may differ."""
    ffn = make_ffn(qtype, gating, seed=3, biases=biases, activation=activation)
    for x in (every_expert_rows(), few_expert_rows()):
        got, loop = run(kernels.moe_op(ffn), x), run(MixtureOfExperts(ffn, kernels), x)
        np.testing.assert_allclose(got, loop, rtol=0, atol=2e-5 * np.abs(loop).max())


@pytest.mark.parametrize("qtype", [Q.F32, Q.Q4_K, Q.Q8_0])
def test_each_row_alone_equals_its_row_in_the_batch(every_kernel_set, qtype):
    """Speculation verifies a draft as a batch: every row must be what decoding it alone
    gives, bit for bit, whichever rows share its experts."""
    op = every_kernel_set.moe_op(make_ffn(qtype, "softmax_norm", seed=5))
    x = np.concatenate([every_expert_rows(), few_expert_rows()])
    batch = run(op, x)
    for r in range(len(x)):
        np.testing.assert_array_equal(run(op, x[r : r + 1]), batch[r : r + 1])


def test_tied_logits_go_to_the_lower_expert(every_kernel_set):
    """Experts 3 and 5 get the same logit: top-1 takes 3, as ggml's argsort leaves them."""
    base = make_ffn(Q.Q8_0, "softmax_norm", seed=11, n_used=1)
    router = np.eye(N_EXPERT, N_EMBD, dtype=np.float32)
    router[5] = router[3]
    ffn = MoeFFN(**{**base.__dict__, "router": QMatrix.from_array(Q.F32, router, N_EMBD)})
    x = rows_with_scores(np.array([[0, 0, 0, 2.0, 0, 0, 0, 0]]), 4)
    got = run(every_kernel_set.moe_op(ffn), x)
    as3, as5 = (reference(MoeFFN(**{**base.__dict__, "router": steered_router()}), rows_with_scores(s, 4))
                for s in (np.array([[0, 0, 0, 2.0, 0, 0, 0, 0]]), np.array([[0, 0, 0, 0, 0, 2.0, 0, 0]])))  # fmt: skip
    assert np.abs(got - as3).max() < 0.02 * np.abs(as3).max() < np.abs(got - as5).max()


def test_swiglu_oai_clamps_as_ggml(every_kernel_set):
    """gpt-oss's activation at its edges: gate above the limit 7 (clamped), far below zero
    (e^ overflows: the result is -0, not NaN), up beyond +-7 (clamped both ways). One
    expert's gate and up read x[0] alone and its down is the identity, so the output is
    the activation itself."""
    g = np.array([-300, -200, -88, -20, -1, 0, 0.5, 1, 6.9, 7, 7.5, 50, 300] + [3] * 19, np.float32)
    u = np.array([2, -9, 9, 1, -7.5, 3, 7.5, -1, 0.5, 20, -20, 1, 1] + [2] * 19, np.float32)
    eye = np.eye(32, dtype=np.float32)
    stack = lambda m: QMatrix.from_array(Q.F32, np.concatenate([m, m]), 32)  # noqa: E731
    ffn = MoeFFN(router=QMatrix.from_array(Q.F32, np.eye(2, 32, dtype=np.float32) * 5, 32),
                 gate=stack(np.outer(g, eye[0])), up=stack(np.outer(u, eye[0])), down=stack(eye),
                 n_expert=2, n_used=1, gating="softmax_norm", activation="swiglu_oai")  # fmt: skip
    x = eye[:1].copy()
    got = run(every_kernel_set.moe_op(ffn), x)[0]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, swiglu_oai64(g.astype(np.float64), u.astype(np.float64)), rtol=2e-6, atol=1e-30)
