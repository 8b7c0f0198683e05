"""Images through llama.cpp's multimodal library (mtmd, shipped in the llama-cpp-python wheel
with its bindings): the projector's context beside a text model's, a prompt with image
markers cut into text and image chunks, and an image chunk encoded by the projector and
decoded into one sequence of the text model's cache at its positions (M-RoPE's 2-D ones for
Qwen-VL, attention over the whole image where the model wants it, as mtmd's helper does).
"""

from __future__ import annotations

import ctypes
import hashlib
import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path

from llama_cpp import llama_cpp as C
from llama_cpp import mtmd_cpp as M

from localinfer.backends.base import MEDIA_MARKER, MediaChunk
from localinfer.errors import BackendError, UserError

assert M.mtmd_default_marker().decode() == MEDIA_MARKER, "mtmd's marker changed: MEDIA_MARKER must follow it"


class OwnedChunk:
    """An image chunk copied out of mtmd_tokenize's list, freed with this object."""

    def __init__(self, chunk: M.mtmd_input_chunk_p) -> None:
        self.ptr = M.mtmd_input_chunk_copy(chunk)

    def __del__(self) -> None:
        if getattr(self, "ptr", None):
            M.mtmd_input_chunk_free(self.ptr)
            self.ptr = None


class Mtmd:
    """mtmd's context for one text model and its projector file (projector.py describes the file)."""

    def __init__(self, model: C.llama_model_p, path: Path, n_threads: int, use_gpu: bool, last_error: Callable[[], str], log: object) -> None:
        """`log`: llama.cpp's log callback, which mtmd's and clip's lines then go through too
        (`last_error` reads them)."""
        self._last_error = last_error
        M.mtmd_helper_log_set(log, ctypes.c_void_p(0))
        params = M.mtmd_context_params_default()
        params.use_gpu = use_gpu
        params.n_threads = n_threads
        params.print_timings = False
        self._ctx = M.mtmd_init_from_file(os.fsencode(path), model, params)
        if not self._ctx:
            raise BackendError(f"llama.cpp could not load the projector {path.name}: {last_error() or 'unknown error'}")
        if not M.mtmd_support_vision(self._ctx):
            self.close()
            raise BackendError(f"{path.name} is a projector without a vision encoder: it cannot read images")

    def chunks(self, text: str, images: Sequence[bytes]) -> list[list[int] | MediaChunk]:
        """The prompt's text tokens and image chunks, in order (Backend.media_chunks)."""
        if text.count(MEDIA_MARKER) != len(images):
            raise UserError(f"the prompt marks {text.count(MEDIA_MARKER)} images but {len(images)} were given")
        with ExitStack() as stack:
            bitmaps = [stack.enter_context(self._bitmap(data, i)) for i, data in enumerate(images)]
            chunks = stack.enter_context(self._tokenized(text, bitmaps))
            return [self._piece(M.mtmd_input_chunks_get(chunks, i)) for i in range(M.mtmd_input_chunks_size(chunks))]

    def decode(self, lctx: C.llama_context_p, chunk: MediaChunk, seq_id: int, position: int, n_batch: int) -> None:
        """Encode an image chunk and decode its embeddings into sequence seq_id at `position`."""
        if M.mtmd_decode_use_non_causal(self._ctx, chunk.handle.ptr) and chunk.n_tokens > C.llama_n_ubatch(lctx):  # llama.cpp would abort the process
            raise UserError(f"an image of {chunk.n_tokens} tokens attends to itself whole, which needs a batch of as many; this context's is {C.llama_n_ubatch(lctx)}")
        after = C.llama_pos(0)
        rc = M.mtmd_helper_eval_chunk_single(self._ctx, lctx, chunk.handle.ptr, position, seq_id, n_batch, False, ctypes.byref(after))
        if rc != 0:
            raise BackendError(f"llama.cpp could not encode an image (mtmd returned {rc}): {self._last_error() or 'unknown error'}")

    @contextmanager
    def _bitmap(self, data: bytes, index: int) -> Iterator[M.mtmd_bitmap_p]:
        buffer = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self._ctx, buffer, len(data), False)
        if not bitmap:
            raise UserError(f"image {index + 1} could not be decoded (PNG, JPEG, WebP, GIF, BMP are read): {self._last_error() or 'not an image'}")
        try:
            M.mtmd_bitmap_set_id(bitmap, hashlib.sha256(data).hexdigest().encode())
            yield bitmap
        finally:
            M.mtmd_bitmap_free(bitmap)

    @contextmanager
    def _tokenized(self, text: str, bitmaps: Sequence[M.mtmd_bitmap_p]) -> Iterator[M.mtmd_input_chunks_p]:
        data = text.encode("utf-8")
        arg = M.mtmd_input_text(text=data, text_len=len(data), add_special=True, parse_special=True)
        array = (M.mtmd_bitmap_p_ctypes * max(1, len(bitmaps)))(*bitmaps)
        chunks = M.mtmd_input_chunks_init()
        try:
            rc = M.mtmd_tokenize(self._ctx, chunks, ctypes.byref(arg), array, len(bitmaps))
            if rc != 0:
                raise UserError(f"llama.cpp could not prepare the images (mtmd returned {rc}): {self._last_error() or 'unknown error'}")
            yield chunks
        finally:
            M.mtmd_input_chunks_free(chunks)

    @staticmethod
    def _piece(chunk: M.mtmd_input_chunk_p) -> list[int] | MediaChunk:
        kind = M.mtmd_input_chunk_get_type(chunk)
        if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
            count = ctypes.c_size_t()
            tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(count))
            return [int(t) for t in tokens[: count.value]]
        if kind != M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
            raise UserError("only images are read: this projector made an audio chunk")
        key = (M.mtmd_input_chunk_get_id(chunk) or b"").decode()
        return MediaChunk(key, M.mtmd_input_chunk_get_n_tokens(chunk), M.mtmd_input_chunk_get_n_pos(chunk), OwnedChunk(chunk))

    def close(self) -> None:
        if self._ctx:
            M.mtmd_free(self._ctx)
            self._ctx = None
