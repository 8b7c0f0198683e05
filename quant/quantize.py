"""`localinfer quantize`: a float GGUF (or a Hugging Face folder, converted to F16 first)
through llama.cpp's own quantizer, with progress per tensor and an atomic output.

llama.cpp's quantizer runs on a worker thread; its log lines ("[ 12/272] blk.1.ffn_up...")
drive the progress callback. It writes to a hidden temporary file beside the output,
renamed only when it finished and reads back as a GGUF: an interrupted or failed run
leaves nothing that looks like a model.
"""

from __future__ import annotations

import ctypes
import os
import re
import struct
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from localinfer.backends.llamacpp import last_error, log_listener
from localinfer.errors import InvalidModelFile, UserError
from localinfer.modelfile import GGUFInfo, inspect

FLOAT_TYPES = {"F32", "F16", "BF16"}
_PROGRESS = re.compile(r"\[\s*(\d+)\s*/\s*(\d+)\s*\]\s+(\S+)")


def ftypes() -> dict[str, int]:
    """Every target llama.cpp's quantizer takes, by the name llama-quantize uses."""
    import llama_cpp

    names = {n.removeprefix("LLAMA_FTYPE_MOSTLY_"): getattr(llama_cpp, n) for n in dir(llama_cpp) if n.startswith("LLAMA_FTYPE_MOSTLY_")}
    names["F32"] = llama_cpp.LLAMA_FTYPE_ALL_F32
    return dict(sorted(names.items()))


def ggml_type(name: str) -> int:
    from gguf import GGMLQuantizationType

    try:
        return int(GGMLQuantizationType[name.upper()])
    except KeyError:
        raise UserError(f"unknown tensor type '{name}' (e.g. Q8_0, Q6_K, Q4_K, F16)") from None


@dataclass
class QuantizeResult:
    source: Path
    output: Path
    type: str
    source_info: GGUFInfo
    output_info: GGUFInfo
    seconds: float


def check_source(info: GGUFInfo, allow_requantize: bool) -> list[str]:
    """Float sources go; quantized ones only when asked, and with a warning."""
    weights = {t for t in info.tensor_types if t not in FLOAT_TYPES}
    if not weights:
        return []
    kinds = ", ".join(sorted(weights))
    if not allow_requantize:
        raise UserError(f"{info.path.name} is already quantized ({kinds}); quantize from an F16/BF16/F32 source, or pass --allow-requantize")
    return [f"{info.path.name} is already quantized ({kinds}): requantizing compounds the error; an F16 source gives a better model"]


def writable_temp(out: Path) -> Path:
    directory = out.parent if str(out.parent) else Path(".")
    if not directory.is_dir():
        raise UserError(f"cannot write {out}: {directory} is not a folder")
    try:
        fd, name = tempfile.mkstemp(prefix=f".{out.name}.", suffix=".partial", dir=directory)
    except OSError as e:
        raise UserError(f"cannot write {out}: {e.strerror or e}") from None
    os.close(fd)
    return Path(name)


def load_imatrix(path: Path) -> dict[str, np.ndarray]:
    """An importance matrix (mean squared activation per input column, per weight matrix),
    from llama-imatrix's GGUF files (`NAME.in_sum2` / `NAME.counts`) or its legacy .dat."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            magic = f.read(4)
    except OSError as e:
        raise UserError(f"cannot read the importance matrix {path}: {e.strerror or e}") from None
    try:
        return _imatrix_gguf(path) if magic == b"GGUF" else _imatrix_dat(path)
    except (ValueError, KeyError, IndexError, UnicodeDecodeError, struct.error):
        raise UserError(f"{path} is not an importance matrix (neither llama-imatrix's GGUF nor its .dat format)") from None


def _imatrix_gguf(path: Path) -> dict[str, np.ndarray]:
    from gguf import GGUFReader

    tensors = {t.name: np.asarray(t.data, dtype=np.float32) for t in GGUFReader(path).tensors}
    out = {}
    for name, sums in tensors.items():
        if name.endswith(".in_sum2"):
            base = name.removesuffix(".in_sum2")
            counts = tensors[base + ".counts"].reshape(-1)
            rows = sums.reshape(len(counts), -1)
            out[base] = (rows / np.maximum(counts, 1)[:, None]).reshape(-1).astype(np.float32)
    if not out:
        raise ValueError("no .in_sum2 tensors")
    return out


def _imatrix_dat(path: Path) -> dict[str, np.ndarray]:
    data = path.read_bytes()
    pos, out = 4, {}
    (n,) = struct.unpack_from("<i", data, 0)
    for _ in range(n):
        (length,) = struct.unpack_from("<i", data, pos)
        name = data[pos + 4 : pos + 4 + length].decode()
        ncall, nval = struct.unpack_from("<ii", data, pos + 4 + length)
        pos += 12 + length
        values = np.frombuffer(data, dtype=np.float32, count=nval, offset=pos).copy()
        pos += 4 * nval
        out[name] = values / ncall if ncall > 0 else values
    if not out:
        raise ValueError("no entries")
    return out


def _imatrix_array(imatrix: dict[str, np.ndarray]) -> tuple[ctypes.Array, list[object]]:
    """llama_model_imatrix_data[], ending with a null name; the second value keeps the
    buffers alive while llama.cpp reads them."""
    import llama_cpp

    keep: list[object] = []
    arr = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
    for i, (name, values) in enumerate(imatrix.items()):
        values = np.ascontiguousarray(values, dtype=np.float32)
        keep += [values, name.encode()]
        arr[i].name = keep[-1]
        arr[i].data = values.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
        arr[i].size = values.size
    arr[len(imatrix)].name = None
    return arr, keep


def _overrides(tensor_types: dict[str, str]) -> ctypes.Array | None:
    import llama_cpp

    if not tensor_types:
        return None
    items = [(pattern.encode(), ggml_type(t)) for pattern, t in tensor_types.items()]
    arr = (llama_cpp.llama_model_tensor_override * (len(items) + 1))()
    for i, (pattern, t) in enumerate(items):
        arr[i].pattern, arr[i].type = pattern, t
    arr[len(items)].pattern = None  # the list ends at a null pattern
    return arr


def quantize(
    src: Path,
    out: Path,
    type_name: str,
    *,
    allow_requantize: bool = False,
    leave_output_tensor: bool = False,
    tensor_types: dict[str, str] | None = None,
    imatrix: Path | None = None,
    threads: int | None = None,
    progress: Callable[[int, int, str], None] | None = None,
    warn: Callable[[str], None] | None = None,
) -> QuantizeResult:
    """Quantize `src` (a GGUF, or an HF folder) to `type_name` at `out`."""
    import llama_cpp

    targets = ftypes()
    key = type_name.upper()
    if key not in targets:
        raise UserError(f"unknown quantization type '{type_name}'; choose one of: {', '.join(targets)}")
    src, out = Path(src), Path(out)
    # Everything that can be refused is refused here, before minutes of work.
    if out.is_dir():
        raise UserError(f"{out} is a folder; give the output file's name")
    if out.exists() and src.exists() and out.resolve() == src.resolve():
        raise UserError(f"the output {out} is the source itself; choose another name")
    overrides = _overrides(tensor_types or {})
    importance = _imatrix_array(load_imatrix(imatrix)) if imatrix is not None else None
    started = time.perf_counter()
    tmp = writable_temp(out)
    try:
        with tempfile.TemporaryDirectory(prefix="localinfer-quantize-") as scratch:
            src_gguf = convert_folder(src, Path(scratch)) if src.is_dir() else src
            info = inspect(src_gguf)
            for warning in check_source(info, allow_requantize):
                if warn:
                    warn(warning)
            params = llama_cpp.llama_model_quantize_default_params()
            params.ftype = targets[key]
            params.nthread = threads or 0
            params.allow_requantize = allow_requantize
            params.quantize_output_tensor = not leave_output_tensor
            if overrides is not None:
                params.tt_overrides = ctypes.cast(overrides, ctypes.POINTER(llama_cpp.llama_model_tensor_override))
            if importance is not None:
                params.imatrix = ctypes.cast(importance[0], ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
            rc = _run_with_progress(lambda: llama_cpp.llama_model_quantize(os.fsencode(src_gguf), os.fsencode(tmp), ctypes.byref(params)), progress)
            if rc != 0:
                raise UserError(f"llama.cpp could not quantize {src.name}: {last_error() or f'error {rc}'}")
            try:
                out_info = inspect(tmp)
            except InvalidModelFile as e:
                raise UserError(f"llama.cpp wrote an unreadable file: {e}") from None
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # mkstemp made it private; a model is an ordinary file
            os.replace(tmp, out)
    finally:
        tmp.unlink(missing_ok=True)
    out_info.path = out
    return QuantizeResult(src, out, key, info, out_info, time.perf_counter() - started)


def _run_with_progress(call: Callable[[], int], progress: Callable[[int, int, str], None] | None) -> int:
    """Run the quantizer on a worker thread; report its per-tensor log lines as progress.
    Ctrl-C on the main thread abandons the (daemon) worker: the caller deletes its file."""
    result: list[int] = []

    def on_line(line: str) -> None:
        m = _PROGRESS.search(line)
        if m and progress:
            progress(int(m.group(1)), int(m.group(2)), m.group(3))

    with log_listener(on_line):
        worker = threading.Thread(target=lambda: result.append(call()), daemon=True, name="llama-quantize")
        worker.start()
        while worker.is_alive():
            worker.join(0.1)
    return result[0] if result else -1


def convert_folder(folder: Path, scratch: Path) -> Path:
    """A Hugging Face folder becomes an F16 GGUF first, as llama.cpp's converter would."""
    from localinfer_quant.hf import UnsupportedSource, import_hf

    if not (folder / "config.json").is_file():
        raise UserError(f"{folder} is a folder without config.json: not a Hugging Face model")
    try:
        return import_hf(folder, scratch / f"{folder.name}-F16.gguf")
    except UnsupportedSource as e:
        raise UserError(str(e)) from None
    except (OSError, ValueError, KeyError, IndexError, struct.error) as e:  # damaged weights or tokenizer files
        detail = getattr(e, "strerror", None) or (str(e).splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot read the Hugging Face model in {folder}: {detail}") from None
