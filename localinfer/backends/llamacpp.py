"""The llama.cpp backend, on llama-cpp-python's low-level C API.

We drive `llama_decode` with our own `llama_batch` so that several sequences can share
one context (the server batches requests); the high-level `Llama` class is single-sequence
and samples on its own, which the runtime does above every backend instead.
"""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from localinfer.backends.base import Backend, Batch, Capabilities, LoadParams, MediaChunk, ModelFacts, VocabInfo
from localinfer.errors import BackendError, ContextOverflow, UserError
from localinfer.experts import expert_patterns
from localinfer.kvtypes import KV_TYPES, ggml_id
from localinfer.modelfile import pooling_of

import llama_cpp as C  # noqa: E402  (after our imports: its import loads the shared library)

from localinfer.backends.mtmd import Mtmd  # noqa: E402  (mtmd's bindings load after llama.cpp's)

_log_lines: list[str] = []
_listeners: list[Callable[[str], None]] = []
_verbose = False


@C.llama_log_callback
def _on_log(level: int, text: bytes, user_data: ctypes.c_void_p) -> None:
    """Keep llama.cpp quiet unless --verbose, but remember recent lines for error messages."""
    line = text.decode("utf-8", errors="replace")
    _log_lines.append(line)
    del _log_lines[:-50]
    for listener in _listeners:
        listener(line)
    if _verbose:
        os.write(2, text)


@contextmanager
def _ctrl_c_after_the_call() -> Iterator[None]:
    """Hold a Ctrl-C that lands while llama.cpp works until its call returns. Python runs a
    signal's handler at the next Python code it reaches, which inside the call is `_on_log`;
    a KeyboardInterrupt raised there cannot reach our caller (ctypes prints 'Exception
    ignored' and llama.cpp carries on, so an interrupted load went on to answer). So the
    handler only notes the signal meanwhile, and it is raised again once the call is over."""
    previous = signal.getsignal(signal.SIGINT)
    held: list[int] = []
    try:
        if callable(previous):  # SIG_DFL and SIG_IGN act in C, without running Python code
            signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    except ValueError:  # not the main thread, which alone runs Python's handlers: nothing to hold
        previous = None
    try:
        yield
    finally:
        if callable(previous):
            signal.signal(signal.SIGINT, previous)
        if held:
            signal.raise_signal(signal.SIGINT)  # to the caller's handler: KeyboardInterrupt, as a rule


_initialised = False


def _init_once(verbose: bool) -> None:
    global _initialised, _verbose
    _verbose = verbose
    if not _initialised:
        C.llama_log_set(_on_log, ctypes.c_void_p(0))
        with _ctrl_c_after_the_call():
            C.llama_backend_init()
        _initialised = True


def system_info() -> str:
    """llama.cpp's build and CPU feature line, e.g. 'CPU : SSE3 = 1 | AVX2 = 1 | ...'."""
    return C.llama_print_system_info().decode("utf-8", errors="replace")


def supports_gpu_offload() -> bool:
    """Was a GPU backend compiled in? Not llama_supports_gpu_offload(), which the RPC backend
    (in every build of install.sh) makes true on a CPU-only build."""
    from localinfer.devices import backends, gpu_backends

    return bool(gpu_backends(backends()))


def supports_rpc() -> bool:
    """Was this llama.cpp built with its RPC backend (install.sh: -DGGML_RPC=ON)?"""
    from localinfer.devices import ggml, rpc_function

    lib = ggml()
    return bool(lib and rpc_function(lib, "ggml_backend_rpc_add_server"))


def rpc_devices(split: tuple[tuple[str, int], ...]) -> tuple[ctypes.Array, ctypes.Array]:
    """llama_model_params' NULL-terminated device list (each worker's first device, in
    order) and tensor_split (each one's layer count), for llama.cpp to split the offloaded
    layers by."""
    from localinfer.devices import NO_RPC, ggml, rpc_function

    lib = ggml()
    address = rpc_function(lib, "ggml_backend_rpc_add_server") if lib else None
    if not address:
        raise BackendError(NO_RPC)
    add_server = ctypes.CFUNCTYPE(ctypes.c_void_p, ctypes.c_char_p)(address)
    devices = [lib.ggml_backend_reg_dev_get(add_server(endpoint.encode()), 0) for endpoint, _ in split]
    weights = [float(n) for _, n in split] + [0.0] * (C.llama_max_devices() - len(split))
    return (ctypes.c_void_p * (len(devices) + 1))(*devices, None), (ctypes.c_float * len(weights))(*weights)


class TensorBuftOverride(ctypes.Structure):
    """llama.h's llama_model_tensor_buft_override, which llama-cpp-python leaves unbound
    (its llama_model_params types the field as a bare pointer): tensors whose names match
    `pattern` (a std::regex, searched) go to buffer type `buft`."""

    _fields_ = [("pattern", ctypes.c_char_p), ("buft", ctypes.c_void_p)]


def cpu_overrides(n_cpu_moe: int) -> tuple[ctypes.Array, list[bytes]] | None:
    """llama_model_params.tensor_buft_overrides that keep a mixture of experts' experts in
    RAM (LoadParams.n_cpu_moe): each of experts.expert_patterns with ggml's CPU buffer type,
    as llama.cpp's --cpu-moe / --n-cpu-moe make them, then {NULL, NULL}. With the patterns'
    bytes: both must outlive the model (llama.cpp keeps the pointer and reads it again
    while it loads); None where no expert is kept back."""
    from localinfer.devices import ggml

    patterns = [p.encode() for p in expert_patterns(n_cpu_moe)]
    if not patterns:
        return None
    lib = ggml()
    if lib is None:
        raise BackendError("--cpu-moe / --n-cpu-moe need ggml's library beside llama.cpp's, and this llama-cpp-python has none")
    lib.ggml_backend_cpu_buffer_type.restype = ctypes.c_void_p
    cpu = lib.ggml_backend_cpu_buffer_type()
    return (TensorBuftOverride * (len(patterns) + 1))(*[(p, cpu) for p in patterns], (None, None)), patterns


@contextmanager
def log_listener(listener: Callable[[str], None]) -> Iterator[None]:
    """Also hand every llama.cpp log line to `listener` (the quantizer's progress)."""
    _init_once(False)
    _log_lines.clear()
    _listeners.append(listener)
    try:
        yield
    finally:
        _listeners.remove(listener)


def last_error() -> str:
    """The last line of llama.cpp's log that reports an error, for a one-line message."""
    errors = [line.strip() for line in _log_lines if "error" in line.lower() or "failed" in line.lower()]
    return errors[-1] if errors else ""


class LlamaTokenized:
    """The tokenizer half of the Backend interface, answered by llama.cpp's vocabulary
    (`self._tok`); both engines use it, so they always agree on token ids."""

    _tok: Tokenizer
    _facts: ModelFacts

    @property
    def vocab(self) -> VocabInfo:
        return self._tokenizer().info

    @property
    def facts(self) -> ModelFacts:
        return self._facts

    def _tokenizer(self) -> Tokenizer:
        if self._tok is None:
            raise BackendError("the model is closed")
        return self._tok

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._tokenizer().tokenize(text, add_special, parse_special)

    def token_bytes(self, token: int) -> bytes:
        return self._tokenizer().token_bytes(token)


def context_params(params: LoadParams, causal: bool, pooling: str) -> C.llama_context_params:
    """llama.cpp's context for a load: one shared cache of n_seq_max sequences, or for an
    embedding model the rows' hidden states (or a reranker's scores) instead of logits."""
    cparams = C.llama_context_default_params()
    cparams.n_ctx = params.n_ctx * params.n_seq_max  # one shared pool: each sequence gets n_ctx of it
    cparams.n_batch = params.n_batch
    # An encoder attends over one ubatch, each sequence whole in it: one of its context at least
    cparams.n_ubatch = min(params.n_batch, 512 if causal else params.n_ctx)
    if pooling != "none":
        cparams.embeddings = True
        cparams.pooling_type = C.LLAMA_POOLING_TYPE_RANK if pooling == "rank" else C.LLAMA_POOLING_TYPE_NONE
    # One sequence id more than the slots, holding no cells of its own: kv_read and
    # kv_write pass a range through it, since llama.cpp saves and restores whole sequences.
    cparams.n_seq_max = params.n_seq_max + 1
    cparams.kv_unified = True  # sequences share one cache, so kv_copy shares cells instead of copying
    type_k, type_v = params.cache_types
    cparams.type_k, cparams.type_v = ggml_id(type_k), ggml_id(type_v)
    if type_v != "f16":
        cparams.flash_attn_type = C.LLAMA_FLASH_ATTN_TYPE_ENABLED  # llama.cpp reads a quantized V only in flash attention
    cparams.no_perf = True
    cparams.n_threads = cparams.n_threads_batch = params.n_threads or default_threads()
    return cparams


class LlamaCppBackend(LlamaTokenized, Backend):
    name = "llama.cpp"

    def __init__(self, path: Path, params: LoadParams) -> None:
        _init_once(params.verbose)
        self._model = None
        self._ctx = None
        self._batch = None
        self._projector: Mtmd | None = None
        self._path = path
        self._params = params

        mparams = C.llama_model_default_params()
        mparams.n_gpu_layers = params.n_gpu_layers
        # A build made with GGML_NATIVE on an AMX Xeon segfaults in the AMX matmul on the
        # first decode; the AMX kernels live in an "extra buffer type", so skip those.
        if "AMX_INT8 = 1" in system_info():
            mparams.use_extra_bufts = False
        if params.rpc_split:
            self._rpc = rpc_devices(params.rpc_split)  # kept: llama.cpp reads them during the load
            mparams.devices = ctypes.cast(self._rpc[0], ctypes.c_void_p)
            mparams.tensor_split = self._rpc[1]
        self._overrides = cpu_overrides(params.n_cpu_moe)  # kept with the model: llama.cpp holds the pointer
        if self._overrides is not None:
            mparams.tensor_buft_overrides = ctypes.cast(self._overrides[0], ctypes.c_void_p)
        _log_lines.clear()
        with _ctrl_c_after_the_call():
            self._model = C.llama_model_load_from_file(os.fsencode(path), mparams)
        if not self._model:
            raise BackendError(f"llama.cpp could not load {path}: {last_error() or 'unknown error'}")

        arch = model_meta(self._model, "general.architecture") or "unknown"
        causal = model_meta(self._model, f"{arch}.attention.causal") != "false"
        pooling = params.pooling or pooling_of(int_or_none(model_meta(self._model, f"{arch}.pooling_type")), causal)
        cparams = context_params(params, causal, pooling)
        self._scratch = params.n_seq_max  # see context_params
        threads = cparams.n_threads
        type_v = params.cache_types[1]
        with _ctrl_c_after_the_call():
            self._ctx = C.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            if type_v != "f16":
                raise BackendError(f"llama.cpp could not create a context with a {type_v} V cache, which needs flash attention; this build or device cannot do it there: use --cache-type-v f16 ({last_error() or 'no detail'})")
            raise BackendError(f"llama.cpp could not create a context of {cparams.n_ctx} tokens: {last_error()}")
        self._mem = C.llama_get_memory(self._ctx)  # None for an encoder: it keeps no cache
        self._n_batch = C.llama_n_batch(self._ctx) if causal else C.llama_n_ubatch(self._ctx)  # llama.cpp clamps it to n_ctx
        self._batch = C.llama_batch_init(self._n_batch, 0, 1)
        self._view_token = np.ctypeslib.as_array(self._batch.token, shape=(self._n_batch,))
        self._view_pos = np.ctypeslib.as_array(self._batch.pos, shape=(self._n_batch,))
        self._view_nseq = np.ctypeslib.as_array(self._batch.n_seq_id, shape=(self._n_batch,))
        self._view_logits = np.ctypeslib.as_array(self._batch.logits, shape=(self._n_batch,))
        self._seq_slots = [self._batch.seq_id[i] for i in range(self._n_batch)]
        self._view_nseq[:] = 1

        self._projector = Mtmd(self._model, params.mmproj, threads, params.n_gpu_layers > 0, last_error, _on_log) if params.mmproj else None
        self._tok = Tokenizer(self._model)
        self._n_vocab = self._tok.info.n_vocab
        self._views: dict[tuple[int | None, int | None], np.ndarray] = {}  # numpy views of llama.cpp's logits, by address and rows

        self._facts = ModelFacts(
            path=path,
            architecture=self._tok.meta("general.architecture") or "unknown",
            n_params=C.llama_model_n_params(self._model),
            n_ctx_train=C.llama_model_n_ctx_train(self._model),
            # one unified cache: each sequence gets an equal share, so that sequences
            # decoding at once can never fill it between them
            n_ctx=C.llama_n_ctx(self._ctx) // params.n_seq_max,
            n_seq_max=params.n_seq_max,
            n_layer=C.llama_model_n_layer(self._model),
            n_embd=C.llama_model_n_embd(self._model),
            chat_template=self._tok.chat_template,
            extra={"threads": str(threads), "gpu_layers": str(params.n_gpu_layers)},
            pooling=pooling,
            n_batch=self._n_batch,
            causal=causal,
        )

    @classmethod
    def capabilities(cls) -> Capabilities:
        return Capabilities(architectures=None, weight_types=None, kv_types=tuple(KV_TYPES), gpu_offload=supports_gpu_offload(), kv_layout="shared",
                            rpc=supports_rpc(), ranks=None, vision=True)  # fmt: skip

    @classmethod
    def load(cls, path: Path, params: LoadParams) -> LlamaCppBackend:
        return cls(path, params)

    # --- images ------------------------------------------------------------------
    def media_chunks(self, text: str, images: list[bytes]) -> list[list[int] | MediaChunk]:
        if self._projector is None:
            raise UserError(f"{self._path.name} reads no images: it was loaded without a projector (--mmproj FILE, or an mmproj-*.gguf beside it)")
        return self._projector.chunks(text, images)

    def forward_media(self, chunk: MediaChunk, seq_id: int, position: int) -> None:
        self._live()
        if self._projector is None:
            raise BackendError("this model was loaded without a projector")
        with _ctrl_c_after_the_call():
            self._projector.decode(self._ctx, chunk, seq_id, position, self._n_batch)

    # --- compute ---------------------------------------------------------------
    def _live(self) -> None:
        if not self._ctx:
            raise BackendError("the model is closed")

    def forward(self, batch: Batch) -> np.ndarray:
        if self._facts.pooling != "none":  # its context gives no logits (the engine refuses it a prompt first)
            raise BackendError("this is an embedding model: it gives vectors, not text")
        return self._decode(batch, self._n_vocab, lambda i: self._logits_view(C.llama_get_logits_ith(self._ctx, i)))

    def forward_transient(self, batch: Batch) -> np.ndarray:
        """The wanted rows as one view of llama_get_logits, which holds them contiguously in
        batch order until the next decode: no copy (a row of 152k logits cost 18 µs to copy,
        10 % of a token's loop on a GPU). A batch of several decode chunks is copied as by
        forward(), since each chunk's decode overwrites that buffer."""
        if len(batch) > self._n_batch:
            return self.forward(batch)
        self._live()
        self._decode_chunk(batch, 0, len(batch))
        n_out = int(np.count_nonzero(batch.want_logits))
        if not n_out:
            return np.empty((0, self._n_vocab), np.float32)
        return self._logits_view(C.llama_get_logits(self._ctx), n_out)

    def embed(self, batch: Batch) -> np.ndarray:
        """llama.cpp's embeddings output with pooling 'none' is the final hidden state of
        each wanted row. An embedding model's context gives them always; a generative
        model's returns to logits after."""
        n_embd, pooling = self._facts.n_embd, self._facts.pooling
        if pooling == "rank":
            raise BackendError("this is a reranking model: it scores pairs of texts, it gives no vectors")
        read = lambda i: np.ctypeslib.as_array(C.llama_get_embeddings_ith(self._ctx, i), shape=(n_embd,))  # noqa: E731
        if pooling != "none":
            return self._decode(batch, n_embd, read)
        C.llama_set_embeddings(self._ctx, True)
        try:
            return self._decode(batch, n_embd, read)
        finally:
            C.llama_set_embeddings(self._ctx, False)

    def rank(self, batch: Batch) -> np.ndarray:
        """The classifier's first output for each sequence (llama.cpp's rank pooling)."""
        if self._facts.pooling != "rank":
            return super().rank(batch)
        if len(batch) > self._n_batch:
            raise BackendError(f"a rerank batch of {len(batch)} tokens is more than the {self._n_batch} one forward takes")
        self._live()
        self._decode_chunk(batch, 0, len(batch))
        seqs = dict.fromkeys(batch.seq_ids.tolist())
        return np.array([C.llama_get_embeddings_seq(self._ctx, seq)[0] for seq in seqs], dtype=np.float32)

    def _decode(self, batch: Batch, width: int, read: Callable[[int], np.ndarray]) -> np.ndarray:
        self._live()
        n_out = int(np.count_nonzero(batch.want_logits))
        logits = np.empty((n_out, width), dtype=np.float32)
        row = 0
        for start in range(0, len(batch), self._n_batch):
            end = min(start + self._n_batch, len(batch))
            self._decode_chunk(batch, start, end)
            for i in np.flatnonzero(batch.want_logits[start:end]).tolist():
                logits[row] = read(i)
                row += 1
        return logits

    def _decode_chunk(self, batch: Batch, start: int, end: int) -> None:
        """llama_decode of rows start..end of the batch (at most n_batch of them)."""
        n = end - start
        self._view_token[:n] = batch.tokens[start:end]
        self._view_pos[:n] = batch.positions[start:end]
        self._view_logits[:n] = batch.want_logits[start:end]
        for i, seq in enumerate(batch.seq_ids[start:end].tolist()):
            self._seq_slots[i][0] = seq
        self._batch.n_tokens = n
        rc = C.llama_decode(self._ctx, self._batch)
        if rc == 1:
            raise ContextOverflow(f"the KV cache is full ({self._facts.n_ctx} tokens a sequence); raise --ctx")
        if rc != 0:
            raise BackendError(f"llama_decode failed with code {rc}: {last_error()}")

    def _logits_view(self, ptr: ctypes._Pointer, rows: int | None = None) -> np.ndarray:
        """A numpy view of llama.cpp's logits from `ptr`: one row, or `rows` of them; cached
        per address and shape (decode hot path)."""
        key = (ctypes.cast(ptr, ctypes.c_void_p).value, rows)
        view = self._views.get(key)
        if view is None:
            if len(self._views) > 4096:
                self._views.clear()
            view = self._views[key] = np.ctypeslib.as_array(ptr, shape=(self._n_vocab,) if rows is None else (rows, self._n_vocab))
        return view

    # --- KV cache ----------------------------------------------------------------
    def kv_clear(self, seq_id: int) -> None:
        self._live()
        if self._mem:  # an encoder keeps nothing between calls
            C.llama_memory_seq_rm(self._mem, seq_id, -1, -1)

    def kv_truncate(self, seq_id: int, n_keep: int) -> int:
        self._live()
        if not self._mem:
            return 0
        if C.llama_memory_seq_rm(self._mem, seq_id, n_keep, -1):
            return n_keep
        C.llama_memory_seq_rm(self._mem, seq_id, -1, -1)  # a cache that cannot cut a sequence short (recurrent state)
        return 0

    def kv_copy(self, src_seq: int, dst_seq: int, n_tokens: int) -> int:
        self._live()
        if not self._mem:
            return 0
        C.llama_memory_seq_cp(self._mem, src_seq, dst_seq, 0, n_tokens)
        return n_tokens

    def kv_read(self, seq_id: int, start: int, end: int) -> bytes:
        self._live()
        if not self._mem:
            return b""
        C.llama_memory_seq_rm(self._mem, self._scratch, -1, -1)
        C.llama_memory_seq_cp(self._mem, seq_id, self._scratch, start, end)  # the range's cells, shared, not copied
        try:
            size = C.llama_state_seq_get_size(self._ctx, self._scratch)
            buf = (ctypes.c_uint8 * size)()
            written = C.llama_state_seq_get_data(self._ctx, buf, size, self._scratch)
            return bytes(memoryview(buf)[:written])
        finally:
            C.llama_memory_seq_rm(self._mem, self._scratch, -1, -1)

    def kv_write(self, seq_id: int, start: int, data: bytes) -> int:
        self._live()
        if not self._mem:
            return start
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        try:
            read = C.llama_state_seq_set_data(self._ctx, buf, len(data), self._scratch)
            if read:  # 0: llama.cpp refused them (another type, or no room), the scratch sequence empty
                C.llama_memory_seq_cp(self._mem, self._scratch, seq_id, -1, -1)
        finally:
            C.llama_memory_seq_rm(self._mem, self._scratch, -1, -1)
        return C.llama_memory_seq_pos_max(self._mem, seq_id) + 1

    def close(self) -> None:
        """Free llama.cpp's memory; every later call raises BackendError instead of reaching it."""
        self._tok = None
        self._mem = None
        if self._projector is not None:
            self._projector.close()
            self._projector = None
        if self._batch is not None:
            C.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            C.llama_free(self._ctx)
            self._ctx = None
        if self._model:
            C.llama_model_free(self._model)
            self._model = None

    def __del__(self) -> None:
        self.close()


def model_meta(model: ctypes.c_void_p, key: str) -> str | None:
    """A metadata value of a loaded model as llama.cpp prints it, or None where it has none."""
    buf = ctypes.create_string_buffer(256)
    n = C.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def chat_template(model: ctypes.c_void_p, name: bytes | None) -> str | None:
    """The model's default chat template, or the one of that name (tokenizer.chat_template.NAME)."""
    template = C.llama_model_chat_template(model, name)
    return template.decode("utf-8", "replace") if template else None


def int_or_none(text: str | None) -> int | None:
    try:
        return int(text) if text is not None else None
    except ValueError:
        return None


class Tokenizer:
    """llama.cpp's tokenizer over a loaded model; the native engine loads only the vocabulary."""

    def __init__(self, model: ctypes.c_void_p, owned: bool = False) -> None:
        self._model, self._owned = model, owned
        self._vocab_p = vocab = C.llama_model_get_vocab(model)
        n_vocab = C.llama_vocab_n_tokens(vocab)
        self._piece_cache: dict[int, bytes] = {}

        def special_id(tok: int) -> int | None:
            return tok if tok >= 0 else None

        bos, eos = special_id(C.llama_vocab_bos(vocab)), special_id(C.llama_vocab_eos(vocab))
        self.info = VocabInfo(
            n_vocab=n_vocab,
            bos_id=bos,
            eos_id=eos,
            eog_ids=frozenset(t for t in range(n_vocab) if C.llama_vocab_is_eog(vocab, t)),
            add_bos=bool(C.llama_vocab_get_add_bos(vocab)),
            bos_text=self._piece(bos, special=True).decode("utf-8", "replace") if bos is not None else "",
            eos_text=self._piece(eos, special=True).decode("utf-8", "replace") if eos is not None else "",
            special={t: self._piece(t, special=True) for t in range(n_vocab) if self._is_special(t)},
            sep_id=special_id(C.llama_vocab_sep(vocab)),
            add_eos=bool(C.llama_vocab_get_add_eos(vocab)),
            add_sep=bool(C.llama_vocab_get_add_sep(vocab)),
            rerank_template=chat_template(model, b"rerank"),
        )
        self.chat_template = chat_template(model, None)

    @classmethod
    def load(cls, path: Path, verbose: bool = False) -> Tokenizer:
        """The vocabulary of a GGUF file, without its weights (milliseconds, no compute)."""
        _init_once(verbose)
        mparams = C.llama_model_default_params()
        mparams.vocab_only = True
        _log_lines.clear()
        with _ctrl_c_after_the_call():
            model = C.llama_model_load_from_file(os.fsencode(path), mparams)
        if not model:
            raise BackendError(f"llama.cpp could not read the vocabulary of {path}: {last_error() or 'unknown error'}")
        return cls(model, owned=True)

    def meta(self, key: str) -> str | None:
        return model_meta(self._model, key)

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        data = text.encode("utf-8", "replace")  # a lone surrogate (a JSON "\ud800") becomes '?', not a crash
        cap = len(data) + 8
        out = (C.llama_token * cap)()
        n = C.llama_tokenize(self._vocab_p, data, len(data), out, cap, add_special, parse_special)
        if n < 0:  # buffer too small: -n is the size needed
            cap = -n
            out = (C.llama_token * cap)()
            n = C.llama_tokenize(self._vocab_p, data, len(data), out, cap, add_special, parse_special)
        return list(out[:n])

    def _is_special(self, token: int) -> bool:
        """A control token, or one added as text in angle brackets (<tool_call>): as llama.cpp's
        own llguidance glue decides."""
        attr = C.llama_vocab_get_attr(self._vocab_p, token)
        if attr & C.LLAMA_TOKEN_ATTR_CONTROL:
            return True
        if attr & C.LLAMA_TOKEN_ATTR_USER_DEFINED:
            text = self._piece(token, special=True)
            return text.startswith(b"<") and text.endswith(b">")
        return False

    def _piece(self, token: int, special: bool) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = C.llama_token_to_piece(self._vocab_p, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = C.llama_token_to_piece(self._vocab_p, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def token_bytes(self, token: int) -> bytes:
        piece = self._piece_cache.get(token)
        if piece is None:
            piece = self._piece_cache[token] = self._piece(token, special=False)
        return piece

    def close(self) -> None:
        if self._owned and self._model:
            C.llama_model_free(self._model)
        self._model = None


def default_threads() -> int:
    """Physical cores, as llama.cpp's own tools default to; decode is bandwidth-bound."""
    import psutil

    return max(1, psutil.cpu_count(logical=False) or os.cpu_count() or 1)
