"""Reading a GGUF file's header, with the `gguf` package's format tables: validation and the facts `show` prints.

We check a file before llama.cpp sees it, so that a wrong or truncated file gets a
precise one-line error instead of a C++ log dump.
"""

from __future__ import annotations

import math
import mmap
import re
import struct
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localinfer.errors import InvalidModelFile, ModelNotFound

GGUF_MAGIC = b"GGUF"
MAX_DIMS = 4  # GGML_MAX_DIMS
MAX_NAME = 64  # GGML_MAX_NAME: a tensor name is shorter than this, as llama.cpp requires
# a mixture of experts' per-expert tensors, [n_expert, ...] in GGUF: ffn_{gate,up,down}_exps
# (llama-arch.cpp's LLM_TENSOR_FFN_*_EXPS) and their biases and scales (gpt-oss); a shared
# expert (ffn_*_shexp) and the router (ffn_gate_inp) run for every token
EXPERT_TENSOR = re.compile(r"blk\.\d+\.ffn_\w+_exps\.")


def shown(text: str, limit: int = 60) -> str:
    """A string from a file, fit for a one-line message: control characters escaped, cut short."""
    text = text.encode("unicode_escape").decode("ascii") if not text.isprintable() else text
    return text if len(text) <= limit else text[: limit - 1] + "…"


@dataclass(frozen=True)
class TensorInfo:
    """Where a tensor's bytes lie in the file; `shape` is in GGUF order (row length first)."""

    name: str
    shape: tuple[int, ...]
    type: int  # ggml type id
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass
class GGUFInfo:
    path: Path
    file_size: int
    architecture: str
    name: str | None
    n_params: int
    context_length: int | None
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    head_dim: int
    n_vocab: int
    tensor_types: dict[str, int]  # type name -> tensor count
    tensor_bytes: int
    chat_template: str | None
    license: str | None
    metadata: dict[str, object] = field(default_factory=dict)  # scalars and short arrays, for --json
    tensors: list[TensorInfo] = field(default_factory=list)
    # a mixture of experts ({arch}.expert_count > 0); 0 for a dense model
    n_expert: int = 0
    n_expert_used: int = 0  # {arch}.expert_used_count: the experts a token runs through
    n_params_active: int = 0  # what one token computes with (inspect: n_params for a dense model)
    active_tensor_bytes: int = 0  # the weights one token reads (inspect: tensor_bytes for a dense model)
    # how the model's outputs become one vector per input ({arch}.pooling_type, POOLINGS):
    # "none" for a generative model; an embedding model's mean/cls/last, a reranker's rank
    pooling: str = "none"
    causal: bool = True  # {arch}.attention.causal: false for an encoder (BERT), whose tokens see each other

    @property
    def embeds(self) -> bool:
        """An embedding or reranking model rather than a generative one."""
        return self.pooling != "none"

    def as_dict(self) -> dict[str, object]:
        experts = {"experts": self.n_expert, "experts_used": self.n_expert_used, "active_parameters": self.n_params_active} if self.n_expert else {}
        return {
            "path": str(self.path),
            "file_size": self.file_size,
            "architecture": self.architecture,
            "name": self.name,
            "parameters": self.n_params,
            **experts,
            "context_length": self.context_length,
            "layers": self.n_layer,
            "embedding_length": self.n_embd,
            "vocab_size": self.n_vocab,
            "tensor_types": self.tensor_types,
            "chat_template": self.chat_template,
            "license": self.license,
            **({"pooling": self.pooling} if self.embeds else {}),
        }


class _Truncated(Exception):
    pass


class _HeaderScanner:
    """A one-pass reader of the GGUF header (key/values and tensor infos).

    gguf's GGUFReader builds a numpy view for every element of every array, which takes
    seconds for a 50k-token vocabulary; `run` must start faster than that. This scanner
    uses gguf's own format tables and skips big arrays, keeping only their length.
    Tests check it against GGUFReader.
    """

    SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}
    STRING, ARRAY = 8, 9
    KEEP_ARRAY = 64  # arrays up to this length keep their values (per-layer head counts...)

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf, self.pos = buf, 0

    def take(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        if self.pos + size > len(self.buf):
            raise _Truncated
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.take("<Q")
        if self.pos + n > len(self.buf):
            raise _Truncated
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, unique: bool = False) -> Any:
        """The next value; `unique`: an array of strings must not repeat one (a vocabulary:
        llama.cpp aborts the process on a repeated token instead of failing the load)."""
        if vtype in self.SCALARS:
            return self.take(self.SCALARS[vtype])
        if vtype == self.STRING:
            return self.string()
        if vtype == self.ARRAY:
            etype, count = self.take("<I"), self.take("<Q")
            if etype == self.ARRAY:  # llama.cpp refuses nested arrays too; they would recurse without bound
                raise ValueError("an array of arrays")
            if count <= self.KEEP_ARRAY:
                values = [self.value(etype) for _ in range(count)]
                if unique and len(set(values)) < len(values):
                    raise ValueError("a token is in the vocabulary twice")
                return values
            if etype in self.SCALARS:
                self.pos += count * struct.calcsize(self.SCALARS[etype])
            elif etype == self.STRING:  # vocabularies: 50k-250k strings, skipped by length
                buf, pos, unpack = self.buf, self.pos, struct.unpack_from
                seen: set[bytes] = set()
                for _ in range(count):
                    n = unpack("<Q", buf, pos)[0]
                    if unique:
                        seen.add(buf[pos + 8 : pos + 8 + n])
                    pos += 8 + n
                if unique and len(seen) < count:
                    raise ValueError("a token is in the vocabulary twice")
                self.pos = pos
            else:
                for _ in range(count):
                    self.value(etype)
            if self.pos > len(self.buf):
                raise _Truncated
            return _LongArray(count)
        raise ValueError(f"unknown metadata value type {vtype}")


@dataclass(frozen=True)
class _LongArray:
    """Stands for an array we skipped over; only its length is kept."""

    length: int


_cache: dict[tuple[str, int, int], GGUFInfo] = {}


def inspect(path: Path) -> GGUFInfo:
    """Parse and sanity-check a GGUF; raises InvalidModelFile with what is wrong.

    The loader and then the backend both ask; the second asks a cache keyed by the
    file's identity (path, size, modification time)."""
    path = Path(path)
    try:
        st = path.stat()
        key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key in _cache:
        return _cache[key]
    info = _inspect(path)
    if key is not None:
        _cache[key] = info
    return info


def _inspect(path: Path) -> GGUFInfo:
    size, fields, tensors, data_start = _read_header(Path(path))
    infos, type_counts, tensor_bytes = _tensor_infos(Path(path), size, tensors, data_start, fields.get("general.alignment"))
    return _info(Path(path), size, fields, infos, type_counts, tensor_bytes)


def _read_header(path: Path) -> tuple[int, dict[str, Any], list[tuple[str, tuple[int, ...], int, int]], int]:
    """(file size, metadata, tensors as (name, dims, type, offset), where the data starts):
    the header alone, through a map of the file, every count and length checked as read."""
    from gguf import GGUF_DEFAULT_ALIGNMENT

    if not path.exists():
        raise ModelNotFound(f"no such file: {path}")
    if not path.is_file():
        raise InvalidModelFile(f"{path} is not a file")
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            if f.read(4) != GGUF_MAGIC:
                raise InvalidModelFile(f"{path} is not a GGUF model file (it does not start with 'GGUF')")
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    except (OSError, ValueError) as e:  # permissions, an I/O error, a special file mmap refuses
        raise InvalidModelFile(f"cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
    try:
        scan = _HeaderScanner(buf)
        scan.pos = 4
        version = scan.take("<I")
        if version not in (2, 3):
            raise InvalidModelFile(f"{path} is GGUF version {version}; only versions 2 and 3 are supported")
        n_tensors, n_kv = scan.take("<Q"), scan.take("<Q")
        if n_tensors > 1_000_000 or n_kv > 1_000_000:
            raise InvalidModelFile(f"{path} is corrupt (it claims {n_tensors} tensors and {n_kv} metadata keys)")
        fields: dict[str, Any] = {}
        for _ in range(n_kv):
            key = scan.string()
            fields[key] = scan.value(scan.take("<I"), unique=key == "tokenizer.ggml.tokens")
        tensors = []
        names: set[str] = set()
        for _ in range(n_tensors):
            name = scan.string()
            if len(name.encode()) >= MAX_NAME or name in names:
                raise InvalidModelFile(f"{path} is corrupt (tensor name '{shown(name)}' is {'too long' if name not in names else 'there twice'})")
            names.add(name)
            n_dims = scan.take("<I")
            if not 1 <= n_dims <= MAX_DIMS:
                raise InvalidModelFile(f"{path} is corrupt (tensor '{shown(name)}' has {n_dims} dimensions)")
            dims = tuple(scan.take("<Q") for _ in range(n_dims))
            ttype, offset = scan.take("<I"), scan.take("<Q")
            tensors.append((name, dims, ttype, offset))
        alignment = fields.get("general.alignment", GGUF_DEFAULT_ALIGNMENT)
        if type(alignment) is not int or alignment <= 0 or alignment & (alignment - 1):  # as llama.cpp checks it
            raise InvalidModelFile(f"{path} is corrupt (general.alignment is {alignment!r}, not a power of two)")
        data_start = -(-scan.pos // alignment) * alignment
    except _Truncated:
        raise InvalidModelFile(f"{path} is truncated (its header ends early)") from None
    except (ValueError, UnicodeError, struct.error, OverflowError) as e:
        raise InvalidModelFile(f"{path} is corrupt ({shown(str(e), 200)})") from None
    finally:
        buf.close()
    return size, fields, tensors, data_start


def _tensor_infos(path: Path, size: int, tensors: list[tuple[str, tuple[int, ...], int, int]], data_start: int,
                  alignment: int | None) -> tuple[list[TensorInfo], Counter[str], int]:  # fmt: skip
    """Each tensor's type, bytes and place, checked as llama.cpp checks them (known types, whole
    blocks, aligned, within the file, no two in the same bytes); and the count of each type and
    the bytes of all."""
    from gguf import GGML_QUANT_SIZES, GGUF_DEFAULT_ALIGNMENT, GGMLQuantizationType

    alignment = alignment or GGUF_DEFAULT_ALIGNMENT
    type_counts: Counter[str] = Counter()
    tensor_bytes, end = 0, 0
    infos = []
    for name, dims, ttype, offset in tensors:
        try:
            qtype = GGMLQuantizationType(ttype)
            block, block_bytes = GGML_QUANT_SIZES[qtype]
        except (ValueError, KeyError):
            raise InvalidModelFile(f"{path} has a tensor of unknown type {ttype}; is it corrupt?") from None
        if dims[0] % block or offset % alignment:  # as llama.cpp checks them: kernels read whole blocks
            what = f"rows of {dims[0]} values in {qtype.name} blocks of {block}" if dims[0] % block else f"an offset of {offset} not aligned to {alignment}"
            raise InvalidModelFile(f"{path} is corrupt (tensor '{shown(name)}' has {what})")
        nbytes = math.prod(dims) // block * block_bytes
        type_counts[qtype.name] += 1
        tensor_bytes += nbytes
        end = max(end, data_start + offset + nbytes)
        infos.append(TensorInfo(name, dims, ttype, data_start + offset, nbytes))
    if end > size:
        raise InvalidModelFile(f"{path} is truncated: its tensors need {end:,} bytes but the file has {size:,}")
    by_offset = sorted(infos, key=lambda t: t.offset)
    for before, after in zip(by_offset, by_offset[1:]):
        if after.offset < before.offset + before.nbytes:  # two tensors in the same bytes
            raise InvalidModelFile(f"{path} is corrupt (tensors '{shown(before.name)}' and '{shown(after.name)}' overlap)")
    return infos, type_counts, tensor_bytes


def _info(path: Path, size: int, fields: dict[str, Any], infos: list[TensorInfo], type_counts: Counter[str], tensor_bytes: int) -> GGUFInfo:
    """What the metadata and tensors say, in GGUFInfo's terms."""
    arch = shown(str(fields.get("general.architecture", "unknown")))  # printed by show and in errors: no escapes

    def arch_int(key: str, default: int = 0) -> int:
        value = fields.get(f"{arch}.{key}")
        if isinstance(value, list):  # per-layer values in some models: take the first
            value = value[0] if value else default
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        return value if type(value) is int and value >= 0 else default  # NaN, negative or not a number: absent

    n_embd = arch_int("embedding_length")
    n_head = arch_int("attention.head_count", 1) or 1
    n_expert, n_expert_used = arch_int("expert_count"), arch_int("expert_used_count")
    n_params_active, active_bytes = active_share(infos, n_expert, n_expert_used)
    tokens = fields.get("tokenizer.ggml.tokens")
    text = lambda key: fields[key] if isinstance(fields.get(key), str) else None  # noqa: E731
    label = lambda key: shown(fields[key], 200) if isinstance(fields.get(key), str) else None  # noqa: E731  (printed: escaped)
    causal = fields.get(f"{arch}.attention.causal", True) is not False
    return GGUFInfo(
        path=path,
        file_size=size,
        architecture=arch,
        name=label("general.name"),
        n_params=sum(math.prod(t.shape) for t in infos),
        context_length=arch_int("context_length") or None,
        n_layer=arch_int("block_count"),
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=arch_int("attention.head_count_kv", n_head) or n_head,
        head_dim=arch_int("attention.key_length", n_embd // n_head) or n_embd // n_head,
        n_vocab=tokens.length if isinstance(tokens, _LongArray) else len(tokens or []),
        tensor_types=dict(type_counts.most_common()),
        tensor_bytes=tensor_bytes,
        chat_template=text("tokenizer.chat_template"),
        license=label("general.license"),
        metadata={k: v for k, v in fields.items() if isinstance(v, (str, int, float, bool, list))},
        tensors=infos,
        n_expert=n_expert,
        n_expert_used=n_expert_used,
        n_params_active=n_params_active,
        active_tensor_bytes=active_bytes,
        pooling=pooling_of(fields.get(f"{arch}.pooling_type"), causal, any(t.name == "cls.output.weight" for t in infos)),
        causal=causal,
    )


# llama.cpp's enum llama_pooling_type, by value
POOLINGS = ("none", "mean", "cls", "last", "rank")


def pooling_of(value: object, causal: bool, classifier: bool = False) -> str:
    """A GGUF's pooling_type as a POOLINGS name. An encoder that names none pools by the
    mean, as sentence-transformers models mostly do (llama.cpp's converter writes mean where
    a folder says nothing), unless it has a classifier head (cls.output): a cross-encoder
    (bge-reranker-v2-m3's conversion writes no pooling type) ranks."""
    if type(value) is int and 0 <= value < len(POOLINGS) and (value or causal):
        return POOLINGS[value]
    return "none" if causal else "rank" if classifier else "mean"


def active_share(tensors: list[TensorInfo], n_expert: int, n_expert_used: int) -> tuple[int, int]:
    """(parameters, bytes) that one token computes with: every tensor but the experts', and
    n_expert_used / n_expert of theirs (the router picks that many of each layer's experts).

    Every expert tensor is [n_expert, ...], so each expert's share is a whole number of rows.
    A dense model (no expert count) computes with all of itself."""
    params, nbytes = sum(math.prod(t.shape) for t in tensors), sum(t.nbytes for t in tensors)
    if n_expert <= 0:
        return params, nbytes
    experts = [t for t in tensors if EXPERT_TENSOR.match(t.name)]
    expert_params, expert_bytes = sum(math.prod(t.shape) for t in experts), sum(t.nbytes for t in experts)
    used = min(n_expert_used, n_expert)
    return params - expert_params + expert_params * used // n_expert, nbytes - expert_bytes + expert_bytes * used // n_expert
