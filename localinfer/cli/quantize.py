"""`localinfer quantize SRC TYPE`: shrink a model with llama.cpp's quantizer, with a
progress bar per tensor and a before/after summary."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Annotated, Optional

import typer
from rich.console import Console
from rich.table import Table

from localinfer.cli import options as opt
from localinfer.cli.progress import err, work_bar
from localinfer.errors import UserError


def tensor_type_overrides(values: list[str] | None) -> dict[str, str]:
    overrides = {}
    for value in values or []:
        pattern, sep, qtype = value.rpartition("=")
        if not sep or not pattern or not qtype:
            raise typer.BadParameter(f"'{value}' is not PATTERN=TYPE (e.g. 'attn_v=Q8_0')", param_hint="--tensor-type")
        overrides[pattern] = qtype
    return overrides


def default_output(src: Path, type_name: str) -> Path:
    """./NAME-TYPE.gguf, with any quantization suffix of the source's name dropped."""
    stem = src.name if src.is_dir() else src.stem
    stem = re.sub(r"[.-](F32|F16|BF16|Q\d\w*|IQ\d\w*)$", "", stem, flags=re.IGNORECASE)
    return Path(f"{stem}-{type_name.upper()}.gguf")


def quantize_command(
    src: Annotated[str, typer.Argument(help="A GGUF in F32/F16/BF16 (a path or a model reference), or a Hugging Face model folder.", show_default=False)],
    type_name: Annotated[str, typer.Argument(metavar="TYPE", help="Q4_K_M, Q5_K_M, Q6_K, Q8_0, Q4_0, ... (every type llama.cpp's quantizer takes).", show_default=False)],
    output: Annotated[Optional[str], typer.Option("-o", "--output", help="Output file, or a folder to write NAME-TYPE.gguf into. [default: ./NAME-TYPE.gguf]", show_default=False)] = None,
    allow_requantize: Annotated[bool, typer.Option("--allow-requantize", help="Accept an already-quantized source (worse than quantizing from F16).")] = False,
    leave_output_tensor: Annotated[bool, typer.Option("--leave-output-tensor", help="Keep output.weight unquantized.")] = False,
    tensor_type: Annotated[Optional[list[str]], typer.Option("--tensor-type", help="Override the type of tensors matching a pattern: PATTERN=TYPE (repeatable).", show_default=False)] = None,
    imatrix: Annotated[Optional[Path], typer.Option("--imatrix", help="Importance matrix from llama-imatrix (GGUF or legacy .dat): better low-bit quants.", show_default=False)] = None,
    threads: Annotated[Optional[int], typer.Option("--threads", "-t", envvar="LOCALINFER_THREADS", help="Threads. [default: all cores]", callback=opt.threads)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="Print a JSON summary instead of the table.")] = False,
) -> None:
    """Quantize a model to a GGUF k-quant (or any llama.cpp type), through llama.cpp's quantizer."""
    from localinfer.backends import get_backend

    get_backend("llama.cpp")  # the quantizer is llama.cpp's: say now, in one line, if it cannot load
    from localinfer_quant.quantize import quantize

    source = resolve_source(src)
    out = output_path(output, source, type_name)
    overrides = tensor_type_overrides(tensor_type)
    with work_bar("quantizing", enabled=not json_out) as progress:
        result = quantize(
            source, out, type_name,
            allow_requantize=allow_requantize, leave_output_tensor=leave_output_tensor, tensor_types=overrides, imatrix=imatrix, threads=threads,
            progress=progress, warn=lambda warning: err.print(f"[yellow]warning:[/yellow] {warning}"),
        )  # fmt: skip
    before, after = result.source_info, result.output_info
    if json_out:
        print(json.dumps({
            "source": str(result.source), "output": str(result.output), "type": result.type, "seconds": round(result.seconds, 2),
            "source_bytes": before.file_size, "output_bytes": after.file_size,
            "source_tensor_types": before.tensor_types, "output_tensor_types": after.tensor_types,
        }))  # fmt: skip
        return
    table = Table(title=f"{result.source.name} → {result.output}", title_justify="left")
    for column in ("", "size", "bits per weight", "tensor types"):
        table.add_column(column)
    for label, info in (("before", before), ("after", after)):
        bpw = 8 * info.tensor_bytes / max(1, info.n_params)
        types = ", ".join(f"{k} ×{v}" for k, v in info.tensor_types.items())
        table.add_row(label, f"{info.file_size / 1e6:,.1f} MB", f"{bpw:.2f}", types)
    Console().print(table)
    print(f"wrote {result.output} in {result.seconds:.1f} s")


def output_path(output: str | None, source: Path, type_name: str) -> Path:
    """-o FILE as given; -o FOLDER (existing, or written with a trailing slash) means the
    default file name inside it, as `cp` and llama-quantize's users expect."""
    name = default_output(source, type_name)
    if output is None:
        return name
    path = Path(output).expanduser()
    if path.is_dir():
        return path / name
    if output.endswith(("/", os.sep)):
        raise UserError(f"cannot write into {output}: no such folder")
    return path


def resolve_source(src: str) -> Path:
    """A path as given, else a model reference that is already local (quantize never pulls)."""
    path = Path(src).expanduser()
    if path.exists():
        return path
    from localinfer.store.pull import local_path
    from localinfer.store.refs import resolve

    try:
        local = local_path(resolve(src))
    except UserError:
        local = None
    if local is None:
        raise UserError(f"no such file, folder or downloaded model: {src}")
    return local


def register(app: typer.Typer) -> None:
    app.command("quantize")(quantize_command)
