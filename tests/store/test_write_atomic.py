"""paths.write_atomic: all or nothing, with the mode a plain open() gives (manifests, chat
exports and bench results are written through it)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from localinfer.paths import write_atomic


def test_the_file_gets_the_umask_s_mode_like_open(tmp_path: Path) -> None:
    plain = tmp_path / "plain.txt"
    plain.write_bytes(b"x")
    write_atomic(tmp_path / "atomic.txt", b"x")
    assert stat.S_IMODE(os.stat(tmp_path / "atomic.txt").st_mode) == stat.S_IMODE(os.stat(plain).st_mode)


def test_a_failed_write_leaves_neither_the_file_nor_a_temporary(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "old.json").write_bytes(b"old")

    def no_space(fd: int) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", no_space)
    with pytest.raises(OSError):
        write_atomic(tmp_path / "new.json", b"new")
    with pytest.raises(OSError):
        write_atomic(tmp_path / "old.json", b"new")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["old.json"] and (tmp_path / "old.json").read_bytes() == b"old"
