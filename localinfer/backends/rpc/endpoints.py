"""`--rpc HOST:PORT[,HOST:PORT...]` (or LOCALINFER_RPC): the workers' addresses, checked
before anything connects, each problem one line."""

from __future__ import annotations

import ipaddress
import re

from localinfer.errors import UserError

DEFAULT_PORT = 50052  # llama.cpp's rpc-server's
_HOSTNAME = re.compile(r"(?!-)[A-Za-z0-9-]{1,63}(?<!-)(\.(?!-)[A-Za-z0-9-]{1,63}(?<!-))*\.?")


def check_host(host: str) -> str:
    """An IPv4 address or a host name, as given; anything else is a UserError."""
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        if not _HOSTNAME.fullmatch(host) or host.replace(".", "").isdigit():
            raise UserError(f"'{host}' is not a host name or an IPv4 address") from None
        return host
    if address.version != 4:
        raise UserError(f"'{host}': llama.cpp's RPC backend reaches workers over IPv4 only")
    return host


def check_port(port: str | int, where: str) -> int:
    try:
        number = int(port)
    except ValueError:
        raise UserError(f"'{where}': the port '{port}' is not a number") from None
    if not 1 <= number <= 65535:
        raise UserError(f"'{where}': the port {number} is not between 1 and 65535")
    return number


def parse_endpoints(text: str) -> tuple[str, ...]:
    """'a:50052, b:50053' → ('a:50052', 'b:50053'): each HOST:PORT checked, none twice."""
    endpoints: list[str] = []
    for item in (part.strip() for part in text.split(",")):
        if not item:
            raise UserError(f"--rpc '{text}' has an empty address; give HOST:PORT[,HOST:PORT...]")
        host, sep, port = item.rpartition(":")
        if not sep or not host:
            raise UserError(f"--rpc '{item}' has no port; give HOST:PORT (a worker listens on {DEFAULT_PORT} unless told otherwise)")
        endpoint = f"{check_host(host)}:{check_port(port, item)}"
        if endpoint in endpoints:
            raise UserError(f"--rpc names {endpoint} twice; each worker serves one client, so list it once")
        endpoints.append(endpoint)
    return tuple(endpoints)
