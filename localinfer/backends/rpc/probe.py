"""Ask a worker what it is before llama.cpp connects to it, in our own code: llama.cpp's
RPC client aborts the whole process on a worker that does not answer as it expects (a
version it does not speak, a connection cut), so every check that can fail runs here first,
and fails as one line.

The wire (ggml-rpc.cpp): a request is | command (1 byte) | size (8 bytes, little-endian) |
data |, a response | size (8 bytes) | data |; HELLO comes first on every connection.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass

from localinfer.errors import UserError

# The protocol of the llama.cpp that pyproject.toml pins (ggml-rpc.h: RPC_PROTO_*_VERSION);
# a worker answers HELLO with its own, and llama.cpp's client refuses another major version
# or a newer minor one.
PROTOCOL = (7, 0, 0)
GET_ALIGNMENT, GET_MAX_SIZE, GET_DEVICE_MEMORY, HELLO, DEVICE_COUNT = 1, 2, 11, 14, 15
CAPS_SIZE = 24  # transport.h: RPC_CONN_CAPS_SIZE (all zero: plain TCP, no RDMA)
TIMEOUT = 5.0  # seconds for a worker to connect and answer; a busy one (serving another client) does not


@dataclass(frozen=True)
class WorkerInfo:
    endpoint: str
    version: tuple[int, int, int]
    devices: int
    free_bytes: int  # what it offers (localinfer worker --mem), or its device's free memory
    total_bytes: int
    alignment: int = 0  # its device's buffers: alignment and largest size (the backend shows in them)
    max_size: int = 0

    @property
    def version_text(self) -> str:
        return ".".join(map(str, self.version))

    @property
    def backend(self) -> str:
        """What computes there, as far as the protocol shows it: it carries no device name,
        but ggml's CPU buffers align to 32 bytes and CUDA's to 128, both without a size
        limit; a Metal or Vulkan device limits its buffers."""
        unlimited = self.max_size == 2**64 - 1
        known = {(32, True): "CPU", (128, True): "CUDA GPU"}.get((self.alignment, unlimited))
        return known or f"a GPU ({self.alignment}-byte alignment, buffers up to {self.max_size / 2**30:.1f} GiB)"


def compatible(version: tuple[int, int, int]) -> bool:
    return version[0] == PROTOCOL[0] and version[1] <= PROTOCOL[1]


def probe(endpoint: str, timeout: float = TIMEOUT) -> WorkerInfo:
    """Connect, say HELLO, and ask its device count and its first device's memory and buffer
    limits; a UserError naming the worker for anything but a compatible, idle worker."""
    host, _, port = endpoint.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=timeout) as sock:
            sock.settimeout(timeout)
            version = _hello(sock, endpoint)
            if not compatible(version):
                raise UserError(
                    f"the worker at {endpoint} speaks llama.cpp's RPC protocol {'.'.join(map(str, version))} and this build speaks "
                    f"{'.'.join(map(str, PROTOCOL))}: install the same localinfer version on both machines"
                )
            (count,) = struct.unpack("<I", _call(sock, DEVICE_COUNT, b"", 4, endpoint))
            free, total = struct.unpack("<QQ", _call(sock, GET_DEVICE_MEMORY, struct.pack("<I", 0), 16, endpoint))
            (alignment,) = struct.unpack("<Q", _call(sock, GET_ALIGNMENT, struct.pack("<I", 0), 8, endpoint))
            (max_size,) = struct.unpack("<Q", _call(sock, GET_MAX_SIZE, struct.pack("<I", 0), 8, endpoint))
    except socket.timeout:
        raise UserError(f"the worker at {endpoint} did not answer in {timeout:g} s: it may be serving another client (a worker serves one at a time)") from None
    except socket.gaierror:
        raise UserError(f"cannot resolve the worker's host in {endpoint}") from None
    except ConnectionRefusedError:
        raise UserError(f"nothing listens at {endpoint}: start 'localinfer worker' there, or check the address") from None
    except OSError as e:
        raise UserError(f"cannot reach the worker at {endpoint}: {e.strerror or e}") from None
    return WorkerInfo(endpoint, version, count, free, total, alignment, max_size)


def _hello(sock: socket.socket, endpoint: str) -> tuple[int, int, int]:
    sock.sendall(struct.pack("<BQ", HELLO, CAPS_SIZE) + bytes(CAPS_SIZE))
    size = struct.unpack("<Q", _recv(sock, 8, endpoint))[0]
    if size != 4 + CAPS_SIZE:
        raise UserError(f"the worker at {endpoint} answered HELLO with {size} bytes, not {4 + CAPS_SIZE}: it runs another llama.cpp RPC protocol than {'.'.join(map(str, PROTOCOL))}; install the same localinfer version on both machines")
    major, minor, patch, _ = _recv(sock, size, endpoint)[:4]
    return major, minor, patch


def _call(sock: socket.socket, command: int, data: bytes, size: int, endpoint: str) -> bytes:
    sock.sendall(struct.pack("<BQ", command, len(data)) + data)
    got = struct.unpack("<Q", _recv(sock, 8, endpoint))[0]
    if got != size:
        raise UserError(f"the worker at {endpoint} answered command {command} with {got} bytes, not {size}: not a llama.cpp RPC worker of protocol {'.'.join(map(str, PROTOCOL))}")
    return _recv(sock, size, endpoint)


def _recv(sock: socket.socket, n: int, endpoint: str) -> bytes:
    data = b""
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise UserError(f"the worker at {endpoint} closed the connection: is it a llama.cpp RPC worker?")
        data += chunk
    return data
