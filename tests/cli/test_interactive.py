"""`localinfer run` with no prompt: an interactive chat on a real terminal (a pty)."""

import os
import pty
import time

from ..conftest import run_cli, start_cli


def test_interactive_set_clear_bye(isolated_home) -> None:
    leader, follower = pty.openpty()
    proc = start_cli("run", env={"TERM": "dumb"}, stdin=follower, stdout=follower, stderr=follower)
    os.close(follower)
    out = b""

    def read_until(marker: bytes, timeout: float = 120) -> None:
        nonlocal out
        deadline = time.time() + timeout
        while marker not in out and time.time() < deadline:
            try:
                out += os.read(leader, 4096)
            except OSError:
                break
        assert marker in out, out.decode(errors="replace")[-2000:]

    read_until(b">>> ")
    for line, marker in [
        (b"/set temperature 0", b"Set temperature to 0.0"),
        (b"/set max_tokens 12", b"Set max_tokens to 12"),
        (b"/set system Answer in one word.", b"Set the system prompt"),
        (b"What colour is the sky?", b">>> "),
        (b"/clear", b"Cleared the conversation"),
        (b"/nonsense", b"Unknown command"),
    ]:
        out = out[out.rfind(b">>> ") + 4 :]
        os.write(leader, line + b"\n")
        read_until(marker)
    os.write(leader, b"/bye\n")
    assert proc.wait(timeout=30) == 0
    os.close(leader)
    assert (isolated_home / "history").exists()


def test_empty_stdin_without_prompt_is_an_error() -> None:
    r = run_cli("run", input="")
    assert r.returncode == 2 and "no prompt given" in r.stderr
