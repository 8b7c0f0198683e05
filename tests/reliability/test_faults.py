"""Faults outside the server (issue 15, item 6): two writers on one model store, a disk
that fills up during `pull` and `quantize`, and the chat app killed with SIGKILL mid-reply."""

from __future__ import annotations

import json
import os
import pty
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from ..conftest import cli_env, run_cli, start_cli
from ..fakehub import FakeHub
from ..store.test_pull import ggufs_under, hub_env, hub_root  # noqa: F401 - hub_root is a fixture

MODEL = "acme/tiny-GGUF:Q4_1"


@contextmanager
def small_disk(path: Path, megabytes: int) -> Iterator[Path]:
    """A tmpfs of `megabytes` at `path`: a disk that fills up. Mounting needs root (or
    CAP_SYS_ADMIN); without it the test is skipped, saying why."""
    path.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={megabytes}m", "tmpfs", str(path)], capture_output=True, text=True)
    if r.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({r.stderr.strip() or 'mount failed'}); run as root to test a full disk")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", str(path)], check=False)


# --- two writers ---------------------------------------------------------------------------


def test_two_pulls_of_one_model_at_once(hub_root: Path, isolated_home: Path, model_path: Path) -> None:  # noqa: F811
    """Without the lock both appended to one .partial: a file of the wrong bytes."""
    with FakeHub(hub_root, delay=0.002) as hub:  # ~30 MB/s: both run for a few seconds
        env = hub_env(hub, isolated_home)
        procs = [start_cli("pull", MODEL, "--json", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for _ in range(2)]
        results = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert any("another localinfer is writing" in err for _, err in results), results
    path = Path(json.loads(results[0][0])["path"])
    assert path.read_bytes() == model_path.read_bytes()
    assert ggufs_under(isolated_home) == [path]
    assert [m["name"] for m in json.loads(run_cli("list", "--json", env=env).stdout)].count(MODEL) == 1


def test_rm_waits_for_a_writer_of_the_same_model(hub_root: Path, isolated_home: Path) -> None:  # noqa: F811
    with FakeHub(hub_root) as hub:
        env = hub_env(hub, isolated_home)
        path = Path(json.loads(run_cli("pull", MODEL, "--json", env=env).stdout)["path"])
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; from localinfer.store.lock import model_lock\n"
         "with model_lock(Path(sys.argv[1])):\n    print('held', flush=True); time.sleep(2)", str(path.parent)],
        stdout=subprocess.PIPE, text=True, env=cli_env(env),
    )  # fmt: skip
    assert holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    r = run_cli("rm", MODEL, env=env)
    holder.wait(timeout=30)
    assert r.returncode == 0 and "another localinfer is writing" in r.stderr, r.stderr
    assert time.monotonic() - started > 1  # it waited for the holder
    assert ggufs_under(isolated_home) == []


# --- a full disk ---------------------------------------------------------------------------


def test_a_disk_too_small_for_a_pull_is_refused_before_the_download(hub_root: Path, tmp_path: Path) -> None:  # noqa: F811
    with small_disk(tmp_path / "disk", 40) as home, FakeHub(hub_root) as hub:
        r = run_cli("pull", MODEL, env=hub_env(hub, home))
        assert r.returncode == 1 and "not enough disk space" in r.stderr and "Traceback" not in r.stderr, r.stderr
        assert ggufs_under(home) == [] and not list(home.rglob("*.partial")) and hub.log == []


def test_the_disk_filling_up_during_a_pull_leaves_nothing(hub_root: Path, tmp_path: Path) -> None:  # noqa: F811
    """Room for the model when the pull starts; then something else takes it."""
    with small_disk(tmp_path / "disk", 130) as home, FakeHub(hub_root, delay=0.005) as hub:
        proc = start_cli("pull", MODEL, env=hub_env(hub, home), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while time.time() < deadline and not [p for p in home.rglob("*.partial") if p.stat().st_size > 5_000_000]:
            time.sleep(0.1)
        filler = home / "filler"
        with open(filler, "wb") as f:  # take all but a little of what is left
            try:
                f.write(b"\0" * max(0, os.statvfs(home).f_bavail * os.statvfs(home).f_frsize - 1_000_000))
            except OSError:
                pass
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 1 and "disk filled up" in err and "Traceback" not in err, err
        assert len([line for line in err.splitlines() if line.strip()]) == 1, err
        assert ggufs_under(home) == [] and not list(home.rglob("*.partial"))
        filler.unlink()
        assert MODEL not in run_cli("list", "--json", env=hub_env(hub, home)).stdout


def test_the_disk_filling_up_during_quantize_leaves_nothing(model_path: Path, tmp_path: Path) -> None:
    with small_disk(tmp_path / "disk", 60) as disk:  # Q8_0 of the embedded model is ~145 MB
        out = disk / "smollm2-q8_0.gguf"
        r = run_cli("quantize", str(model_path), "Q8_0", "--allow-requantize", "-o", str(out))
        assert r.returncode == 1 and "Traceback" not in r.stderr, r.stderr
        assert [line for line in r.stderr.splitlines() if line.startswith("error: ")], r.stderr
        assert list(disk.iterdir()) == []  # no output, no temporary file


# --- the chat app killed mid-reply ---------------------------------------------------------


def test_chat_killed_mid_reply_keeps_every_saved_chat(isolated_home: Path) -> None:
    from localinfer.tui.store import ChatStore

    store = ChatStore.open()
    saved = []
    for i in range(3):
        chat = store.new_chat(f"chat {i}", model="smollm2:135m")
        store.add(chat.id, "user", f"question {i}")
        store.add(chat.id, "assistant", f"answer {i}", finish_reason="stop")
        saved.append(chat.id)
    store.close()

    pid, fd = pty.fork()
    if pid == 0:  # the child: the real app on a terminal of its own
        env = cli_env({"TERM": "xterm-256color", "COLUMNS": "100", "LINES": "30"})
        os.execvpe(sys.executable, [sys.executable, "-m", "localinfer", "chat", "--engine", "native", "--threads", "1"], env)
    try:
        # The model is loaded once the status line names its engine. (Not "smollm2": the saved
        # chats in the sidebar name it from the first frame, long before the model loads, and
        # Enter before then only warns "not loaded yet", so on a slower machine no reply began.)
        read_until(fd, "· native", 120)
        os.write(fd, b"Write a very long story about a lighthouse keeper and the sea.")
        read_until(fd, "sea.", 30)  # the prompt box shows all of it
        os.write(fd, b"\r")
        read_until(fd, "tok/s …", 60)  # a reply is streaming (the status line's " …")
    finally:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        os.close(fd)

    db = sqlite3.connect(isolated_home / "chats.db")
    assert db.execute("PRAGMA integrity_check").fetchone() == ("ok",)
    db.close()
    store = ChatStore.open()
    for i, chat_id in enumerate(saved):
        assert [(m.role, m.content) for m in store.messages(chat_id)] == [("user", f"question {i}"), ("assistant", f"answer {i}")]
    new = [c for c in store.chats() if c.id not in saved]
    assert len(new) == 1 and [m.role for m in store.messages(new[0].id)] == ["user"]  # the reply was mid-way: not saved, nothing else lost
    store.close()
    r = run_cli("chat", "--list")
    assert r.returncode == 0 and "chat 0" in r.stdout


def read_until(fd: int, needle: str, timeout: float) -> str:
    """Read the app's terminal output until `needle` shows (escape codes and all)."""
    import select

    seen = b""
    deadline = time.time() + timeout
    while time.time() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.2)
        if ready:
            try:
                seen += os.read(fd, 65536)
            except OSError:
                break
            if needle.encode() in seen:
                return seen.decode(errors="replace")
    raise AssertionError(f"{needle!r} never showed: {seen[-500:]!r}")
