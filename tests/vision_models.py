"""Tiny vision-language models with random weights: a text GGUF and its projector GGUF
(`mmproj`), in llama.cpp's exact tensor names and clip's `clip.*` metadata, and what
llama.cpp's own multimodal library (mtmd, through llama-cpp-python's bindings) makes of them:
the reference every image test holds our engine to.

Writers (text models 350 KB, Gemma 3's 800 KB, projectors 110 to 250 KB; written, loaded and
run in milliseconds; the same bytes for a seed):

  llava text       arch "llama": GQA, SwiGLU, RMSNorm, the byte-level BPE of
                   embedding_models (so any text tokenizes), BOS added, tied output head
  mlp projector    LLaVA-1.5's ("mlp"), as the legacy convert_image_encoder_to_gguf writes
                   it: a CLIP ViT (class embedding, learned positions, pre-LayerNorm,
                   LayerNorm + quick-GELU blocks, fc1 stored as ffn_down and fc2 as ffn_up,
                   which clip swaps back on load) and the two-layer GELU MLP mm.0, mm.2.
                   A fixed 56 x 56 input (any image is resized to it), 14-pixel patches:
                   16 image tokens per image, whatever its size. Of the two vision blocks
                   only the first runs (clip_graph_llava stops before the last, LLaVA's
                   penultimate-layer features), but clip loads both.
  qwen2vl text     arch "qwen2vl": Qwen2's layers (q/k/v biases) with M-RoPE sections
                   [2, 3, 3, 0] of a 16-wide head, <|vision_start|> and <|vision_end|> as
                   control tokens
  qwen2vl projector  Qwen2-VL's ("qwen2vl_merger"): the Conv3D patch embedding split in
                   two 2-D kernels (v.patch_embd.weight, .weight.1), blocks with 2-D M-RoPE
                   inside the ViT, merger.ln_q as v.post_ln, and the merger MLP over 2 x 2
                   patches (mm.0, mm.2). Dynamic size: an image whose sides are multiples
                   of 28 becomes (h / 28) x (w / 28) tokens, any other is first resized by
                   mtmd's smart resize (ratio kept, 8 to 4096 tokens); its chunk advances
                   the position by max(rows, columns), not by its token count.
  gemma3 text      arch "gemma3" as Gemma3Model converts gemma-3-4b-it: a SentencePiece
                   vocabulary (byte fallback; <start_of_image>, <end_of_image> and the turn
                   markers as control tokens), its chat template, a 32-wide head of its own,
                   q/k norms, post-attention and post-FFN norms, GeGLU, 6 layers: 5 with a
                   16-token sliding window and a global one (llama.cpp's default pattern)
  gemma3 projector  Gemma 3's ("gemma3"): a SigLIP ViT (patch bias, learned positions, GELU,
                   v.post_ln), clip's 4 x 4 average pool, mm.soft_emb_norm and
                   mm.input_projection. A fixed 64 x 64 input, 4-pixel patches: 16 tokens per
                   image between <start_of_image> and <end_of_image>, which mtmd decodes with
                   causal attention off (mtmd_decode_use_non_causal): each sees the whole image.

Every projector outputs the text model's width (64): mtmd refuses a pair that differs.

The reference does what llama-mtmd-cli does: mtmd_init_from_file with the text model,
mtmd_bitmap_init from RGB bytes (or mtmd_helper_bitmap_init_from_buf from a PNG file's
bytes), mtmd_tokenize of the prompt with the default marker (<__media__>) standing for each
image, then mtmd_helper_eval_chunks into a fresh sequence: text chunks as tokens, image
chunks encoded by the projector (mtmd_encode_chunk) and decoded as embedding rows with their
positions (M-RoPE's 2-D ones for Qwen2-VL; causal attention off for Gemma 3's), both through llama_batch_ext and llama_process. The logits are the last text token's: an image chunk
never asks for any, so a prompt must end in text (Qwen2-VL's <|vision_end|> always does).
"""

from __future__ import annotations

import ctypes
import os
import struct
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, RopeScalingType, TokenType

from localinfer.backends.llamacpp import _init_once, _on_log, last_error

import llama_cpp as C  # noqa: E402  (after localinfer's import, which loads the shared library first)
from llama_cpp import mtmd_cpp as M  # noqa: E402

from .conftest import THREADS
from .embedding_models import N_EMBD, PUNCTUATION, WORDS, RandomWeights, bpe_metadata, bpe_vocabulary, finish, llama_context

# the text models
TEXT_HEAD, TEXT_HEAD_KV, TEXT_FF, TEXT_LAYER, TEXT_CTX = 4, 2, 128, 2, 512
TEXT_HEAD_DIM = N_EMBD // TEXT_HEAD  # 16
MROPE_SECTIONS = [2, 3, 3, 0]  # Qwen2-VL's [16, 24, 24] for a 128-wide head, scaled to 16: t, h, w (sum = head_dim / 2)
VISION_TOKENS = ("<|vision_start|>", "<|vision_end|>")

# the vision encoders
VISION_EMBD, VISION_HEAD, VISION_FF, VISION_LAYER, PATCH = 32, 2, 64, 2, 14  # VISION_FF != VISION_EMBD: clip's swap test
LLAVA_IMAGE = 56  # the fixed input side: (56 / 14)^2 = 16 patches, one token each
LLAVA_IMAGE_TOKENS = (LLAVA_IMAGE // PATCH) ** 2
QWEN_MERGE = 2  # 2 x 2 patches per token
CLIP_MEAN, CLIP_STD = [0.48145466, 0.4578275, 0.40821073], [0.26862954, 0.26130258, 0.27577711]  # OpenAI CLIP's (LLaVA, Qwen2-VL)

MARKER = M.mtmd_default_marker().decode()  # "<__media__>"

# Gemma 3 (gemma3:4b's shapes, shrunk): its head size is its own (key_length 256 there, not
# n_embd / n_head); no pattern key in its files, so llama.cpp's default of 6 holds: layers 0-4
# slide, layer 5 attends globally. A window shorter than the prompts, so that it matters.
GEMMA_HEAD_DIM, GEMMA_LAYER, GEMMA_WINDOW = 32, 6, 16
GEMMA_IMAGE, GEMMA_PATCH, GEMMA_POOL = 64, 4, 4  # 16 x 16 patches, average-pooled 4 x 4 (clip's default n_merge): 4 x 4 tokens
GEMMA_IMAGE_TOKENS = (GEMMA_IMAGE // GEMMA_PATCH // GEMMA_POOL) ** 2  # 16, whatever the image's size (gemma3:4b: 256)
SIGLIP_MEAN = SIGLIP_STD = [0.5, 0.5, 0.5]
GEMMA_SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>")  # at Gemma's ids 0..3
GEMMA_CONTROLS = ("<start_of_turn>", "<end_of_turn>", "<start_of_image>", "<end_of_image>")  # mtmd wraps an image in the last two
# google/gemma-3-4b-it's chat template (tokenizer_config.json); an image part renders as
# <start_of_image>, but a prompt here carries MARKER in its text, as llama-server's does
GEMMA3_TEMPLATE = """{{ bos_token }}
{%- if messages[0]['role'] == 'system' -%}
    {%- if messages[0]['content'] is string -%}
        {%- set first_user_prefix = messages[0]['content'] + '\n\n' -%}
    {%- else -%}
        {%- set first_user_prefix = messages[0]['content'][0]['text'] + '\n\n' -%}
    {%- endif -%}
    {%- set loop_messages = messages[1:] -%}
{%- else -%}
    {%- set first_user_prefix = "" -%}
    {%- set loop_messages = messages -%}
{%- endif -%}
{%- for message in loop_messages -%}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) -%}
        {{ raise_exception("Conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif -%}
    {%- if (message['role'] == 'assistant') -%}
        {%- set role = "model" -%}
    {%- else -%}
        {%- set role = message['role'] -%}
    {%- endif -%}
    {{ '<start_of_turn>' + role + '\n' + (first_user_prefix if loop.first else "") }}
    {%- if message['content'] is string -%}
        {{ message['content'] | trim }}
    {%- elif message['content'] is iterable -%}
        {%- for item in message['content'] -%}
            {%- if item['type'] == 'image' -%}
                {{ '<start_of_image>' }}
            {%- elif item['type'] == 'text' -%}
                {{ item['text'] | trim }}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{ raise_exception("Invalid content type") }}
    {%- endif -%}
    {{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
    {{'<start_of_turn>model\n'}}
{%- endif -%}
"""


# --- writers ---------------------------------------------------------------------------------


def text_vocabulary() -> tuple[list[str], list[int], list[str]]:
    """embedding_models' byte-level BPE plus Qwen2-VL's vision delimiters as control tokens."""
    tokens, types, merges = bpe_vocabulary(added=VISION_TOKENS)
    types[-len(VISION_TOKENS) :] = [int(TokenType.CONTROL)] * len(VISION_TOKENS)
    return tokens, types, merges


def tokenizer_metadata(w: GGUFWriter, add_bos: bool) -> None:
    """embedding_models' byte-level BPE, <|im_end|> the EOS; the BOS added (a llama's habit)
    or not (Qwen's)."""
    tokens, types, merges = text_vocabulary()
    bpe_metadata(w, tokens, types, merges, tokens.index("<|im_end|>"), add_eos=False, add_bos=add_bos)


def text_metadata(w: GGUFWriter, n_layer: int = TEXT_LAYER) -> None:
    w.add_context_length(TEXT_CTX)
    w.add_embedding_length(N_EMBD)
    w.add_feed_forward_length(TEXT_FF)
    w.add_block_count(n_layer)
    w.add_head_count(TEXT_HEAD)
    w.add_head_count_kv(TEXT_HEAD_KV)
    w.add_rope_dimension_count(TEXT_HEAD_DIM)
    w.add_layer_norm_rms_eps(1e-6)


def text_layers(w: GGUFWriter, r: RandomWeights, qkv_bias: bool) -> None:
    """The token embeddings (also the output head: no output.weight), the final norm, and
    each layer: RMSNorm, GQA q/k/v (with biases for Qwen2), SwiGLU. Matrices in F16, as a
    converter's f16 output (half the bytes); norms and biases in F32."""
    kv_dim = TEXT_HEAD_KV * TEXT_HEAD_DIM

    def matrix(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, r.matrix(rows, cols).astype(np.float16))  # [rows (out), cols (in)]

    w.add_tensor("token_embd.weight", r.embedding(len(text_vocabulary()[0])).astype(np.float16))  # [n_vocab, n_embd]
    w.add_tensor("output_norm.weight", r.norm())
    for i in range(TEXT_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.norm())
        for kind, rows in (("attn_q", N_EMBD), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            matrix(p + kind + ".weight", rows, N_EMBD)
            if qkv_bias:
                w.add_tensor(p + kind + ".bias", r.bias(rows))
        matrix(p + "attn_output.weight", N_EMBD, N_EMBD)
        w.add_tensor(p + "ffn_norm.weight", r.norm())
        matrix(p + "ffn_gate.weight", TEXT_FF, N_EMBD)
        matrix(p + "ffn_up.weight", TEXT_FF, N_EMBD)
        matrix(p + "ffn_down.weight", N_EMBD, TEXT_FF)


def write_llava_text(path: Path, seed: int = 0) -> Path:
    """The language half of the LLaVA pair: a llama whose tokenizer adds a BOS."""
    r = RandomWeights(seed)
    w = GGUFWriter(str(path), "llama")
    w.add_name("tiny-llava-text")
    text_metadata(w)
    w.add_rope_freq_base(10000.0)
    tokenizer_metadata(w, add_bos=True)
    text_layers(w, r, qkv_bias=False)
    finish(w)
    return path


def write_qwen2vl_text(path: Path, seed: int = 0) -> Path:
    """The language half of the Qwen2-VL pair: arch qwen2vl, whose rope type is M-RoPE, so
    mtmd positions its image tokens in 2-D."""
    r = RandomWeights(seed)
    w = GGUFWriter(str(path), "qwen2vl")
    w.add_name("tiny-qwen2vl-text")
    text_metadata(w)
    w.add_rope_freq_base(1e6)
    w.add_rope_dimension_sections(MROPE_SECTIONS)
    tokenizer_metadata(w, add_bos=False)
    text_layers(w, r, qkv_bias=True)
    finish(w)
    return path


def clip_metadata(
    w: GGUFWriter, projector: str, image_size: int, eps: float, text_width: int,
    patch: int = PATCH, mean: Sequence[float] = CLIP_MEAN, std: Sequence[float] = CLIP_STD,
) -> None:  # fmt: skip
    """What MmprojModel.set_gguf_parameters (and the legacy LLaVA converter) write."""
    w.add_type("mmproj")
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(projector)
    w.add_vision_projection_dim(text_width)
    w.add_vision_image_size(image_size)
    w.add_vision_patch_size(patch)
    w.add_vision_embedding_length(VISION_EMBD)
    w.add_vision_feed_forward_length(VISION_FF)
    w.add_vision_block_count(VISION_LAYER)
    w.add_vision_head_count(VISION_HEAD)
    w.add_vision_attention_layernorm_eps(eps)
    w.add_vision_image_mean(list(mean))
    w.add_vision_image_std(list(std))


def patch_kernel(r: RandomWeights, patch: int = PATCH) -> np.ndarray:
    """A patch embedding's Conv2D kernel [out = VISION_EMBD, in = 3, patch, patch], in F16
    as the converters write 4-D kernels."""
    return (r.rng.standard_normal((VISION_EMBD, 3, patch, patch)) / np.sqrt(3 * patch * patch)).astype(np.float16)


def vision_block(w: GGUFWriter, r: RandomWeights, i: int, fc1_name: str, fc2_name: str) -> None:
    """One ViT block, every product with its bias: ln1, q/k/v, attn_out, ln2, fc1 [ff, embd]
    stored under `fc1_name`, fc2 [embd, ff] under `fc2_name`."""
    p = f"v.blk.{i}."
    for norm in ("ln1", "ln2"):
        w.add_tensor(p + norm + ".weight", r.norm(VISION_EMBD))
        w.add_tensor(p + norm + ".bias", r.bias(VISION_EMBD))
    for kind in ("attn_q", "attn_k", "attn_v", "attn_out"):
        w.add_tensor(p + kind + ".weight", r.matrix(VISION_EMBD, VISION_EMBD))
        w.add_tensor(p + kind + ".bias", r.bias(VISION_EMBD))
    w.add_tensor(p + fc1_name + ".weight", r.matrix(VISION_FF, VISION_EMBD))
    w.add_tensor(p + fc1_name + ".bias", r.bias(VISION_FF))
    w.add_tensor(p + fc2_name + ".weight", r.matrix(VISION_EMBD, VISION_FF))
    w.add_tensor(p + fc2_name + ".bias", r.bias(VISION_EMBD))


def write_mlp_projector(path: Path, seed: int = 0, text_width: int = N_EMBD) -> Path:
    """LLaVA-1.5's projector ("mlp") for write_llava_text, as the legacy
    convert_image_encoder_to_gguf names CLIP's tensors (mlp.fc1 -> ffn_down, mlp.fc2 ->
    ffn_up; no post-LayerNorm), with quick-GELU (use_gelu false) in the ViT. Its output is
    `text_width` wide: another width than the text model's is a pair mtmd refuses."""
    r = RandomWeights(seed)
    n_pos = LLAVA_IMAGE_TOKENS + 1  # the patches and the class embedding
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-llava-mmproj")
    w.add_description("image encoder for LLaVA")
    clip_metadata(w, "mlp", LLAVA_IMAGE, eps=1e-5, text_width=text_width)
    w.add_bool("clip.has_text_encoder", False)
    w.add_bool("clip.has_llava_projector", True)
    w.add_vision_use_gelu(False)
    w.add_tensor("v.class_embd", r.bias(VISION_EMBD))
    w.add_tensor("v.patch_embd.weight", patch_kernel(r))
    w.add_tensor("v.position_embd.weight", (0.5 * r.rng.standard_normal((n_pos, VISION_EMBD))).astype(np.float32))
    w.add_tensor("v.pre_ln.weight", r.norm(VISION_EMBD))
    w.add_tensor("v.pre_ln.bias", r.bias(VISION_EMBD))
    for i in range(VISION_LAYER):
        vision_block(w, r, i, fc1_name="ffn_down", fc2_name="ffn_up")
    w.add_tensor("mm.0.weight", r.matrix(text_width, VISION_EMBD))  # multi_modal_projector.linear_1, then GELU
    w.add_tensor("mm.0.bias", r.bias(text_width))
    w.add_tensor("mm.2.weight", r.matrix(text_width, text_width))  # linear_2: its rows are the width mtmd checks
    w.add_tensor("mm.2.bias", r.bias(text_width))
    finish(w)
    return path


def write_qwen2vl_projector(path: Path, seed: int = 0) -> Path:
    """Qwen2-VL's projector ("qwen2vl_merger") for write_qwen2vl_text, as Qwen2VLVisionModel
    converts it: no class embedding, no positions table (the ViT's rope is M-RoPE), no patch
    bias, the two temporal halves of the Conv3D as two kernels, mlp.fc1 -> ffn_up."""
    r = RandomWeights(seed)
    merged = VISION_EMBD * QWEN_MERGE**2  # the merger's input: 2 x 2 patches side by side
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-qwen2vl-mmproj")
    clip_metadata(w, "qwen2vl_merger", 560, eps=1e-6, text_width=N_EMBD)  # 560: the converter's default image_size
    w.add_tensor("v.patch_embd.weight", patch_kernel(r))  # frame 0 of the temporal patch
    w.add_tensor("v.patch_embd.weight.1", patch_kernel(r))  # frame 1 (a still image feeds both)
    for i in range(VISION_LAYER):
        vision_block(w, r, i, fc1_name="ffn_up", fc2_name="ffn_down")
    w.add_tensor("v.post_ln.weight", r.norm(VISION_EMBD))  # merger.ln_q
    w.add_tensor("v.post_ln.bias", r.bias(VISION_EMBD))
    w.add_tensor("mm.0.weight", r.matrix(merged, merged))  # merger.mlp.0, then GELU
    w.add_tensor("mm.0.bias", r.bias(merged))
    w.add_tensor("mm.2.weight", r.matrix(N_EMBD, merged))  # merger.mlp.2
    w.add_tensor("mm.2.bias", r.bias(N_EMBD))
    finish(w)
    return path


def gemma_vocabulary() -> tuple[list[str], list[float], list[int]]:
    """A SentencePiece vocabulary as _set_vocab_sentencepiece converts Gemma's: pad, eos, bos,
    unk at Gemma's ids (unk UNKNOWN, the others CONTROL), the turn and image delimiters
    (CONTROL: tokenizer_config's special added tokens), the 256 byte pieces (BYTE: any text
    falls back to them), then single characters and, for each word in WORDS, the pieces that
    build "\u2581word" one character at a time. A piece's score is minus its place: llama.cpp's
    SPM tokenizer merges the best-scored pair first."""
    tokens = [*GEMMA_SPECIALS, *GEMMA_CONTROLS, *(f"<0x{b:02X}>" for b in range(256))]
    types = [int(TokenType.CONTROL)] * len(tokens)
    types[GEMMA_SPECIALS.index("<unk>")] = int(TokenType.UNKNOWN)
    types[-256:] = [int(TokenType.BYTE)] * 256
    pieces: dict[str, None] = dict.fromkeys(["\u2581", *"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789", *PUNCTUATION])
    for word in WORDS:
        pieces.update((("\u2581" + word)[: n + 1], None) for n in range(1, len(word) + 1))
    tokens += list(pieces)
    types += [int(TokenType.NORMAL)] * len(pieces)
    scores = [0.0] * (len(tokens) - len(pieces)) + [-float(i) for i in range(len(pieces))]
    return tokens, scores, types


def write_gemma3_text(path: Path, seed: int = 0) -> Path:
    """The language half of the Gemma 3 pair, as Gemma3Model converts gemma-3-4b-it: arch
    gemma3, its SentencePiece vocabulary (BOS added, no space prefix) and chat template, q/k
    RMSNorm per head, a norm after attention and after the GeGLU FFN, no output head (the
    embeddings', which llama.cpp scales by sqrt(n_embd), except an image's rows), the
    converter's +1 already in every norm, 5 sliding-window layers and a global one."""
    r = RandomWeights(seed)
    tokens, scores, types = gemma_vocabulary()
    q_dim, kv_dim = TEXT_HEAD * GEMMA_HEAD_DIM, TEXT_HEAD_KV * GEMMA_HEAD_DIM
    w = GGUFWriter(str(path), "gemma3")
    w.add_name("tiny-gemma3-text")
    text_metadata(w, n_layer=GEMMA_LAYER)
    w.add_key_length(GEMMA_HEAD_DIM)
    w.add_value_length(GEMMA_HEAD_DIM)
    w.add_rope_freq_base(1e6)  # the global layers'
    w.add_rope_freq_base_swa(1e4)  # the sliding ones'
    w.add_rope_scaling_type(RopeScalingType.LINEAR)
    w.add_rope_scaling_factor(8.0)
    w.add_sliding_window(GEMMA_WINDOW)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_add_space_prefix(False)
    for name, add in (("bos", w.add_bos_token_id), ("eos", w.add_eos_token_id), ("unk", w.add_unk_token_id), ("pad", w.add_pad_token_id)):
        add(tokens.index(f"<{name}>"))
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    w.add_chat_template(GEMMA3_TEMPLATE)

    def matrix(name: str, rows: int, cols: int) -> None:
        w.add_tensor(name, r.matrix(rows, cols).astype(np.float16))  # [rows (out), cols (in)]

    w.add_tensor("token_embd.weight", r.embedding(len(tokens), scale=1 / np.sqrt(N_EMBD)).astype(np.float16))  # [n_vocab, n_embd]
    w.add_tensor("output_norm.weight", r.norm())
    for i in range(GEMMA_LAYER):
        p = f"blk.{i}."
        w.add_tensor(p + "attn_norm.weight", r.norm())
        for kind, rows in (("attn_q", q_dim), ("attn_k", kv_dim), ("attn_v", kv_dim)):
            matrix(p + kind + ".weight", rows, N_EMBD)
        w.add_tensor(p + "attn_q_norm.weight", r.norm(GEMMA_HEAD_DIM))
        w.add_tensor(p + "attn_k_norm.weight", r.norm(GEMMA_HEAD_DIM))
        matrix(p + "attn_output.weight", N_EMBD, q_dim)
        w.add_tensor(p + "post_attention_norm.weight", r.norm())
        w.add_tensor(p + "ffn_norm.weight", r.norm())
        matrix(p + "ffn_gate.weight", TEXT_FF, N_EMBD)
        matrix(p + "ffn_up.weight", TEXT_FF, N_EMBD)
        matrix(p + "ffn_down.weight", N_EMBD, TEXT_FF)
        w.add_tensor(p + "post_ffw_norm.weight", r.norm())
    finish(w)
    return path


def write_gemma3_projector(path: Path, seed: int = 0) -> Path:
    """Gemma 3's projector ("gemma3") for write_gemma3_text, as Gemma3VisionModel converts it:
    a SigLIP ViT (a patch bias, learned positions, no class embedding and no pre-LayerNorm,
    GELU, mlp.fc1 -> ffn_up, post_layernorm -> v.post_ln), then clip's 4 x 4 average pool,
    mm.soft_emb_norm (an RMSNorm, the converter's +1 in it) and mm.input_projection, stored
    [vision width, text width] as HF's parameter is (F16, as the converter forces it). A fixed
    64 x 64 input: GEMMA_IMAGE_TOKENS tokens per image, whatever its size."""
    r = RandomWeights(seed)
    n_patches = (GEMMA_IMAGE // GEMMA_PATCH) ** 2
    w = GGUFWriter(str(path), "clip")
    w.add_name("tiny-gemma3-mmproj")
    clip_metadata(w, "gemma3", GEMMA_IMAGE, eps=1e-6, text_width=N_EMBD, patch=GEMMA_PATCH, mean=SIGLIP_MEAN, std=SIGLIP_STD)
    w.add_vision_use_gelu(True)  # no projector scale factor: 4, clip's default, is not written
    w.add_tensor("v.patch_embd.weight", patch_kernel(r, GEMMA_PATCH))
    w.add_tensor("v.patch_embd.bias", r.bias(VISION_EMBD))
    w.add_tensor("v.position_embd.weight", (0.5 * r.rng.standard_normal((n_patches, VISION_EMBD))).astype(np.float32))
    for i in range(VISION_LAYER):
        vision_block(w, r, i, fc1_name="ffn_up", fc2_name="ffn_down")
    w.add_tensor("v.post_ln.weight", r.norm(VISION_EMBD))
    w.add_tensor("v.post_ln.bias", r.bias(VISION_EMBD))
    w.add_tensor("mm.soft_emb_norm.weight", r.norm(VISION_EMBD))
    w.add_tensor("mm.input_projection.weight", np.ascontiguousarray(r.matrix(N_EMBD, VISION_EMBD).T).astype(np.float16))  # [vision, text]
    finish(w)
    return path


PAIRS = {
    "llava": (write_llava_text, write_mlp_projector),
    "qwen2vl": (write_qwen2vl_text, write_qwen2vl_projector),
    "gemma3": (write_gemma3_text, write_gemma3_projector),
}


def write_pair(folder: Path, name: str, seed: int = 0) -> tuple[Path, Path]:
    """(text model, projector) of PAIRS[name], named as llama.cpp's converter names them."""
    write_text, write_projector = PAIRS[name]
    return write_text(folder / f"tiny-{name}.gguf", seed), write_projector(folder / f"mmproj-tiny-{name}.gguf", seed)


def qwen2vl_grid(height: int, width: int) -> tuple[int, int]:
    """(rows, columns) of tokens for an image already a multiple of 28 on each side and
    within 8 to 4096 tokens, where mtmd's smart resize keeps its size."""
    side = PATCH * QWEN_MERGE
    if height % side or width % side or not 8 <= (height // side) * (width // side) <= 4096:
        raise ValueError(f"{height} x {width}: the grid is only this simple for multiples of {side} making 8 to 4096 tokens")
    return height // side, width // side


# --- images ------------------------------------------------------------------------------------


def sample_image(height: int, width: int, seed: int) -> np.ndarray:
    """[height, width, 3] uint8: smooth colour gradients plus noise, different for each seed."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width] / max(height, width)
    phase = rng.uniform(0, 2 * np.pi, 3)
    base = np.stack([np.sin(3 * x + 2 * y + p) for p in phase], axis=-1)
    pixels = 127.5 + 100 * base + 20 * rng.standard_normal((height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def png_bytes(image: np.ndarray) -> bytes:
    """An 8-bit RGB PNG of [height, width, 3] uint8 pixels (no filter, one IDAT chunk)."""
    height, width, _ = image.shape

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + np.ascontiguousarray(image[row], dtype=np.uint8).tobytes() for row in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)  # depth 8, colour type 2 (RGB)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


# --- the reference: llama.cpp's mtmd as llama-mtmd-cli runs it ----------------------------------


@dataclass(frozen=True)
class ChunkInfo:
    """One of mtmd_tokenize's chunks: text (its tokens) or an image (its grid)."""

    kind: str  # "text" or "image"
    n_tokens: int  # KV cells it fills
    n_pos: int  # positions it advances: n_tokens, but max(nx, ny) for an M-RoPE image
    tokens: tuple[int, ...] = ()  # a text chunk's
    nx: int = 0  # an image chunk's token columns (LLaVA's: all 16 in one row)
    ny: int = 0  # and rows


@contextmanager
def vision_context(model_path: Path, mmproj_path: Path) -> Iterator[tuple[C.llama_model_p, C.llama_context_p, M.mtmd_context_p]]:
    """The text model with a generative context over its trained length, and mtmd's context
    for the projector, mtmd's log going where llama.cpp's does; all freed on the way out."""
    _init_once(False)
    M.mtmd_helper_log_set(_on_log, ctypes.c_void_p(0))  # also sets mtmd_log_set: clip's lines
    with llama_context(model_path, "none", logits=True) as (model, ctx, _):
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = THREADS
        params.print_timings = False
        mctx = M.mtmd_init_from_file(os.fsencode(mmproj_path), model, params)
        if not mctx:
            raise RuntimeError(f"mtmd could not load {mmproj_path}: {last_error() or 'unknown error'}")
        try:
            yield model, ctx, mctx
        finally:
            M.mtmd_free(mctx)


@contextmanager
def rgb_bitmaps(images: Sequence[np.ndarray]) -> Iterator[list[M.mtmd_bitmap_p]]:
    """An mtmd bitmap (a copy) of each [height, width, 3] uint8 image, freed on the way out."""
    bitmaps = []
    try:
        for image in images:
            if image.ndim != 3 or image.shape[2] != 3 or image.dtype != np.uint8:
                raise ValueError(f"an image is [height, width, 3] uint8, not {image.shape} {image.dtype}")
            pixels = np.ascontiguousarray(image)
            bitmap = M.mtmd_bitmap_init(image.shape[1], image.shape[0], pixels.ctypes.data_as(ctypes.POINTER(ctypes.c_uint8)))
            if not bitmap:
                raise RuntimeError("mtmd_bitmap_init failed")
            bitmaps.append(bitmap)
        yield bitmaps
    finally:
        for bitmap in bitmaps:
            M.mtmd_bitmap_free(bitmap)


@contextmanager
def file_bitmap(mctx: M.mtmd_context_p, data: bytes) -> Iterator[M.mtmd_bitmap_p]:
    """mtmd's helper decoding an image file's bytes (stb_image: PNG, JPEG, ...), freed on the way out."""
    buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
    bitmap = M.mtmd_helper_bitmap_init_from_buf(mctx, buffer, len(data), False)
    if not bitmap:
        raise ValueError(f"mtmd could not decode the image: {last_error() or 'unknown error'}")
    try:
        yield bitmap
    finally:
        M.mtmd_bitmap_free(bitmap)


@contextmanager
def tokenized(mctx: M.mtmd_context_p, prompt: str, bitmaps: Sequence[M.mtmd_bitmap_p]) -> Iterator[M.mtmd_input_chunks_p]:
    """mtmd_tokenize's chunks of `prompt`, one bitmap per MARKER, BOS as the vocabulary adds
    it and special tokens parsed; freed on the way out."""
    data = prompt.encode("utf-8")
    text = M.mtmd_input_text(text=data, text_len=len(data), add_special=True, parse_special=True)
    array = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
    chunks = M.mtmd_input_chunks_init()
    try:
        rc = M.mtmd_tokenize(mctx, chunks, ctypes.byref(text), array, len(bitmaps))
        if rc != 0:  # markers and bitmaps differ in number (2, from the tokenizer's exception), an image failed to preprocess
            raise ValueError(f"mtmd_tokenize returned {rc}: {last_error() or 'unknown error'}")
        yield chunks
    finally:
        M.mtmd_input_chunks_free(chunks)


def chunk_layout(chunks: M.mtmd_input_chunks_p) -> list[ChunkInfo]:
    """What each chunk holds, in order."""
    out = []
    for i in range(M.mtmd_input_chunks_size(chunks)):
        chunk = M.mtmd_input_chunks_get(chunks, i)
        n_tokens, n_pos = M.mtmd_input_chunk_get_n_tokens(chunk), M.mtmd_input_chunk_get_n_pos(chunk)
        kind = M.mtmd_input_chunk_get_type(chunk)
        if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
            count = ctypes.c_size_t()
            tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            out.append(ChunkInfo("text", n_tokens, n_pos, tuple(tokens[: count.value])))
        elif kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            image = M.mtmd_input_chunk_get_tokens_image(chunk)
            out.append(ChunkInfo("image", n_tokens, n_pos, nx=M.mtmd_image_tokens_get_nx(image), ny=M.mtmd_image_tokens_get_ny(image)))
        else:
            raise ValueError(f"chunk {i}: type {kind}, neither text nor image")
    return out


def eval_logits(ctx: C.llama_context_p, mctx: M.mtmd_context_p, chunks: M.mtmd_input_chunks_p) -> tuple[np.ndarray, int]:
    """The chunks through mtmd_helper_eval_chunks into sequence 0 of an emptied cache:
    ([n_vocab] logits of the last token, the position after it)."""
    layout = chunk_layout(chunks)
    if not layout or layout[-1].kind != "text":
        raise ValueError("the prompt must end in text: an image chunk's tokens give no logits")
    C.llama_memory_clear(C.llama_get_memory(ctx), True)
    n_past = C.llama_pos(0)
    rc = M.mtmd_helper_eval_chunks(mctx, ctx, chunks, 0, 0, C.llama_n_batch(ctx), True, ctypes.byref(n_past))
    if rc != 0:
        raise RuntimeError(f"mtmd_helper_eval_chunks returned {rc}: {last_error() or 'unknown error'}")
    n_vocab = C.llama_vocab_n_tokens(C.llama_model_get_vocab(C.llama_get_model(ctx)))
    logits = np.ctypeslib.as_array(C.llama_get_logits_ith(ctx, -1), shape=(n_vocab,)).copy()
    return logits, n_past.value


def llamacpp_vision_logits(model_path: Path, mmproj_path: Path, prompt: str, images: Sequence[np.ndarray]) -> np.ndarray:
    """[n_vocab]: llama.cpp's logits after `prompt`, each MARKER in it standing for the next
    of `images` ([height, width, 3] uint8 RGB), the prompt's BOS added as the model adds it."""
    with vision_context(model_path, mmproj_path) as (_, ctx, mctx), rgb_bitmaps(images) as bitmaps, tokenized(mctx, prompt, bitmaps) as chunks:
        return eval_logits(ctx, mctx, chunks)[0]
