"""Synthetic GGUFs of real models' shapes, with random weights, for benchmarks at real sizes
without the real models: a weight's value does not change how fast it is read or multiplied;
its shape and its block type do.

For each shape, an F16 source is written first (random normal weights, std 0.02; norms near
1; F32 vectors, as llama.cpp's converter writes them), one tensor at a time so memory stays
near the largest tensor (Llama-3.2-3B's embedding, 0.8 GB), not the model (6.4 GB). llama.cpp's
own quantizer (llama_model_quantize, as `localinfer quantize` runs it) then makes each
requested type from it, choosing per tensor exactly as for the real model (Q4_K_M keeps some
attn_v and ffn_down in Q6_K, a tied embedding becomes Q6_K, and so on). The architecture's
tensor names and metadata keys are llama.cpp's: q/k/v biases for qwen2, the llama3 RoPE
frequency factors (rope_freqs.weight) for Llama 3.2, per-head q/k norms for qwen3, gemma3's
post-norms and sliding window, phi3's fused q/k/v and gate/up with partial RoPE and its
long and short factors, no output.weight where the embedding is tied. The vocabulary is the embedded model's BPE tokenizer, or --tokenizer's (its tokens, merges, types and
special ids), padded to the shape's size with unused [PADn] tokens as llama.cpp's converter
pads Qwen's: both engines load it, tokenize and detokenize with it. Greedy text from random
weights repeats one token, so measure with speculation off (`bench model`'s default): every
prompt-lookup draft would be accepted, which no real model does.

Mixtures of experts: qwen3-30b-a3b (qwen3moe: 48 layers, 128 experts of which a token
takes 8, q/k norms, an untied output) and gpt-oss-20b (24 layers, 32 experts, top 4, biases,
attention sinks, a 128-position window on every other layer, YaRN RoPE) are made in their
real files' block types only, Q4_K_M and MXFP4_MOE (MXFP4 experts, Q8_0 attention), written
straight from pools of real blocks with no F16 source (bench/synthetic_moe.py says how);
--types does not apply to them. Whole, they take 18.6 and 12.1 GB.

Encoders: bert-base (BERT-base's shape: 12 layers, 768 wide, 3,072 FFN, 12 heads, 30,522
tokens, 512 positions, mean pooling; 109 M parameters, 0.22 GB at F16) for the embedding
benchmark, bench/embeddings.py, and bert-base-reranker (the same with rank pooling and
RoBERTa's classifier head, cls.*) for bench/rerank.py, and nomic-embed-text (nomic-bert:
RoPE, fused q/k/v, SwiGLU). bench/synthetic_bert.py gives its tensors and keys (llama.cpp's
converter's for a BERT) and its own WordPiece vocabulary, on which English text tokenizes;
--tokenizer does not apply to it. Its F16 source is quantized as every other shape's.

--layers N makes the first N layers of each shape instead (each layer its real size, the
embedding and the output matrix whole), NAME-LN-TYPE.gguf, for a disk or RAM too small for
the whole. Tokens per second then scale with the layer count: a token reads N layers' bytes
instead of all of them, so the layers' share of its time shrinks to N/L of the full model's
(the output matrix's share does not), and a speed measured on N of L layers is not the full
model's; scale it, and say so. --vocab N pads the tokenizer to N tokens instead of the
shape's vocabulary (NAME-VN-TYPE.gguf): a smaller embedding and output matrix, for tests.

Files are NAME-TYPE.gguf in --out (default: the user cache, ~/.cache/localinfer/bench-models
on Linux); a file that exists is skipped; every file is written under a temporary name and
renamed when whole. The F16 source (NAME-F16.gguf) is deleted after quantizing if this run
wrote it, unless --keep-source or F16 is among the types. The paths of the requested files
are printed on stdout, one a line. A full-size shape takes minutes of CPU and several GB of
disk (Llama-3.2-3B: a 6.4 GB source, 2.0 GB at Q4_K_M).

    .venv/bin/python bench/synthetic.py --list
    .venv/bin/python bench/synthetic.py qwen2.5-1.5b llama-3.2-3b [--types Q4_K_M,Q4_0,Q8_0] [--out DIR] [--keep-source] [--threads N] [--seed 0]
    .venv/bin/python bench/synthetic.py qwen3-30b-a3b gpt-oss-20b [--layers 12]
    .venv/bin/python bench/synthetic.py bert-base --types F16,Q8_0
    .venv/bin/localinfer bench model ~/.cache/localinfer/bench-models/qwen2.5-1.5b-Q4_K_M.gguf -p 512 -n 128 --engine llama.cpp,native -t 1,2
"""

from __future__ import annotations

import argparse
import functools
import math
import os
import shutil
import struct
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from localinfer.errors import UserError  # noqa: E402
from localinfer_quant.source import embedded_model_path  # noqa: E402

import synthetic_bert  # noqa: E402
import synthetic_moe  # noqa: E402
from synthetic_bert import BERT_SHAPES, BertShape  # noqa: E402
from synthetic_moe import MOE_SHAPES, MoeShape  # noqa: E402

DEFAULT_TYPES = "Q4_K_M,Q4_0,Q8_0"
WEIGHT_STD = 0.02  # the usual initialiser's scale; trained models' matrices are of that order
CHUNK = 1 << 24  # values drawn at a time: a 64 MB float32 buffer bounds the working memory
LLAMA3_ROPE = (32.0, 1.0, 4.0, 8192)  # Llama 3.2's rope_scaling: factor, low_freq_factor, high_freq_factor, original context


@dataclass(frozen=True)
class Shape:
    """A model's shape, as its config.json and its llama.cpp GGUF give it."""

    name: str
    arch: str  # GGUF architecture: qwen2 | llama | qwen3 | gemma3 | phi3
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    n_ctx: int
    rope_base: float
    norm_eps: float
    qkv_bias: bool = False  # qwen2's attn_q/k/v.bias
    tied: bool = True  # no output.weight: the embedding is the output matrix
    llama3_rope: tuple[float, float, float, int] | None = None  # writes rope_freqs.weight
    qk_norm: bool = False  # qwen3's and gemma3's attn_q_norm / attn_k_norm
    post_norms: bool = False  # gemma3's post_attention_norm and post_ffw_norm
    window: int = 0  # gemma3's sliding window (five local layers to one global)
    fused: bool = False  # phi3's attn_qkv and gate+up ffn_up
    rope_dims: int = 0  # rotated dims per head where not all (phi-4-mini's 96 of 128)
    longrope_ctx: int = 0  # phi3's original context: writes rope_factors_long/short and the attention factor

    def cut(self, layers: int | None = None, vocab: int | None = None) -> Shape:
        """The same shape with only its first `layers` layers and/or a vocabulary of `vocab`
        tokens, named so (NAME-L2-V49536)."""
        s = self if layers in (None, self.n_layer) else replace(self, name=f"{self.name}-L{layers}", n_layer=layers)
        return s if vocab in (None, s.n_vocab) else replace(s, name=f"{s.name}-V{vocab}", n_vocab=vocab)


SHAPES = {s.name: s for s in [
    Shape("qwen2.5-0.5b", "qwen2", 24, 896, 4864, 14, 2, 64, 151_936, 32_768, 1e6, 1e-6, qkv_bias=True),
    Shape("qwen2.5-1.5b", "qwen2", 28, 1536, 8960, 12, 2, 128, 151_936, 32_768, 1e6, 1e-6, qkv_bias=True),
    Shape("qwen2.5-3b", "qwen2", 36, 2048, 11008, 16, 2, 128, 151_936, 32_768, 1e6, 1e-6, qkv_bias=True),
    Shape("qwen2.5-7b", "qwen2", 28, 3584, 18944, 28, 4, 128, 152_064, 32_768, 1e6, 1e-6, qkv_bias=True, tied=False),
    Shape("llama-3.2-1b", "llama", 16, 2048, 8192, 32, 8, 64, 128_256, 131_072, 5e5, 1e-5, llama3_rope=LLAMA3_ROPE),
    Shape("llama-3.2-3b", "llama", 28, 3072, 8192, 24, 8, 128, 128_256, 131_072, 5e5, 1e-5, llama3_rope=LLAMA3_ROPE),
    Shape("qwen3-1.7b", "qwen3", 28, 2048, 6144, 16, 8, 128, 151_936, 40_960, 1e6, 1e-6, qk_norm=True),
    Shape("gemma3-1b", "gemma3", 26, 1152, 6912, 4, 1, 256, 262_144, 32_768, 1e6, 1e-6, qk_norm=True, post_norms=True, window=512),
    Shape("phi-4-mini", "phi3", 32, 3072, 8192, 24, 8, 128, 200_064, 131_072, 1e4, 1e-5, fused=True, rope_dims=96, longrope_ctx=4096),
    # for tests: the same code paths in seconds; the vocabulary is the embedded 49,152 tokens + 384 padding
    Shape("tiny", "qwen2", 2, 256, 512, 4, 2, 64, 49_536, 4096, 1e6, 1e-6, qkv_bias=True),
    Shape("tiny-llama", "llama", 2, 256, 512, 4, 2, 64, 49_536, 4096, 5e5, 1e-5, llama3_rope=LLAMA3_ROPE),
]}  # fmt: skip


@dataclass(frozen=True)
class TensorSpec:
    name: str
    shape: tuple[int, ...]  # numpy order: [rows, cols] for a matrix (GGUF lists it reversed)
    kind: str  # matrix (F16) | norm | bias | table (a BERT's position and token-type rows) | rope_freqs | rope_long | rope_short (F32)

    @property
    def dtype(self) -> type:
        return np.float16 if self.kind == "matrix" else np.float32

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * np.dtype(self.dtype).itemsize


def tensor_plan(s: Shape) -> list[TensorSpec]:
    """Every tensor of the shape, in the order llama.cpp's converter writes them."""
    q, kv = s.n_head * s.head_dim, s.n_head_kv * s.head_dim
    plan = [TensorSpec("rope_freqs.weight", (s.head_dim // 2,), "rope_freqs")] if s.llama3_rope else []
    if s.longrope_ctx:
        plan += [TensorSpec(f"rope_factors_{which}.weight", (s.rope_dims // 2,), f"rope_{which}") for which in ("long", "short")]
    plan.append(TensorSpec("token_embd.weight", (s.n_vocab, s.n_embd), "matrix"))
    for i in range(s.n_layer):
        plan += layer_plan(s, f"blk.{i}.", q, kv)
    plan.append(TensorSpec("output_norm.weight", (s.n_embd,), "norm"))
    if not s.tied:
        plan.append(TensorSpec("output.weight", (s.n_vocab, s.n_embd), "matrix"))
    return plan


def layer_plan(s: Shape, p: str, q: int, kv: int) -> list[TensorSpec]:
    plan = [TensorSpec(p + "attn_norm.weight", (s.n_embd,), "norm")]
    if s.fused:
        plan.append(TensorSpec(p + "attn_qkv.weight", (q + 2 * kv, s.n_embd), "matrix"))
    for kind, rows in () if s.fused else (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
        plan.append(TensorSpec(f"{p}{kind}.weight", (rows, s.n_embd), "matrix"))
        if s.qkv_bias:
            plan.append(TensorSpec(f"{p}{kind}.bias", (rows,), "bias"))
    if s.qk_norm:
        plan += [TensorSpec(p + "attn_q_norm.weight", (s.head_dim,), "norm"), TensorSpec(p + "attn_k_norm.weight", (s.head_dim,), "norm")]
    plan.append(TensorSpec(p + "attn_output.weight", (s.n_embd, q), "matrix"))
    if s.post_norms:
        plan.append(TensorSpec(p + "post_attention_norm.weight", (s.n_embd,), "norm"))
    plan.append(TensorSpec(p + "ffn_norm.weight", (s.n_embd,), "norm"))
    if s.fused:
        plan.append(TensorSpec(p + "ffn_up.weight", (2 * s.n_ff, s.n_embd), "matrix"))
    else:
        plan += [TensorSpec(p + "ffn_gate.weight", (s.n_ff, s.n_embd), "matrix"), TensorSpec(p + "ffn_up.weight", (s.n_ff, s.n_embd), "matrix")]
    plan.append(TensorSpec(p + "ffn_down.weight", (s.n_embd, s.n_ff), "matrix"))
    if s.post_norms:
        plan.append(TensorSpec(p + "post_ffw_norm.weight", (s.n_embd,), "norm"))
    return plan


def plan_of(s: Shape | BertShape) -> list[TensorSpec]:
    """Every tensor of a decoder's shape or an encoder's (bench/synthetic_bert.py)."""
    return [TensorSpec(*t) for t in synthetic_bert.tensor_plan(s)] if isinstance(s, BertShape) else tensor_plan(s)


def n_params(s: Shape | BertShape) -> int:
    return sum(math.prod(t.shape) for t in plan_of(s) if not t.kind.startswith("rope_"))


def llama3_rope_factors(head_dim: int, base: float, scaling: tuple[float, float, float, int]) -> np.ndarray:
    """Llama 3's per-frequency RoPE divisors, computed as llama.cpp's converter computes them
    from config.json: 1 for short wavelengths, `factor` for long ones, a smooth blend between."""
    factor, low, high, old_ctx = scaling
    freqs = 1.0 / base ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    wavelen = 2 * math.pi / freqs
    smooth = (old_ctx / wavelen - low) / (high - low)
    blended = 1.0 / ((1 - smooth) / factor + smooth)
    out = np.where(wavelen < old_ctx / high, 1.0, np.where(wavelen > old_ctx / low, factor, blended))
    return out.astype(np.float32)


def tensor_values(s: Shape | BertShape, spec: TensorSpec, rng: np.random.Generator) -> np.ndarray:
    """One tensor's random values; a matrix is drawn in chunks straight into its F16 array."""
    if spec.kind == "rope_freqs":
        return llama3_rope_factors(s.head_dim, s.rope_base, s.llama3_rope)
    if spec.kind in ("rope_long", "rope_short"):  # phi3's divisors: near 1 for short contexts, up to tens for long ones
        top = 40.0 if spec.kind == "rope_long" else 1.5
        return np.geomspace(1.0, top, spec.shape[0]).astype(np.float32)
    if spec.kind == "norm":
        return (1.0 + WEIGHT_STD * rng.standard_normal(spec.shape, dtype=np.float32)).astype(np.float32)
    if spec.kind in ("bias", "table"):
        return WEIGHT_STD * rng.standard_normal(spec.shape, dtype=np.float32)
    out = np.empty(math.prod(spec.shape), dtype=np.float16)
    for start in range(0, out.size, CHUNK):
        chunk = rng.standard_normal(min(CHUNK, out.size - start), dtype=np.float32)
        chunk *= WEIGHT_STD
        out[start : start + chunk.size] = chunk
    return out.reshape(spec.shape)


@functools.cache
def gguf_tokenizer(path: Path) -> dict[str, tuple[object, list]]:
    """A GGUF's tokenizer.* metadata (the embedded model's by default): key -> (value, [GGUF
    type, element type]).

    Read with struct rather than gguf's GGUFReader, which makes a numpy view per string and
    takes seconds for 49,152 tokens and as many merges."""
    from gguf import GGUFValueType as V

    data = path.read_bytes()
    scalars = {V.UINT8: "<B", V.INT8: "<b", V.UINT16: "<H", V.INT16: "<h", V.UINT32: "<I", V.INT32: "<i", V.FLOAT32: "<f",
               V.BOOL: "<?", V.UINT64: "<Q", V.INT64: "<q", V.FLOAT64: "<d"}  # fmt: skip
    pos = 8  # after the magic and the version

    def take(fmt: str) -> object:
        nonlocal pos
        (value,) = struct.unpack_from(fmt, data, pos)
        pos += struct.calcsize(fmt)
        return value

    def value(vtype: V) -> object:
        nonlocal pos
        if vtype == V.STRING:
            n = take("<Q")
            pos += n
            return data[pos - n : pos].decode("utf-8")
        return take(scalars[vtype])

    _, n_kv = take("<Q"), take("<Q")
    fields = {}
    for _ in range(n_kv):
        key, vtype = value(V.STRING), V(take("<I"))
        if vtype == V.ARRAY:
            etype, count = V(take("<I")), take("<Q")
            fields[key] = ([value(etype) for _ in range(count)], [vtype, etype])
        else:
            fields[key] = (value(vtype), [vtype])
    return {key: field for key, field in fields.items() if key.startswith("tokenizer.")}


def add_metadata(w, s: Shape, tokenizer: dict[str, tuple[object, list]]) -> None:  # w: gguf.GGUFWriter
    """The architecture's hyperparameters under llama.cpp's keys, and the padded vocabulary."""
    from gguf import LlamaFileType

    w.add_name(f"synthetic {s.name}")
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    w.add_context_length(s.n_ctx)
    w.add_block_count(s.n_layer)
    w.add_embedding_length(s.n_embd)
    w.add_feed_forward_length(s.n_ff)
    w.add_head_count(s.n_head)
    w.add_head_count_kv(s.n_head_kv)
    if s.head_dim != s.n_embd // s.n_head:
        w.add_key_length(s.head_dim)
        w.add_value_length(s.head_dim)
    w.add_rope_dimension_count(s.rope_dims or s.head_dim)
    w.add_rope_freq_base(s.rope_base)
    if s.window:
        w.add_sliding_window(s.window)
        w.add_rope_freq_base_swa(10000.0)
    if s.longrope_ctx:
        w.add_rope_scaling_orig_ctx_len(s.longrope_ctx)
        w.add_rope_scaling_attn_factors(math.sqrt(1 + math.log(s.n_ctx / s.longrope_ctx) / math.log(s.longrope_ctx)))
    w.add_layer_norm_rms_eps(s.norm_eps)
    w.add_vocab_size(s.n_vocab)
    add_vocabulary(w, s.n_vocab, tokenizer)


def add_vocabulary(w, n_vocab: int, tokenizer: dict[str, tuple[object, list]]) -> None:  # w: gguf.GGUFWriter
    """The tokenizer's keys, its tokens padded to `n_vocab` with unused [PADn] tokens."""
    from gguf import GGUFValueType, TokenType

    tokens, types = list(tokenizer["tokenizer.ggml.tokens"][0]), list(tokenizer["tokenizer.ggml.token_type"][0])
    if len(tokens) > n_vocab:
        raise UserError(f"the shape has {n_vocab:,} tokens, fewer than the tokenizer's {len(tokens):,}")
    pad = range(len(tokens), n_vocab)
    tokens += [f"[PAD{i}]" for i in pad]
    types += [int(TokenType.UNUSED)] * len(pad)
    padded = {"tokenizer.ggml.tokens": tokens, "tokenizer.ggml.token_type": types}
    for key, (value, vtypes) in tokenizer.items():
        value = padded.get(key, value)
        if vtypes[0] == GGUFValueType.ARRAY:
            w.add_key_value(key, value, GGUFValueType.ARRAY, sub_type=vtypes[-1])
        else:
            w.add_key_value(key, value, vtypes[0])


def write_source(s: Shape | BertShape, path: Path, seed: int, progress: Callable[[int, int, str], None], tokenizer: Path) -> None:
    """The F16 GGUF, streamed: tensor infos first, then each tensor's data as it is drawn.
    An encoder brings its own WordPiece vocabulary; a decoder gets the tokenizer's."""
    from gguf import GGUFWriter

    plan = plan_of(s)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        w = GGUFWriter(str(tmp), s.arch)
        if isinstance(s, BertShape):
            synthetic_bert.add_metadata(w, s)
        else:
            add_metadata(w, s, gguf_tokenizer(tokenizer))
        for spec in plan:
            w.add_tensor_info(spec.name, spec.shape, np.dtype(spec.dtype), spec.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, spec in enumerate(plan):
            progress(i, len(plan), spec.name)
            rng = np.random.default_rng([seed, i])  # per tensor: any one is reproducible alone
            w.write_tensor_data(tensor_values(s, spec, rng))
        progress(len(plan), len(plan), "")
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def main_type_bytes(type_name: str) -> float:
    """Bytes per weight of a llama ftype's main block type (Q4_K_M -> Q4_K), for the disk
    check; 2 (F16's) where the name does not say."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for name in (type_name, type_name.rsplit("_", 1)[0]):
        if name in GGMLQuantizationType.__members__:
            block, size = GGML_QUANT_SIZES[GGMLQuantizationType[name]]
            return size / block
    return 2.0


def check_disk(folder: Path, need: float, what: str) -> None:
    free = shutil.disk_usage(folder).free
    if free < need:
        raise UserError(f"{folder} has {free / 1e9:.1f} GB free; {what} needs about {need / 1e9:.1f} GB")


def make(s: Shape | BertShape, types: list[str], out: Path, *, seed: int, threads: int | None, keep_source: bool, log: Callable[[str], None],
         tokenizer: Path) -> list[Path]:  # fmt: skip
    """The shape's file of each type in `out`, made from one F16 source; returns their paths."""
    from localinfer.cli.progress import work_bar
    from localinfer_quant.quantize import quantize

    targets = {t: out / f"{s.name}-{t}.gguf" for t in types}
    source = out / f"{s.name}-F16.gguf"
    for path in targets.values():
        if path.exists():
            log(f"{path.name}: exists, skipped")
    todo = {t: p for t, p in targets.items() if t != "F16" and not p.exists()}
    if not todo and (source.exists() or "F16" not in types):
        return list(targets.values())
    params, wrote_source = n_params(s), False
    if not source.exists():
        check_disk(out, params * 2 + sum(params * main_type_bytes(t) for t in todo), f"{s.name} ({params / 1e9:.2f} B parameters)")
        started = time.perf_counter()
        with work_bar(f"writing {source.name}", enabled=sys.stderr.isatty()) as bar:
            write_source(s, source, seed, bar, tokenizer)
        wrote_source = True
        log(f"{source.name}: {source.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    try:
        for t, path in todo.items():
            check_disk(out, params * main_type_bytes(t), path.name)
            with work_bar(f"quantizing {path.name}", enabled=sys.stderr.isatty()) as bar:
                result = quantize(source, path, t, threads=threads, progress=bar, warn=log)
            log(f"{path.name}: {path.stat().st_size / 1e9:.2f} GB in {result.seconds:.0f} s")
    finally:
        if wrote_source and not keep_source and "F16" not in types:
            source.unlink(missing_ok=True)
    return list(targets.values())


def make_moe(s: MoeShape, out: Path, *, seed: int, log: Callable[[str], None], tokenizer: Path) -> Path:
    """The mixture of experts' file in its real file's types, written straight (no F16 source)."""
    from localinfer.cli.progress import work_bar

    path = out / f"{s.name}-{s.ftype}.gguf"
    if path.exists():
        log(f"{path.name}: exists, skipped")
        return path
    check_disk(out, sum(t.nbytes for t in synthetic_moe.tensor_plan(s)), path.name)
    started = time.perf_counter()
    vocabulary = functools.partial(add_vocabulary, tokenizer=gguf_tokenizer(tokenizer))
    with work_bar(f"writing {path.name} (MB)", enabled=sys.stderr.isatty()) as bar:
        synthetic_moe.write(s, path, seed, bar, vocabulary)
    log(f"{path.name}: {path.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    return path


def parse_types(text: str) -> list[str]:
    """The comma-separated llama ftype names, checked against what llama.cpp's quantizer takes."""
    from localinfer_quant.quantize import ftypes

    known = ftypes()
    types = list(dict.fromkeys(t.strip().upper() for t in text.split(",") if t.strip()))
    unknown = [t for t in types if t not in known]
    if unknown or not types:
        raise UserError(f"unknown type {', '.join(unknown) or '(none given)'}; choose from: {', '.join(known)}")
    return types


def shapes_asked(names: list[str], layers: int | None, vocab: int | None, types: list[str] | None) -> list[Shape | MoeShape | BertShape]:
    """The named shapes, cut to `layers` layers and a `vocab`-token vocabulary where asked;
    every name and option checked before anything is written."""
    known = {**SHAPES, **MOE_SHAPES, **BERT_SHAPES}
    unknown = [name for name in names if name not in known]
    if unknown:
        raise UserError(f"unknown shape {', '.join(unknown)}; choose from: {', '.join(known)}")
    shapes = [known[name] for name in dict.fromkeys(names)]
    if layers is not None:
        deeper = [f"{s.name} has {s.n_layer}" for s in shapes if layers > s.n_layer]
        if layers < 1 or deeper:
            raise UserError(f"--layers {layers} is not between 1 and the shape's layer count ({'; '.join(deeper) or 'at least 1'})")
    for s in shapes:
        if isinstance(s, MoeShape) and types is not None and s.ftype not in types:
            raise UserError(f"{s.name} is made only in its real file's types, {s.ftype}; add {s.ftype} to --types or leave --types out")
    return [s.cut(layers, vocab) for s in shapes]


def check_vocab(vocab: int | None, tokenizer: Path, shapes: list[Shape | MoeShape | BertShape]) -> None:
    """--vocab holds at least the tokenizer's tokens, or for an encoder its WordPiece
    vocabulary's base (checked before anything is written)."""
    if vocab is None:
        return
    if any(isinstance(s, BertShape) for s in shapes) and vocab < synthetic_bert.MIN_VOCAB:
        raise UserError(f"--vocab {vocab} is fewer than a synthetic BERT's {synthetic_bert.MIN_VOCAB:,} base WordPiece tokens")
    if all(isinstance(s, BertShape) for s in shapes):
        return
    n_tokens = len(gguf_tokenizer(tokenizer)["tokenizer.ggml.tokens"][0])
    if vocab < n_tokens:
        raise UserError(f"--vocab {vocab} is fewer than the tokenizer's {n_tokens:,} tokens ({tokenizer.name})")


def listing() -> Iterator[str]:
    from localinfer_quant.quantize import ftypes

    yield f"{'shape':14} {'arch':6} {'layers':>6} {'embd':>5} {'ffn':>6} {'heads':>6} {'head':>4} {'vocab':>8} {'params':>8} {'F16':>8}  extras"
    for s in SHAPES.values():
        extras = [x for x, on in (("qkv bias", s.qkv_bias), ("tied embedding", s.tied), ("llama3 rope_freqs", s.llama3_rope)) if on]
        p = n_params(s)
        yield (f"{s.name:14} {s.arch:6} {s.n_layer:6} {s.n_embd:5} {s.n_ff:6} {s.n_head:>3}/{s.n_head_kv:<2} {s.head_dim:4} {s.n_vocab:8,}"
               f" {p / 1e6:7,.0f}M {p * 2 / 1e9:6.2f}GB  {', '.join(extras)}")  # fmt: skip
    yield ""
    yield "mixtures of experts, in their real files' types only (--layers N: N layers of each)"
    yield f"{'shape':14} {'arch':8} {'type':9} {'layers':>6} {'embd':>5} {'experts':>8} {'ff_exp':>6} {'heads':>6} {'head':>4} {'vocab':>8} {'params':>8} {'active':>7} {'file':>8}"
    for s in MOE_SHAPES.values():
        (total, active), size = synthetic_moe.n_params(s), sum(t.nbytes for t in synthetic_moe.tensor_plan(s))
        yield (f"{s.name:14} {s.arch:8} {s.ftype:9} {s.n_layer:6} {s.n_embd:5} {s.n_expert_used:>3} of {s.n_expert:<3} {s.n_ff_exp:6}"
               f" {s.n_head:>3}/{s.n_head_kv:<2} {s.head_dim:4} {s.n_vocab:8,} {total / 1e9:7.2f}B {active / 1e9:6.2f}B {size / 1e9:6.2f}GB")  # fmt: skip
    yield ""
    yield "encoders (embedding models; their own WordPiece vocabulary, --tokenizer does not apply)"
    yield f"{'shape':14} {'arch':6} {'layers':>6} {'embd':>5} {'ffn':>6} {'heads':>6} {'vocab':>8} {'ctx':>5} {'pooling':>7} {'params':>8} {'F16':>8}"
    for s in BERT_SHAPES.values():
        p = n_params(s)
        yield f"{s.name:14} {s.arch:6} {s.n_layer:6} {s.n_embd:5} {s.n_ff:6} {s.n_head:6} {s.n_vocab:8,} {s.n_ctx:5} {s.pooling:>7} {p / 1e6:7,.0f}M {p * 2 / 1e9:6.2f}GB"
    yield ""
    yield "types (llama.cpp's quantizer, by llama-quantize's names): " + ", ".join(ftypes())


def default_out() -> Path:
    import platformdirs

    return Path(platformdirs.user_cache_dir("localinfer", appauthor=False)) / "bench-models"


VOCAB_HELP = ("pad the tokenizer to N tokens instead of the shape's vocabulary (at least the tokenizer's own: 49,152 for the embedded one): "
              "a smaller embedding and output matrix, for tests and small disks; the output matrix's share of a token's time is then not the real one")
LAYERS_HELP = ("make only the first N layers of each shape, each its real size (the embedding and output matrix whole), to fit a small disk "
               "or RAM; tokens per second then scale with the layer count: the layers' share of a token's time is N/L of the full model's, "
               "so scale a speed measured on N of L layers before comparing it, and say so")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("shapes", nargs="*", help=f"shapes to make: {', '.join([*SHAPES, *MOE_SHAPES, *BERT_SHAPES])}")
    ap.add_argument("--types", default=None, help=f"comma-separated llama ftypes (default {DEFAULT_TYPES}); F16 keeps the source; a mixture of experts is made in its own")
    ap.add_argument("--layers", type=int, default=None, metavar="N", help=LAYERS_HELP)
    ap.add_argument("--vocab", type=int, default=None, metavar="N", help=VOCAB_HELP)
    ap.add_argument("--out", type=Path, default=None, help=f"folder for the files (default {default_out()})")
    ap.add_argument("--keep-source", action="store_true", help="keep the F16 source this run writes (it is deleted after quantizing otherwise)")
    ap.add_argument("--threads", type=int, default=None, help="quantizer threads (default: every core)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    ap.add_argument("--tokenizer", type=Path, default=None, help="a GGUF whose tokenizer the files get (default: the embedded model's)")
    ap.add_argument("--list", action="store_true", help="list the shapes and the types, and exit")
    args = ap.parse_args()
    if args.list:
        print("\n".join(listing()))
        return
    if not args.shapes:
        ap.error(f"name at least one shape ({', '.join([*SHAPES, *MOE_SHAPES, *BERT_SHAPES])}), or pass --list")
    log = lambda line: print(line, file=sys.stderr, flush=True)  # noqa: E731
    try:
        if args.threads is not None and args.threads < 1:
            raise UserError("--threads must be at least 1")
        types = parse_types(args.types) if args.types is not None else None
        shapes = shapes_asked(args.shapes, args.layers, args.vocab, types)
        tokenizer = args.tokenizer or embedded_model_path()
        if not tokenizer.is_file():
            raise UserError(f"--tokenizer {tokenizer}: no such file")
        check_vocab(args.vocab, tokenizer, shapes)
        from localinfer.paths import ensure_dir

        out = ensure_dir((args.out or default_out()).expanduser())
        for s in shapes:
            if isinstance(s, MoeShape):
                paths = [make_moe(s, out, seed=args.seed, log=log, tokenizer=tokenizer)]
            else:
                paths = make(s, types or parse_types(DEFAULT_TYPES), out, seed=args.seed, threads=args.threads, keep_source=args.keep_source, log=log, tokenizer=tokenizer)
            for path in paths:
                print(path, flush=True)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
