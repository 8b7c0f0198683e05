"""`localinfer worker`: llama.cpp's RPC server on this machine, from the ggml library the
Python wheel already holds (install.sh builds it with GGML_RPC=ON), so the worker is the
same llama.cpp as the client by construction.

ggml's server offers a device's whole free memory; `--mem` makes it offer less by
reporting that size as the device's free memory (the one number the RPC protocol carries,
and the one our client plans with). It is an offer, not a cap: the client keeps to it.
"""

from __future__ import annotations

import ctypes
import errno
import os
import signal
import socket
import sys
import threading
import time
from dataclasses import dataclass
from typing import TextIO

from localinfer.backends.rpc.probe import WorkerInfo, probe
from localinfer.devices import NO_RPC, Device, describe, ggml, rpc_function
from localinfer.errors import BackendError, UserError
from localinfer.memory import size_text

LOOPBACK = "127.0.0.1"
WARNING = (
    "warning: this worker listens on {host}, beyond this machine. llama.cpp's RPC protocol has no "
    "authentication or encryption: anyone who reaches the port can read and write what it holds and use its compute. Use it only "
    "inside a trusted LAN, or keep it on 127.0.0.1 and reach it through an SSH tunnel (README: Several machines)."
)
START_SECONDS = 30.0  # for the server to answer its first HELLO

# ggml-backend-impl.h: struct ggml_backend_device begins with its interface, whose third
# member is get_memory(dev, &free, &total).
_GET_MEMORY = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t))
_GET_MEMORY_SLOT = 2
_START = ctypes.CFUNCTYPE(None, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_size_t, ctypes.c_size_t, ctypes.POINTER(ctypes.c_void_p))
_kept: list[object] = []  # the callbacks C holds pointers to, alive for the process


@dataclass(frozen=True)
class Offer:
    device: Device
    bytes: int
    threads: int


def rpc_start(lib: ctypes.CDLL) -> ctypes._CFuncPtr:
    """ggml_backend_rpc_start_server, from the RPC backend's registry entry."""
    address = rpc_function(lib, "ggml_backend_rpc_start_server")
    if not address:
        raise BackendError(NO_RPC)
    return _START(address)


def served_device(lib: ctypes.CDLL) -> int:
    """What llama.cpp's rpc-server serves by default: the first GPU, else the CPU."""
    devices = [lib.ggml_backend_dev_get(i) for i in range(lib.ggml_backend_dev_count())]
    kinds = [describe(lib, d).kind for d in devices]
    for wanted in (("GPU", "iGPU"), ("CPU",)):
        for dev, kind in zip(devices, kinds):
            if kind in wanted:
                return dev
    raise UserError("llama.cpp found no device to serve")


def offer_only(dev: int, offered: int) -> None:
    """Make the device report `offered` bytes free (its total as it is)."""
    iface = ctypes.cast(dev, ctypes.POINTER(ctypes.c_void_p))
    real = _GET_MEMORY(iface[_GET_MEMORY_SLOT])

    def get_memory(device: int, free: ctypes._Pointer, total: ctypes._Pointer) -> None:
        real(device, free, total)
        free[0] = offered

    callback = _GET_MEMORY(get_memory)
    _kept.extend((real, callback))
    iface[_GET_MEMORY_SLOT] = ctypes.cast(callback, ctypes.c_void_p).value


def check_port_free(host: str, port: int) -> None:
    """Bind as ggml's server will (SO_REUSEADDR), so a taken port is one line, not ggml's log."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as e:
            if e.errno == errno.EADDRINUSE:
                raise UserError(f"port {port} on {host} is taken (another worker?); choose another with --port") from None
            raise UserError(f"cannot listen on {host}:{port}: {e.strerror or e}") from None


def serve(host: str, port: int, mem: int | None, threads: int, out: TextIO) -> None:
    """Serve until SIGINT or SIGTERM; one line on `out` once it answers, one when it stops."""
    lib = ggml()
    if lib is None:
        raise UserError("llama-cpp-python's ggml library is missing; run ./install.sh again")
    start = rpc_start(lib)
    dev = served_device(lib)
    device = describe(lib, dev)
    if mem is not None and mem > device.total_bytes:
        raise UserError(f"--mem {size_text(mem)} is more than {device.name} has ({size_text(device.total_bytes)})")
    offer = Offer(device, mem if mem is not None else device.free_bytes, threads)
    check_port_free(host, port)
    stop = stop_on_signals()  # before the line is printed: whoever reads it may stop us at once
    offer_only(dev, offer.bytes)
    if host != LOOPBACK:
        print(WARNING.format(host=host), file=sys.stderr)
    endpoint = f"{host}:{port}"
    devices = (ctypes.c_void_p * 1)(dev)
    server = threading.Thread(target=start, args=(endpoint.encode(), None, threads, 1, devices), daemon=True, name="rpc-server")
    server.start()
    info = _wait_until_answering(LOOPBACK if host in ("0.0.0.0", LOOPBACK) else host, port, server)
    print(describe_offer(endpoint, offer, info), file=out, flush=True)
    while not stop.is_set() and server.is_alive():  # the server thread blocks in C and cannot be joined
        stop.wait(0.5)
    print(f"worker on {endpoint} stopped", file=out, flush=True)


def describe_offer(endpoint: str, offer: Offer, info: WorkerInfo) -> str:
    d = offer.device
    what = f"{d.name} ({d.description})" if d.description and d.description != d.name else d.name
    return (
        f"localinfer worker on {endpoint}: offers {size_text(offer.bytes)} of {what}, {size_text(d.total_bytes)} in all, "
        f"{offer.threads} threads; llama.cpp RPC protocol {info.version_text}. Ctrl-C stops it."
    )


def _wait_until_answering(host: str, port: int, server: threading.Thread) -> WorkerInfo:
    deadline = time.monotonic() + START_SECONDS
    while True:
        if not server.is_alive():
            raise UserError(f"llama.cpp's RPC server did not start on port {port} (its message is above)")
        try:
            return probe(f"{host}:{port}", timeout=2.0)
        except UserError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)


def stop_on_signals() -> threading.Event:
    """An event SIGINT (Ctrl-C) and SIGTERM set, instead of raising or ending the process."""
    stop = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stop.set())
    return stop


def silence_stdout() -> TextIO:
    """Point file descriptor 1 at /dev/null, where ggml's server prints its start-up banner,
    and return a stream on the original stdout for our own lines (errors still reach stderr)."""
    sys.stdout.flush()
    ours = os.fdopen(os.dup(1), "w", buffering=1)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    return ours
