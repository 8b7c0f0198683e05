"""`localinfer embed MODEL [TEXT ...]`: embedding vectors of texts, as `llm embed` prints
them: one JSON array a text, JSON lines with --json, or the texts' cosine similarities."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Optional

import typer

from localinfer.cli import options as opt
from localinfer.errors import UserError

if TYPE_CHECKING:
    import numpy as np

    from localinfer.engine.engine import Engine

CHUNK = 256  # texts embedded and printed at a time: a long file streams out, in bounded memory


def embed(
    model: Annotated[str, typer.Argument(help="An embedding model (a BERT-family encoder, Qwen3-Embedding, ...): path to a .gguf, catalog alias, or Hugging Face owner/repo[:QUANT]. A chat model gives the mean of its hidden states.", show_default=False)],
    texts: Annotated[Optional[list[str]], typer.Argument(help="Texts to embed. Without any: one a line from --file, else from stdin.", show_default=False)] = None,
    file: Annotated[Optional[Path], typer.Option("--file", "-f", help="Read the texts from this file, one a line (blank lines skipped).", show_default=False)] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON lines: index, text, tokens and embedding of each text.")] = False,
    similarity: Annotated[bool, typer.Option("--similarity", help="Print the texts' cosine similarity matrix instead of the vectors.")] = False,
    pooling: Annotated[Optional[str], typer.Option("--pooling", help="How a text's tokens become one vector: mean, cls or last, instead of the model's own (from its file).", callback=opt.pooling_choice, show_default=False)] = None,
    no_normalize: Annotated[bool, typer.Option("--no-normalize", help="Print vectors as the model makes them, not scaled to length 1.")] = False,
    dimensions: Annotated[Optional[int], typer.Option("--dimensions", help="Keep the first N values of each vector (a Matryoshka model's shorter embedding), then normalise.", callback=opt.between(1, 1 << 20), show_default=False)] = None,
    truncate: Annotated[bool, typer.Option("--truncate", help="Cut a text longer than the model takes at once, instead of an error.")] = False,
    engine_name: opt.Engine = "auto",
    threads: opt.Threads = None,
    ctx: opt.Ctx = None,
) -> None:
    """Embed texts with an embedding model (BERT-family encoders, Qwen3-Embedding, ...): one vector a text."""
    from localinfer.engine.loader import open_engine

    lines = gather(texts, file)
    if similarity and len(lines) < 2:
        raise UserError("--similarity compares texts: give at least two")
    load = opt.load_options(engine_name, ctx, threads, None, (None, None, None), pooling=pooling)
    engine = open_engine(model, load)
    try:
        if dimensions is not None and dimensions > engine.backend.facts.n_embd:
            raise UserError(f"this model's vectors have {engine.backend.facts.n_embd} values; --dimensions can only cut them shorter")
        if similarity:
            print_similarity(lines, vectors_of(engine, lines, truncate, dimensions, normalize=True))
            return
        for start in range(0, len(lines), CHUNK):
            chunk = lines[start : start + CHUNK]
            for i, (text, vector) in enumerate(zip(chunk, vectors_of(engine, chunk, truncate, dimensions, not no_normalize)), start):
                values = [round(float(x), 7) for x in vector]
                print(json.dumps({"index": i, "text": text, "embedding": values}, ensure_ascii=False) if json_out else json.dumps(values), flush=True)
    finally:
        engine.close()


def gather(texts: list[str] | None, file: Path | None) -> list[str]:
    """The texts: the arguments, else the file's lines, else stdin's (blank lines skipped)."""
    if texts:
        if file is not None:
            raise UserError("give texts as arguments or with --file, not both")
        return list(texts)
    if file is not None:
        try:
            raw = file.read_text(encoding="utf-8", errors="replace")
        except OSError as e:
            raise UserError(f"cannot read {file}: {e.strerror or e}") from None
    elif sys.stdin.isatty():
        raise UserError("no text to embed: give texts as arguments, --file, or lines on stdin")
    else:
        raw = sys.stdin.read()
    lines = [line for line in raw.splitlines() if line.strip()]
    if not lines:
        raise UserError("no text to embed: the input has no lines")
    return lines


def vectors_of(engine: Engine, texts: list[str], truncate: bool, dimensions: int | None, normalize: bool) -> np.ndarray:
    from localinfer.engine.embedding import finish

    return finish(engine.embed([engine.tokenize_input(t) for t in texts], truncate), dimensions, normalize)


def print_similarity(texts: list[str], vectors: np.ndarray) -> None:
    """The cosine matrix (the vectors are unit length), each row named by its text."""
    from rich.console import Console
    from rich.table import Table

    table = Table(show_header=True, header_style="bold", box=None)
    table.add_column("")
    names = [t if len(t) <= 30 else t[:29] + "…" for t in texts]
    for i in range(len(texts)):
        table.add_column(str(i), justify="right")
    for i, row in enumerate(vectors @ vectors.T):
        table.add_row(f"{i} {names[i]}", *(f"{x:.3f}" for x in row))
    Console(highlight=False).print(table)


def register(app: typer.Typer) -> None:
    app.command()(embed)
