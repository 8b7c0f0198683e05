"""The C kernels' low-bit block types (native/c/lowbit.c): Q2_K, Q3_K, IQ4_NL, IQ4_XS, MXFP4 and BF16.

Products are checked against gguf-py's dequantizer (llama.cpp's own format code): the tight
reference is dequant(W) @ (x as the kernel quantizes it: Q8_K for Q2_K/Q3_K/IQ4_XS, Q8_0
for IQ4_NL and MXFP4, floats for BF16) in float64, for 1 to 17 activation rows, through the installed
build, an AVX2-only build and a portable one. A row's result must not depend on the rows
beside it, bit for bit (a speculative verify equals decoding). Weights are random blocks
and blocks from llama.cpp's own quantizer (ggml_quantize_chunk).

End to end: llama.cpp makes Q2_K, Q3_K_M, IQ4_XS and BF16 files from the embedded model's
F32 (and a "pure" Q2_K: SmolLM2's 576-wide rows are no multiple of 256, so llama.cpp's
Q2_K mix holds no Q2_K tensor at all, only Q3_K, Q4_0 and Q8_0), and the native engine's
greedy text and logits are held to llama.cpp's, within llama.cpp's own agreement between
its two attention paths, as tests/native/test_native_vs_llamacpp.py does.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np
import pytest
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType as Q, GGUFReader

from localinfer.backends.base import Batch, LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.backends.native import NativeBackend
from localinfer.engine.engine import Engine
from localinfer.engine.types import SamplingParams
from localinfer.modelfile import inspect
from localinfer_native import kernel_types
from localinfer_native.c_kernels import CKernels
from localinfer_native.types import C_TYPES, QMatrix
from localinfer_quant.mxfp4 import dequantize_mxfp4
from tests.native.blocks import E8M0_FIELDS, F16_FIELDS, dequantized, random_qmatrix
from tests.native.test_c_kernels import q8_0_values, q8_k_values  # also: the C library must load
from tests.native.test_native_vs_llamacpp import N_CTX, PROMPTS, TEXT, agreement, forced_logits, llama_cpp_without_flash_attention

from ..conftest import THREADS, complete_together

LOWBIT = [Q.Q2_K, Q.Q3_K, Q.IQ4_NL, Q.IQ4_XS, Q.MXFP4, Q.BF16]
Q8K_TYPES = {Q.Q2_K, Q.Q3_K, Q.IQ4_XS}
N_ROWS = (1, 2, 3, 5, 8, 17)


# ------------------------------------------------------------------ builds and blocks


def cols_for(qtype: Q) -> list[int]:
    """Q8_K types: 1 to 6 super-blocks. IQ4_NL and MXFP4: 576 (two octets of blocks and a
    pair), 1536, and tails of 1 to 5 blocks after the octets (an odd last block lies
    unpaired). BF16: lengths that leave 8-value and scalar tails."""
    if qtype in Q8K_TYPES:
        return [256, 512, 1536]
    return [576, 1536, 32, 96, 288, 416] if qtype in (Q.IQ4_NL, Q.MXFP4) else [576, 1536, 96, 100, 7]


def activation_values(qtype: Q, x: np.ndarray) -> np.ndarray:
    """x as the kernel sees it, float64"""
    if qtype == Q.BF16:
        return x.astype(np.float64)
    return q8_k_values(x) if qtype in Q8K_TYPES else q8_0_values(x)


def check(m: QMatrix, x: np.ndarray, y: np.ndarray) -> None:
    """y (the kernel's [n, rows]) against the exact product with the quantized activations,
    and against the float product within the bound the activations' rounding allows."""
    w = dequantized(m)
    xq = activation_values(m.type, x)
    scale = np.abs(xq) @ np.abs(w).T + 1e-30
    err = np.abs(y - xq @ w.T) / scale
    where = np.unravel_index(err.argmax(), err.shape)
    assert err.max() < 2e-5, f"{m.type.name} {m.rows}x{m.cols}, n={len(x)}: worst relative error {err.max():.2e} at {where}"
    if m.type != Q.BF16:
        block = 256 if m.type in Q8K_TYPES else 32
        amax = np.abs(x.astype(np.float64)).reshape(len(x), -1, block).max(axis=2)
        half_step = np.repeat(amax / 127 / 2 * 1.001, block, axis=1)  # fp16 scales round up a little
        assert np.all(np.abs(y - x.astype(np.float64) @ w.T) <= half_step @ np.abs(w).T + 1e-5 * scale)


def run(kernels: CKernels, mats: list[QMatrix], x: np.ndarray) -> list[np.ndarray]:
    outs = [np.full((len(x), m.rows), np.nan, np.float32) for m in mats]
    kernels.matmul_op(mats)(x, outs)
    return outs


def activations(rng: np.random.Generator, n: int, cols: int) -> np.ndarray:
    x = rng.standard_normal((n, cols)).astype(np.float32)
    x[:, :32] *= 30  # one block with much larger values than the others
    return x


# ------------------------------------------------------------------ products


@pytest.mark.parametrize("qtype", LOWBIT, ids=lambda t: t.name)
def test_products_against_gguf(kernels: CKernels, qtype: Q) -> None:
    rng = np.random.default_rng(int(qtype))
    for cols in cols_for(qtype):
        m = random_qmatrix(qtype, 75, cols, rng)  # 75 rows: the threads' split is not aligned
        for n in N_ROWS:
            x = activations(rng, n, cols)
            (y,) = run(kernels, [m], x)
            check(m, x, y)


@pytest.mark.parametrize("qtype", LOWBIT, ids=lambda t: t.name)
def test_rows_never_depend_on_the_rows_beside_them(kernels: CKernels, qtype: Q) -> None:
    """Every tile size sums a row in the same order: each row of a 17-row product (tiles of
    8, 4 and 1, or 4 and 1) equals that row alone, and every shorter run of rows agrees."""
    rng = np.random.default_rng(100 + int(qtype))
    for cols in cols_for(qtype)[:3]:
        m = random_qmatrix(qtype, 40, cols, rng)
        x = activations(rng, max(N_ROWS), cols)
        (full,) = run(kernels, [m], x)
        for n in N_ROWS:
            for j in range(0, len(x) - n + 1, n):
                (part,) = run(kernels, [m], x[j : j + n])
                np.testing.assert_array_equal(part.view(np.uint32), full[j : j + n].view(np.uint32), err_msg=f"{qtype.name} {cols} rows {j}..{j + n}")


@pytest.mark.parametrize("qtype", [t for t in LOWBIT if t != Q.BF16], ids=lambda t: t.name)
def test_extreme_blocks(kernels: CKernels, qtype: Q) -> None:
    """Every byte 0x00, 0xFF or alternating (the largest values and scales of either sign)
    against saturated activations: no int16 sum may overflow."""
    block, size = GGML_QUANT_SIZES[qtype]
    cols = 4 * 256
    raw = np.empty((3, cols // block, size), np.uint8)
    raw[0], raw[1], raw[2] = 0x00, 0xFF, 0x5A
    for offset in F16_FIELDS[qtype]:
        raw[:, :, offset : offset + 2] = np.frombuffer(np.float16(0.01).tobytes(), np.uint8)
    for offset in E8M0_FIELDS.get(qtype, []):  # 0xFF would be 2^127: infinite products
        raw[:, :, offset] = 121  # 2^-7
    m = QMatrix.from_array(qtype, raw.reshape(3, -1), cols)
    for x in (np.full(cols, 3.0, np.float32), np.full(cols, -3.0, np.float32), np.tile(np.array([3.0, -3.0], np.float32), cols // 2)):
        xs = np.repeat(x[None], 5, axis=0)
        check(m, xs, run(kernels, [m], xs)[0])


def test_mxfp4_at_every_exponent(kernels: CKernels) -> None:
    """Row e (0..250) has every block at E8M0 exponent e, so each scale 2^(e - 128) is decoded
    once, the float32 subnormals 2^-128 and 2^-127 (e < 2) included, by the row dots and (rows
    past 16) the panels alike. The activations are large against the small scales and small
    against the large ones, so every product stays a normal float32; exponents past 250 are
    left out because their products with any activation ggml's Q8_0 holds reach infinity."""
    rng = np.random.default_rng(39)
    cols, exponents = 288, np.arange(251)
    raw = random_qmatrix(Q.MXFP4, len(exponents), cols, rng).data.reshape(len(exponents), -1, 17).copy()
    raw[:, :, 0] = exponents[:, None]
    x = rng.standard_normal((3, cols)).astype(np.float32)
    for rows, xs in ((exponents < 128, x * 2.0**18), (exponents >= 128, x * 2.0**-7)):
        m = QMatrix.from_array(Q.MXFP4, raw[rows].reshape(int(rows.sum()), -1), cols)
        w = dequantized(m)
        assert np.array_equal(w, dequantize_mxfp4(raw[rows].reshape(-1, 17)).astype(np.float64).reshape(w.shape))  # gguf-py's == ours
        xq = activation_values(Q.MXFP4, xs)
        err = np.abs(run(kernels, [m], xs)[0] - xq @ w.T) / (np.abs(xq) @ np.abs(w).T)
        assert err.max() < 2e-5, f"worst relative error {err.max():.2e} at exponent {exponents[rows][err.max(axis=0).argmax()]}"


@pytest.fixture(scope="module")
def model_weights(f32_path: Path) -> dict[int, np.ndarray]:
    """Real weights of the embedded model by row length: 96 rows of ffn_down (1536) and of attn_q (576)."""
    tensors = {t.name: t for t in GGUFReader(f32_path).tensors}
    return {cols: np.array(tensors[name].data[:96], np.float32) for cols, name in ((1536, "blk.0.ffn_down.weight"), (576, "blk.0.attn_q.weight"))}


@pytest.mark.parametrize("qtype", LOWBIT, ids=lambda t: t.name)
def test_blocks_from_llama_cpps_quantizer(kernels: CKernels, qtype: Q, ggml_quantize, model_weights) -> None:
    rng = np.random.default_rng(7)
    for cols, w in model_weights.items():
        if cols % GGML_QUANT_SIZES[qtype][0]:
            continue
        m = ggml_quantize(qtype, w)
        for n in (1, 5):
            x = (rng.standard_normal((n, cols)) * rng.uniform(0.1, 3.0, cols)).astype(np.float32)
            check(m, x, run(kernels, [m], x)[0])


def test_declares_its_types() -> None:
    """The engine's capabilities (kernel_types) report every type the C set runs, MXFP4 among them."""
    assert set(LOWBIT) <= CKernels.supported_types == kernel_types("c")


def test_fused_with_the_other_types(ggml_quantize) -> None:
    """One op over matrices of three activation formats (Q8_K, q8a, floats) and old and new
    types: each output is the one its matrix gives alone, bit for bit."""
    kc = CKernels(threads=2)
    rng = np.random.default_rng(3)
    for cols, types in ((512, [Q.Q2_K, Q.Q4_K, Q.IQ4_XS]), (512, [Q.Q3_K, Q.IQ4_NL, Q.BF16]), (576, [Q.IQ4_NL, Q.Q4_0, Q.BF16]), (512, [Q.MXFP4, Q.Q4_K, Q.IQ4_NL])):
        mats = [ggml_quantize(t, rng.standard_normal((rows, cols))) for t, rows in zip(types, (40, 24, 56))]
        for n in (1, 17):
            x = activations(rng, n, cols)
            fused = run(kc, mats, x)
            for m, y in zip(mats, fused):
                np.testing.assert_array_equal(y.view(np.uint32), run(kc, [m], x)[0].view(np.uint32), err_msg=m.type.name)


# ------------------------------------------------------------------ end to end, against llama.cpp


# (name, llama.cpp's ftype, pure, a type the file must hold)
FILES = [("Q2_K", "Q2_K", False, Q.Q3_K), ("Q2_K-pure", "Q2_K", True, Q.Q2_K), ("Q3_K_M", "Q3_K_M", False, Q.Q4_K),
         ("IQ4_XS", "IQ4_XS", False, Q.IQ4_XS), ("BF16", "BF16", False, Q.BF16)]  # fmt: skip
N_GREEDY = 32


@pytest.fixture(scope="module", params=FILES, ids=[f[0] for f in FILES])
def lowbit_file(request, f32_path: Path, tmp_path_factory) -> Path:
    """The file llama.cpp's quantizer makes from the embedded model's F32; every type in it runs natively."""
    import llama_cpp

    name, ftype, pure, must_hold = request.param
    path = tmp_path_factory.mktemp("lowbit") / f"smollm2-135m-{name}.gguf"
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = getattr(llama_cpp, f"LLAMA_FTYPE_MOSTLY_{ftype}")
    params.pure = pure  # every matrix in the file's type (where its rows allow)
    params.nthread = THREADS
    assert llama_cpp.llama_model_quantize(str(f32_path).encode(), str(path).encode(), ctypes.byref(params)) == 0
    types = inspect(path).tensor_types
    print(f"\n{name}: {types}")
    assert must_hold.name in types, types
    assert {Q[t] for t in types} <= C_TYPES, types
    return path


def greedy(engine: Engine) -> dict[str, tuple[list[int], list[int]]]:
    """prompt -> (its tokens, the 32 greedy tokens that follow): the prompts together, as many
    at once as the engine has slots (a row's logits do not depend on the rows beside it)."""
    params = SamplingParams(temperature=0, repeat_penalty=1.0, max_tokens=N_GREEDY)
    tokens = [engine.tokenize_prompt(engine.render_chat([{"role": "user", "content": prompt}])) for prompt in PROMPTS]
    done = complete_together(engine, [(t, params) for t in tokens])
    return {prompt: (t, out.tokens) for prompt, t, out in zip(PROMPTS, tokens, done)}


@pytest.fixture(scope="module")
def reference(lowbit_file: Path):
    """llama.cpp on the file (its defaults: flash attention on): greedy answers, forced logits,
    and its own spread (flash attention off vs on) on the forced text."""
    backend = LlamaCppBackend.load(lowbit_file, LoadParams(n_ctx=N_CTX, n_threads=THREADS))
    try:
        tokens = backend.tokenize(TEXT, add_special=False)[:256]
        logits = forced_logits(backend, tokens)
        spread = agreement(llama_cpp_without_flash_attention(lowbit_file, tokens), logits)
        answers = greedy(Engine(backend))  # the engine is not used again: its cached prefixes may go
        yield backend, answers, tokens, logits, spread
    finally:
        backend.close()


# The Numba set end to end on one file that holds two of its new quantized types (IQ4_NL and
# IQ4_XS); test_numba_lowbit.py checks every type's products. Each file's mix of types is a
# fresh Numba compile of 20-35 s on a cold cache (a fresh clone), which the suite's time
# cannot afford for all five (Q2_K-pure's was the second: 22 s of a fresh-clone CI run).
NUMBA_FILES = ("IQ4_XS",)


def runs_here(kernels: str, path: Path) -> bool:
    if kernels == "c":
        return True
    from localinfer_native.numba_kernels import NumbaKernels

    wanted = any(path.name == f"smollm2-135m-{name}.gguf" for name in NUMBA_FILES)
    return wanted and {Q[t] for t in inspect(path).tensor_types} <= NumbaKernels.supported_types


def largest_parting(theirs: np.ndarray, ours: np.ndarray) -> float:
    """Where the top tokens differ, the largest gap in llama.cpp's logits between its top
    token and ours (0: they never differ). theirs, ours: [n, vocab]."""
    a, b = theirs.argmax(axis=1), ours.argmax(axis=1)
    rows = np.flatnonzero(a != b)
    return float((theirs[rows, a[rows]] - theirs[rows, b[rows]]).max()) if len(rows) else 0.0


def greedy_partings(backend: LlamaCppBackend, answers: dict, ours: dict) -> list[tuple[str, int, float]]:
    """(prompt, token index, llama.cpp's margin there) where our greedy answer leaves llama.cpp's"""
    out = []
    for prompt, (prompt_tokens, want) in answers.items():
        got = ours[prompt][1]
        i = next((i for i, (a, b) in enumerate(zip(want, got)) if a != b), None)
        if i is not None:
            backend.kv_clear(0)
            logits = backend.forward(Batch.for_sequence(prompt_tokens + want[:i], 0))[0]
            out.append((prompt, i, float(logits[want[i]] - logits[got[i]])))
    return out


@pytest.mark.parametrize("kernels", ["c", "numba"])
def test_native_agrees_with_llama_cpp(kernels: str, lowbit_file: Path, reference, record_property) -> None:
    """Teacher-forced logits about as close to llama.cpp's as its two attention paths are to
    each other (mean |diff| within 1.5x), and top tokens, forced or greedy, that leave llama.cpp's
    only where its own top two lie closer than its two paths move a logit (max |diff|). At 2 to
    4 bits this small model has many near-ties, so a count of top-1 agreements over 256 tokens
    swings by a few tokens with any change of rounding; each parting is held to be a tie instead."""
    if not runs_here(kernels, lowbit_file):
        pytest.skip(f"the {kernels} kernels run end to end on {', '.join(NUMBA_FILES)} only (see NUMBA_FILES)")
    backend, answers, tokens, theirs, (self_top1, self_mean, self_worst) = reference
    native = NativeBackend.load(lowbit_file, LoadParams(n_ctx=N_CTX, n_threads=THREADS, kernels=kernels, n_seq_max=len(PROMPTS)))
    try:
        forced = forced_logits(native, tokens)
        ours = greedy(Engine(native, slots=len(PROMPTS)))
    finally:
        native.close()
    top1, mean, worst = agreement(forced, theirs)
    parting = largest_parting(theirs, forced)
    partings = greedy_partings(backend, answers, ours)
    line = (f"{lowbit_file.name} [{kernels}]: top-1 {top1:.4f} (largest llama.cpp margin where it differs {parting:.3f}), "
            f"mean |diff| {mean:.4f}, max {worst:.4f} | llama.cpp's own spread: top-1 {self_top1:.4f}, mean |diff| "
            f"{self_mean:.4f}, max {self_worst:.4f}\n  greedy answers identical: {len(answers) - len(partings)} of {len(answers)}")  # fmt: skip
    line += "".join(f"\n  {p!r}: parts at token {i}, llama.cpp's margin {m:.3f}" for p, i, m in partings)
    print(f"\n{line}")
    record_property("agreement", line)
    assert mean <= 1.5 * self_mean, line
    assert parting <= self_worst, line
    assert all(m <= self_worst for _, _, m in partings), line
