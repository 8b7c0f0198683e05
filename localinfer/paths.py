"""Where localinfer keeps its files. LOCALINFER_HOME overrides everything (tests use it)."""

import os
from pathlib import Path

import platformdirs


def data_dir() -> Path:
    home = os.environ.get("LOCALINFER_HOME")
    path = Path(home) if home else Path(platformdirs.user_data_dir("localinfer", appauthor=False))
    path.mkdir(parents=True, exist_ok=True)
    return path


def models_dir() -> Path:
    """Downloaded GGUF files, one folder per hub repo."""
    path = data_dir() / "models"
    path.mkdir(parents=True, exist_ok=True)
    return path


def manifests_dir() -> Path:
    """One JSON file per pulled model: what `list` shows and `rm` removes."""
    path = data_dir() / "manifests"
    path.mkdir(parents=True, exist_ok=True)
    return path


def history_file() -> Path:
    return data_dir() / "history"
