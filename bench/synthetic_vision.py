"""A synthetic Gemma 3 4B with its projector (random weights), for bench/vision_ttft.py:
an image's time to first token at the real shapes without the real files. A weight's value
does not change how fast it is read or multiplied; its shape and block type do.

The text model is Gemma 3 4B's shape as llama.cpp reads its GGUF (gemma3: 34 layers, 2,560
wide, 10,240 FFN, 8 heads over 4 KV heads of 256, q/k norms, post-norms, a 1,024-token
window on five layers of six, 262,208 tokens: the multimodal Gemma 3s' vocabulary, 64 more
than the 1B's 262,144), made by bench/synthetic.py's code (its F16 source, then llama.cpp's
own quantizer to Q4_K_M, which picks Q4_K and Q6_K per tensor as for the real model). Not
written: rope.scaling (linear, 8, on the global layers), which changes no cost. Its
vocabulary is synthetic.py's (the embedded model's BPE) plus Gemma 3's <start_of_image> and
<end_of_image> as control tokens, the text mtmd puts around an image, so each is one token
as in the real vocabulary.

The projector is SigLIP-so400m at 896 pixels as llama.cpp's converter writes Gemma 3's
mmproj (projector_type gemma3): 14-pixel patches (64 x 64 of them), 27 pre-LayerNorm blocks
1,152 wide with a 4,304 GELU FFN and 16 heads, every product with its bias, a post-LayerNorm,
then mtmd's 4 x 4 average pool (256 tokens an image), an RMSNorm (mm.soft_emb_norm) and the
input projection to the text width (mm.input_projection, stored [vision, text], which clip
transposes). Types as the converter's f16 output: matrices F16, the patch kernel and the
position table F32 (its tensor_force_quant), norms and biases F32. 0.42 B parameters, 0.85 GB.

Random values are synthetic.py's (std 0.02 matrices, norms near 1): every activation stays
within F16's range through both models (bench/vision_ttft.py checks the logits are finite).

Files, in --out (default synthetic.py's folder): gemma3-4b-vision-Q4_K_M.gguf (2.5 GB) and
mmproj-gemma3-4b-vision-F16.gguf, plus the vocabulary's tokenizer-only GGUF; a file that
exists is kept. tiny-gemma3-vision is the same code at test sizes (a 224-pixel projector
making 16 tokens an image).

    .venv/bin/python bench/synthetic_vision.py gemma3-4b-vision [--out DIR] [--threads N] [--seed 0]
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from localinfer.errors import UserError  # noqa: E402
from localinfer_quant.source import embedded_model_path  # noqa: E402

import synthetic  # noqa: E402
from synthetic import Shape, TensorSpec  # noqa: E402

TEXT_TYPE = "Q4_K_M"  # what ggml-org's and Ollama's gemma3:4b ship
IMAGE_MARKS = ("<start_of_image>", "<end_of_image>")  # what mtmd writes around a Gemma 3 image
GEMMA3_POOL = 4  # clip's default n_merge for gemma3: a file writes scale_factor only where it differs
SIGLIP_MEAN = SIGLIP_STD = [0.5, 0.5, 0.5]


@dataclass(frozen=True)
class VisionShape:
    """A SigLIP encoder and Gemma 3's projector, as its mmproj's clip.vision.* keys give it."""

    image_size: int  # pixels a side: every image is resized to it
    patch: int
    n_layer: int
    n_embd: int
    n_ff: int
    n_head: int
    pool: int = GEMMA3_POOL  # patches a side averaged into one token
    eps: float = 1e-6

    @property
    def image_tokens(self) -> int:
        return (self.image_size // self.patch // self.pool) ** 2


@dataclass(frozen=True)
class Pair:
    name: str
    text: Shape
    vision: VisionShape


PAIRS = {p.name: p for p in [
    Pair("gemma3-4b-vision", Shape("gemma3-4b-vision", "gemma3", 34, 2560, 10240, 8, 4, 256, 262_208, 131_072, 1e6, 1e-6,
                                   qk_norm=True, post_norms=True, window=1024),
         VisionShape(896, 14, 27, 1152, 4304, 16)),
    # the same code paths in seconds: the vocabulary is the embedded 49,152 tokens + the image marks, padded
    Pair("tiny-gemma3-vision", Shape("tiny-gemma3-vision", "gemma3", 2, 256, 512, 4, 2, 64, 49_536, 4096, 1e6, 1e-6,
                                     qk_norm=True, post_norms=True, window=128),
         VisionShape(224, 14, 2, 32, 64, 2)),
]}  # fmt: skip


def projector_plan(v: VisionShape, text_width: int) -> list[TensorSpec]:
    """Every tensor of the mmproj, in clip's names; kinds as synthetic.py's ("table": F32 values)."""
    n_patches = (v.image_size // v.patch) ** 2
    plan = [
        TensorSpec("v.patch_embd.weight", (v.n_embd, 3, v.patch, v.patch), "table"),  # the Conv2D kernel [out, in, h, w]
        TensorSpec("v.patch_embd.bias", (v.n_embd,), "bias"),
        TensorSpec("v.position_embd.weight", (n_patches, v.n_embd), "table"),
    ]
    for i in range(v.n_layer):
        p = f"v.blk.{i}."
        for norm in ("ln1", "ln2"):
            plan += [TensorSpec(p + norm + ".weight", (v.n_embd,), "norm"), TensorSpec(p + norm + ".bias", (v.n_embd,), "bias")]
        for kind in ("attn_q", "attn_k", "attn_v", "attn_out"):
            plan += [TensorSpec(p + kind + ".weight", (v.n_embd, v.n_embd), "matrix"), TensorSpec(p + kind + ".bias", (v.n_embd,), "bias")]
        plan += [TensorSpec(p + "ffn_up.weight", (v.n_ff, v.n_embd), "matrix"), TensorSpec(p + "ffn_up.bias", (v.n_ff,), "bias"),  # mlp.fc1
                 TensorSpec(p + "ffn_down.weight", (v.n_embd, v.n_ff), "matrix"), TensorSpec(p + "ffn_down.bias", (v.n_embd,), "bias")]  # fmt: skip
    plan += [
        TensorSpec("v.post_ln.weight", (v.n_embd,), "norm"),
        TensorSpec("v.post_ln.bias", (v.n_embd,), "bias"),
        TensorSpec("mm.soft_emb_norm.weight", (v.n_embd,), "norm"),  # Gemma's 1 + w, as the converter stores it
        TensorSpec("mm.input_projection.weight", (v.n_embd, text_width), "matrix"),  # [vision, text]
    ]
    return plan


def projector_metadata(w, v: VisionShape, text_width: int) -> None:  # w: gguf.GGUFWriter
    """What MmprojModel and Gemma3VisionModel's set_gguf_parameters write."""
    from gguf import LlamaFileType

    w.add_type("mmproj")
    w.add_file_type(LlamaFileType.MOSTLY_F16)
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type("gemma3")
    w.add_vision_projection_dim(text_width)
    w.add_vision_image_size(v.image_size)
    w.add_vision_patch_size(v.patch)
    w.add_vision_embedding_length(v.n_embd)
    w.add_vision_feed_forward_length(v.n_ff)
    w.add_vision_block_count(v.n_layer)
    w.add_vision_head_count(v.n_head)
    w.add_vision_attention_layernorm_eps(v.eps)
    w.add_vision_image_mean(SIGLIP_MEAN)
    w.add_vision_image_std(SIGLIP_STD)
    w.add_vision_use_gelu(True)
    if v.pool != GEMMA3_POOL:
        w.add_vision_projector_scale_factor(v.pool)


def write_projector(pair: Pair, path: Path, seed: int) -> None:
    """The mmproj GGUF, streamed one tensor at a time under a temporary name."""
    from gguf import GGUFWriter

    plan = projector_plan(pair.vision, pair.text.n_embd)
    tmp = path.with_name(f".{path.name}.partial")
    try:
        w = GGUFWriter(str(tmp), "clip")
        w.add_name(f"synthetic {pair.name} projector")
        projector_metadata(w, pair.vision, pair.text.n_embd)
        for spec in plan:
            w.add_tensor_info(spec.name, spec.shape, np.dtype(spec.dtype), spec.nbytes)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        for i, spec in enumerate(plan):
            rng = np.random.default_rng([seed, 1_000_000 + i])  # apart from the text model's streams
            w.write_tensor_data(synthetic.tensor_values(pair.text, spec, rng))
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def image_mark_tokenizer(out: Path) -> Path:
    """A tokenizer-only GGUF: the embedded model's BPE plus IMAGE_MARKS as control tokens
    (synthetic.make's --tokenizer)."""
    from gguf import GGUFWriter, TokenType

    path = out / "gemma3-image-marks-tokenizer.gguf"
    if path.exists():
        return path
    fields = dict(synthetic.gguf_tokenizer(embedded_model_path()))
    tokens, types = fields["tokenizer.ggml.tokens"], fields["tokenizer.ggml.token_type"]
    fields["tokenizer.ggml.tokens"] = ([*tokens[0], *IMAGE_MARKS], tokens[1])
    fields["tokenizer.ggml.token_type"] = ([*types[0], *[int(TokenType.CONTROL)] * len(IMAGE_MARKS)], types[1])
    tmp = path.with_name(f".{path.name}.partial")
    try:
        w = GGUFWriter(str(tmp), "gemma3")
        synthetic.add_vocabulary(w, len(fields["tokenizer.ggml.tokens"][0]), fields)
        w.write_header_to_file()
        w.write_kv_data_to_file()
        w.write_ti_data_to_file()
        w.close()
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def projector_params(pair: Pair) -> int:
    return sum(int(np.prod(t.shape)) for t in projector_plan(pair.vision, pair.text.n_embd))


def make_pair(name: str, out: Path, *, seed: int = 0, threads: int | None = None, log: Callable[[str], None] = lambda line: None) -> tuple[Path, Path]:
    """(text model, projector) of PAIRS[name] in `out`, each written unless it exists."""
    if name not in PAIRS:
        raise UserError(f"unknown pair {name}; choose from: {', '.join(PAIRS)}")
    from localinfer.paths import ensure_dir

    pair, out = PAIRS[name], ensure_dir(out.expanduser())
    text = synthetic.make(pair.text, [TEXT_TYPE], out, seed=seed, threads=threads, keep_source=False, log=log, tokenizer=image_mark_tokenizer(out))[0]
    mmproj = out / f"mmproj-{name}-F16.gguf"
    if mmproj.exists():
        log(f"{mmproj.name}: exists, skipped")
        return text, mmproj
    synthetic.check_disk(out, projector_params(pair) * 2, mmproj.name)
    started = time.perf_counter()
    write_projector(pair, mmproj, seed)
    log(f"{mmproj.name}: {mmproj.stat().st_size / 1e9:.2f} GB in {time.perf_counter() - started:.0f} s")
    return text, mmproj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pair", choices=list(PAIRS), help="the pair to make")
    ap.add_argument("--out", type=Path, default=None, help=f"folder for the files (default {synthetic.default_out()})")
    ap.add_argument("--threads", type=int, default=None, help="quantizer threads (default: every core)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    args = ap.parse_args()
    try:
        for path in make_pair(args.pair, args.out or synthetic.default_out(), seed=args.seed, threads=args.threads, log=lambda line: print(line, file=sys.stderr, flush=True)):
            print(path, flush=True)
    except UserError as e:
        raise SystemExit(f"error: {e}") from None
    except KeyboardInterrupt:
        raise SystemExit(130) from None


if __name__ == "__main__":
    main()
