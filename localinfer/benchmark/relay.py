"""A TCP relay between llama.cpp's RPC client and a worker that counts round trips (the
times the worker answers after the client has sent: a request the client waits on) and
bytes. Loopback hides the network: round trips per token times a real network's round-trip
time, plus bytes per token over its bandwidth, is what the network adds to each token, so
`bench model --rpc` reports both.

The relay adds its own latency, so it is used in a counting pass apart from the timed runs.
"""

from __future__ import annotations

import socket
import threading


class CountingRelay:
    """Listens on a loopback port and relays each connection to `endpoint`."""

    def __init__(self, endpoint: str) -> None:
        host, _, port = endpoint.rpartition(":")
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.endpoint = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._lock = threading.Lock()
        self._client_spoke = False
        self.round_trips = 0
        self.bytes = 0  # both ways
        threading.Thread(target=self._accept, daemon=True, name="rpc-relay").start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.create_connection(self._target)
            for s in (client, server):
                s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._pump, args=(client, server, True), daemon=True).start()
            threading.Thread(target=self._pump, args=(server, client, False), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket, from_client: bool) -> None:
        try:
            while data := source.recv(1 << 20):
                with self._lock:
                    self.bytes += len(data)
                    if from_client:
                        self._client_spoke = True
                    elif self._client_spoke:
                        self._client_spoke = False
                        self.round_trips += 1
                sink.sendall(data)
        except OSError:
            pass
        finally:
            for s in (source, sink):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def close(self) -> None:
        self._listener.close()
