"""A stand-in for the Hugging Face hub: files from a local folder, served on loopback
with the headers and JSON that huggingface-hub reads. Tests never touch the network.

Layout on disk: ROOT/<owner>/<repo>/<file>. `delay` slows each 64 KiB chunk so a test
can interrupt a download halfway. `log` records every file request (its Range header and
the bytes actually sent), so a test can check what the client asked for and received.
`etag` replaces the file's sha256 in the ETag headers: a wrong one, or a non-hash one.
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class FileRequest:
    method: str
    filename: str
    range: str | None  # the Range header as sent
    bytes_sent: int = 0
CHUNK = 1 << 16


@lru_cache(maxsize=32)
def _sha256(path: Path, mtime: float) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class FakeHub:
    def __init__(self, root: Path, delay: float = 0.0, etag: Callable[[str], str] | None = None) -> None:
        self.root = root
        self.delay = delay
        self.etag = etag or (lambda sha: sha)
        self.log: list[FileRequest] = []
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_HEAD(self) -> None:
                self._serve(body=False)

            def do_GET(self) -> None:
                self._serve(body=True)

            def _serve(self, body: bool) -> None:
                parts = [unquote(p) for p in urlparse(self.path).path.strip("/").split("/")]
                if parts[:2] == ["api", "models"] and len(parts) >= 6 and parts[4] == "tree":
                    return self._tree(parts[2], parts[3])
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    return self._info(parts[2], parts[3])
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._file(parts[0], parts[1], "/".join(parts[4:]), body)
                self._json({"error": "not found"}, 404)

            def _json(self, payload: object, status: int = 200, headers: dict[str, str] | None = None) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.end_headers()
                self.wfile.write(data)

            def _repo(self, owner: str, name: str) -> Path | None:
                folder = hub.root / owner / name
                return folder if folder.is_dir() else None

            def _missing_repo(self) -> None:
                self._json({"error": "Repository not found"}, 404, {"X-Error-Code": "RepoNotFound"})

            def _tree(self, owner: str, name: str) -> None:
                folder = self._repo(owner, name)
                if folder is None:
                    return self._missing_repo()
                files = [
                    {"type": "file", "path": p.name, "size": p.stat().st_size, "oid": COMMIT,
                     "lfs": {"oid": _sha256(p, p.stat().st_mtime), "size": p.stat().st_size, "pointerSize": 130}}
                    for p in sorted(folder.iterdir()) if p.is_file()
                ]
                self._json(files)

            def _info(self, owner: str, name: str) -> None:
                folder = self._repo(owner, name)
                if folder is None:
                    return self._missing_repo()
                siblings = [{"rfilename": p.name} for p in sorted(folder.iterdir()) if p.is_file()]
                self._json({"id": f"{owner}/{name}", "sha": COMMIT, "siblings": siblings})

            def _file(self, owner: str, name: str, filename: str, body: bool) -> None:
                folder = self._repo(owner, name)
                if folder is None:
                    return self._missing_repo()
                path = folder / filename
                if not path.is_file():
                    return self._json({"error": "Entry not found"}, 404, {"X-Error-Code": "EntryNotFound"})
                size = path.stat().st_size
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                request = FileRequest(self.command, filename, rng)
                if body:
                    hub.log.append(request)
                self.send_response(206 if start else 200)
                sha = hub.etag(_sha256(path, path.stat().st_mtime))
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("ETag", f'"{sha}"')
                self.send_header("X-Linked-Etag", f'"{sha}"')
                self.send_header("X-Linked-Size", str(size))
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(size - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{size - 1}/{size}")
                self.end_headers()
                if not body:
                    return
                with open(path, "rb") as f:
                    f.seek(start)
                    while chunk := f.read(CHUNK):
                        try:
                            self.wfile.write(chunk)
                        except (BrokenPipeError, ConnectionResetError):
                            return
                        request.bytes_sent += len(chunk)
                        if hub.delay:
                            time.sleep(hub.delay)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
