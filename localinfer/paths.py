"""Where localinfer keeps its files. LOCALINFER_HOME overrides everything (tests use it).

Asking where a folder is never creates it: `run ./model.gguf` and `list` work even where
the data folder cannot be written. Only code about to write calls `ensure_dir`.
"""

import os
import tempfile
from pathlib import Path

import platformdirs

from localinfer.errors import UserError


def data_dir() -> Path:
    home = os.environ.get("LOCALINFER_HOME")
    return Path(home).expanduser() if home else Path(platformdirs.user_data_dir("localinfer", appauthor=False))


def models_dir() -> Path:
    """Downloaded GGUF files, one folder per hub repo."""
    return data_dir() / "models"


def manifests_dir() -> Path:
    """One JSON file per pulled model: what `list` shows and `rm` removes."""
    return data_dir() / "manifests"


def prompt_cache_dir() -> Path:
    """KV blocks of prompts, a folder per model loaded a given way (engine/prompt_cache.py)."""
    return data_dir() / "prompt-cache"


def history_file() -> Path:
    return data_dir() / "history"


def ensure_dir(path: Path) -> Path:
    """Create `path` (and its parents) for writing, or say in one line why it cannot be."""
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        hint = " (set LOCALINFER_HOME to a folder you can write)" if path.is_relative_to(data_dir()) else ""
        raise UserError(f"cannot create the folder {path}: {e.strerror or e}{hint}") from None
    if not os.access(path, os.W_OK | os.X_OK):
        raise UserError(f"cannot write to the folder {path}: permission denied (set LOCALINFER_HOME to a folder you can write)")
    return path


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write to a temporary file in the same folder, then rename: readers see all or nothing.
    The file gets the mode a plain open() would give it (mkstemp's is 0600). `durable`: on
    disk before the rename (fsync); a cache whose files carry a checksum can do without."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _umask() -> int:
    """The process's umask, read without changing it where the system tells it (Linux)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask
