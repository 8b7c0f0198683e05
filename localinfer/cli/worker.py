"""`localinfer worker`: offer this machine's memory and compute to another machine's
model, as a llama.cpp RPC worker (`--rpc HOST:PORT` there)."""

from __future__ import annotations

import os
import sys
from typing import Annotated, Optional

import typer

from localinfer.cli import options as opt


def _host(value: str) -> str:
    from localinfer.backends.rpc.endpoints import check_host
    from localinfer.errors import UserError

    try:
        return check_host(value)
    except UserError as e:
        raise typer.BadParameter(str(e)) from None


def worker(
    host: Annotated[str, typer.Option("--host", help="Address to listen on. Anything but 127.0.0.1 is reachable from the network, where llama.cpp's RPC protocol has no authentication: only inside a trusted LAN, or reach it through an SSH tunnel.", callback=_host)] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.", callback=opt.between(1, 65535))] = 50052,
    mem: Annotated[Optional[str], typer.Option("--mem", metavar="SIZE", help="Memory to offer (512MB, 8GB): of the GPU where llama.cpp has one, else of RAM; a client puts no more layers here than fit. [default: what is free now]", callback=opt.byte_size, show_default=False)] = None,
    threads: opt.Threads = None,
) -> None:
    """Serve this machine's memory and compute to a model loaded elsewhere (llama.cpp's RPC
    backend): run the model there with --rpc THIS_HOST:PORT. Stops on Ctrl-C."""
    from localinfer.backends.llamacpp import default_threads
    from localinfer.backends.rpc.worker import serve, silence_stdout

    if mem == 0:
        raise typer.BadParameter("offer more than 0 bytes", param_hint="--mem")
    out = silence_stdout()
    serve(host, port, mem, threads or default_threads(), out)
    out.flush()
    sys.stderr.flush()
    os._exit(0)  # the server thread blocks in C and cannot be joined; the process ends around it


def register(app: typer.Typer) -> None:
    app.command()(worker)
