"""The prompt cache's parts without a model: chained block keys, RAM eviction, the disk tier's
budget, and every kind of bad file (flipped byte, truncated, another model's, a read-only
folder), each skipped in one line while the cache goes on."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import typer

from localinfer.cli.options import byte_size
from localinfer.engine.prompt_cache import PromptCache, block_hashes
from localinfer.store.block_files import BlockFiles, clear, folders

BLOCK = 4


def test_keys_chain_over_everything_before() -> None:
    a = block_hashes("id", list(range(12)), BLOCK)
    assert len(a) == 3 and len(set(a)) == 3
    assert block_hashes("id", list(range(10)), BLOCK) == a[:2]  # a partial last block has no key
    assert block_hashes("id", [0, 1, 2, 9, *range(4, 12)], BLOCK)[1:] != a[1:]  # an earlier token changes every later key
    assert block_hashes("other", list(range(12)), BLOCK) != a  # another model, engine or KV type
    assert block_hashes("id", list(range(12)), BLOCK, known=a[:1]) == a  # extended, not recomputed


def cache(tmp_path: Path, ram: int, disk: int, warnings: list[str]) -> PromptCache:
    model = tmp_path / "model.gguf"
    model.write_bytes(b"GGUF" + bytes(100))
    c = PromptCache({"engine": "test"}, model, ram, disk, tmp_path / "cache", warnings.append, block=BLOCK)
    assert c.wait_ready()
    return c


def test_ram_keeps_the_most_recently_used_within_its_budget(tmp_path: Path) -> None:
    warnings: list[str] = []
    c = cache(tmp_path, ram=25, disk=0, warnings=warnings)
    for key in "abc":
        c.put(key, BLOCK, key.encode() * 10)
    assert c.get("a") is None and c.stats.ram_evictions == 1  # 25 bytes hold two blocks of 10: the oldest went
    assert c.get("b") == (b"b" * 10, "ram")  # b is now the most recent
    c.put("d", BLOCK, b"d" * 10)
    assert c.get("c") is None and c.get("b") is not None and c.ram_bytes <= 25
    assert warnings == []


def test_disk_outlives_the_process_and_stays_in_its_budget(tmp_path: Path) -> None:
    warnings: list[str] = []
    c = cache(tmp_path, ram=0, disk=2000, warnings=warnings)
    for i in range(10):
        c.put(f"{i:032x}", BLOCK, bytes([i]) * 300)
        c.flush()
        os.utime(c.disk.path(f"{i:032x}"), (1000 + i, 1000 + i))  # type: ignore[union-attr]  # an order mtime can tell
    c.close()
    again = cache(tmp_path, ram=1000, disk=2000, warnings=warnings)
    kept = [i for i in range(10) if again.get(f"{i:032x}") is not None]
    assert kept == list(range(10 - len(kept), 10)) and 0 < len(kept) < 10  # the oldest went first
    assert sum(e.bytes for e in folders(tmp_path / "cache")) <= 2000
    assert again.get(f"{9:032x}") == (bytes([9]) * 300, "ram")  # read from disk once, then from RAM
    assert warnings == []


def damaged(tmp_path: Path, damage) -> tuple[bytes | None, list[str], Path]:  # type: ignore[no-untyped-def]
    warnings: list[str] = []
    c = cache(tmp_path, ram=0, disk=10_000, warnings=warnings)
    key = "ab" * 16
    c.put(key, BLOCK, b"kv bytes " * 20)
    c.flush()
    path = c.disk.path(key)  # type: ignore[union-attr]
    damage(path, c)
    return c.get(key), warnings, path


@pytest.mark.parametrize(
    "damage",
    [
        lambda p, c: p.write_bytes(p.read_bytes()[:-1] + bytes([p.read_bytes()[-1] ^ 1])),  # a flipped byte
        lambda p, c: p.write_bytes(p.read_bytes()[:40]),  # truncated
        lambda p, c: p.write_bytes(b""),
        lambda p, c: p.write_bytes(p.read_bytes().replace(c.identity.encode(), b"f" * len(c.identity))),  # another model's, renamed in
    ],
    ids=["flipped byte", "truncated", "empty", "another model"],
)
def test_a_bad_block_file_is_skipped_and_deleted_in_one_line(tmp_path: Path, damage) -> None:  # type: ignore[no-untyped-def]
    data, warnings, path = damaged(tmp_path, damage)
    assert data is None and not path.exists()
    assert len(warnings) == 1 and "\n" not in warnings[0] and path.name in warnings[0]


def test_a_folder_it_cannot_write_stops_disk_writes_in_one_line(tmp_path: Path) -> None:
    """The cache folder's place is taken by a file (a read-only folder does the same to a
    user, but not to root, who runs CI): one line, and RAM goes on."""
    (tmp_path / "cache").write_text("not a folder")
    warnings: list[str] = []
    c = cache(tmp_path, ram=1000, disk=10_000, warnings=warnings)
    for key in ("1" * 32, "2" * 32):
        c.put(key, BLOCK, b"x" * 10)
    c.flush()
    assert len(warnings) == 1 and "cannot write" in warnings[0]
    assert c.get("1" * 32) == (b"x" * 10, "ram")


def test_a_full_disk_stops_disk_writes_in_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ENOSPC from the write: one line, then no more attempts; the cache keeps serving from RAM."""
    import localinfer.store.block_files as bf

    warnings: list[str] = []
    c = cache(tmp_path, ram=1000, disk=10_000, warnings=warnings)
    calls: list[Path] = []

    def full(path: Path, data: bytes, durable: bool = True) -> None:
        calls.append(path)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(bf, "write_atomic", full)
    for key in ("1" * 32, "2" * 32, "3" * 32):
        c.put(key, BLOCK, b"x" * 10)
    c.flush()
    assert len(calls) == 1 and len(warnings) == 1 and "No space left" in warnings[0]
    assert c.get("3" * 32) == (b"x" * 10, "ram")


def test_clear_empties_the_folder(tmp_path: Path) -> None:
    c = cache(tmp_path, ram=0, disk=10_000, warnings=[])
    c.put("c" * 32, BLOCK, b"y" * 50)
    c.close()
    assert [e.blocks for e in folders(tmp_path / "cache")] == [1]
    files, size = clear(tmp_path / "cache")
    assert files == 1 and size > 50 and folders(tmp_path / "cache") == []


def test_sizes_on_the_command_line() -> None:
    assert byte_size("512M") == 512 << 20 and byte_size("4G") == 4 << 30 and byte_size("1.5GB") == int(1.5 * (1 << 30))
    assert byte_size("0") == 0 and byte_size("1000") == 1000 and byte_size("2GiB") == 2 << 30 and byte_size(None) is None
    for bad in ("lots", "-1G", "G"):
        with pytest.raises(typer.BadParameter):
            byte_size(bad)


def test_block_files_of_one_identity_share_nothing_with_another(tmp_path: Path) -> None:
    a = BlockFiles(tmp_path, "a" * 32, {}, 10_000, print)
    b = BlockFiles(tmp_path, "b" * 32, {}, 10_000, print)
    a.write("k" * 32, BLOCK, b"from a")
    a.flush()
    assert a.read("k" * 32) == b"from a" and b.read("k" * 32) is None
    a.close()
    b.close()
