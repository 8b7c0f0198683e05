"""`localinfer run` with no prompt: an interactive chat on a real terminal (a pty).

Answers are compared with one-shot runs of the same prompt, greedy, so each claim of the
README (`/set`, `/clear`, Ctrl-C) is checked against what the command line itself does."""

from __future__ import annotations

import json
import os
import pty
import re
import signal
import time

from localinfer.backends.base import LoadParams
from localinfer.backends.llamacpp import LlamaCppBackend
from localinfer.engine.conversation import answer_room, fit_conversation
from localinfer.engine.engine import Engine

from ..conftest import THREADS, run_cli, start_cli

QUESTION = "What colour is the sky?"
MAX_TOKENS = 16
PROMPT_TOKENS = re.compile(r"prompt (\d+) tokens")


class Chat:
    """`localinfer run ARGS` on a pty: send a line, read until the next prompt."""

    def __init__(self, *args: str) -> None:
        leader, follower = pty.openpty()
        self.proc = start_cli("run", *args, env={"TERM": "dumb"}, stdin=follower, stdout=follower, stderr=follower)
        os.close(follower)
        self.fd = leader
        self.out = b""
        self.read_until(b">>> ")

    def read_until(self, marker: bytes, timeout: float = 120) -> str:
        """Everything up to `marker` (consumed), as text with the terminal's \\r removed."""
        deadline = time.time() + timeout
        while marker not in self.out and time.time() < deadline:
            try:
                self.out += os.read(self.fd, 4096)
            except OSError:
                break
        assert marker in self.out, self.out.decode(errors="replace")[-2000:]
        before, _, self.out = self.out.partition(marker)
        return before.decode(errors="replace").replace("\r", "")

    def say(self, line: str, until: bytes = b">>> ") -> str:
        """What the session printed after `line` (its echo dropped), up to the next prompt."""
        os.write(self.fd, line.encode() + b"\n")
        text = self.read_until(until)
        return text.split("\n", 1)[1] if "\n" in text else ""

    def bye(self) -> int:
        os.write(self.fd, b"/bye\n")
        code = self.proc.wait(timeout=30)
        os.close(self.fd)
        return code


def one_shot(*args: str) -> dict:
    r = run_cli("run", "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--json", *args)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def answer_of(printed: str) -> str:
    """The answer in what a turn printed: the lines before --verbose's timing lines."""
    return "\n".join(line for line in printed.split("\n") if not line.startswith(("load ", "speculation:", "KV cache ", "native kernels:", "prompt cache:"))).strip()


def test_set_system_clear_and_greedy_match_one_shot_runs(isolated_home) -> None:
    plain = one_shot(QUESTION)["text"].strip()
    terse = one_shot("--system", "You're terse. Answer in one word.", QUESTION)["text"].strip()
    chat = Chat("--verbose")
    assert "Set temperature to 0.0" in chat.say("/set temperature 0")
    assert f"Set max_tokens to {MAX_TOKENS}" in chat.say(f"/set max_tokens {MAX_TOKENS}")
    first = chat.say(QUESTION)
    assert answer_of(first) == plain  # /set temperature 0 is --temperature 0
    first_prompt = int(PROMPT_TOKENS.search(first).group(1))
    second = chat.say(QUESTION)
    assert int(PROMPT_TOKENS.search(second).group(1)) > first_prompt  # the history is in the prompt
    assert "Cleared the conversation" in chat.say("/clear")
    third = chat.say(QUESTION)
    assert int(PROMPT_TOKENS.search(third).group(1)) == first_prompt and answer_of(third) == plain  # /clear emptied it
    # an apostrophe, unbalanced for a shell, is just text; the prompt is rendered with it
    assert "Set the system prompt" in chat.say("/set system You're terse. Answer in one word.")
    chat.say("/clear")
    assert answer_of(chat.say(QUESTION)) == terse
    assert "Unknown command" in chat.say("/nonsense")
    assert chat.bye() == 0
    assert (isolated_home / "history").exists()


def test_set_refuses_what_the_options_refuse() -> None:
    chat = Chat()
    for line, needle in [
        ("/set top_p 5", "must be between 0 and 1"),
        ("/set max_tokens 0", "must be between 1 and"),
        ("/set temperature -1", "must be at least 0"),
        ("/set temperature nan", "must be a finite number"),
        ("/set temperature 1e999", "must be a finite number, not inf"),
        ("/set seed 18446744073709551616", "must be between -1 and 18446744073709551615"),
        ("/set top_k 2.5", "not a whole number"),
        ("/set warmth 3", "Unknown option 'warmth'"),
        ("/set temperature", "Usage: /set"),
    ]:
        printed = chat.say(line)
        assert needle in printed and "Set " not in printed, (line, printed)
    for flag, value in [("--top-p", "5"), ("--max-tokens", "0"), ("--temperature", "-1"), ("--temperature", "1e999"), ("--seed", "18446744073709551616")]:
        assert run_cli("run", flag, value, "hi").returncode == 2  # the same values, refused as options
    assert chat.bye() == 0


def test_ctrl_c_stops_the_answer_and_keeps_the_session() -> None:
    chat = Chat("--temperature", "0", "--ctx", "4096")
    os.write(chat.fd, b"Write a very long story about a dragon.\n")
    chat.read_until(b"\n")  # the echo
    chat.out += os.read(chat.fd, 64)  # the answer has begun
    chat.proc.send_signal(signal.SIGINT)
    chat.read_until(b">>> ", timeout=30)
    assert chat.proc.poll() is None, "Ctrl-C must stop the answer, not the session"
    plain = one_shot(QUESTION)["text"].strip()
    chat.say(f"/set max_tokens {MAX_TOKENS}")
    assert answer_of(chat.say(QUESTION)) == plain  # the interrupted turn left nothing behind
    assert chat.bye() == 0


def test_long_conversation_drops_the_oldest_turns() -> None:
    chat = Chat("--temperature", "0", "--ctx", "160", "--system", "Be brief.")
    chat.say("/set max_tokens 24")
    notes = [chat.say(f"Tell me fact number {i} about the sea.") for i in range(6)]
    dropped = [n for n in notes if "dropped the" in n]
    assert dropped, notes[-1]
    assert "the system prompt stays" in dropped[0]
    assert "Traceback" not in "".join(notes)
    assert chat.bye() == 0


def test_fit_conversation_keeps_the_system_prompt(model_path) -> None:
    backend = LlamaCppBackend.load(model_path, LoadParams(n_ctx=128, n_threads=THREADS))
    try:
        engine = Engine(backend)
        system = {"role": "system", "content": "You are a helpful assistant who answers briefly."}
        turns = []
        for i in range(8):
            turns += [{"role": "user", "content": f"Question {i}: what is {i} plus {i}?"}, {"role": "assistant", "content": f"It is {2 * i}."}]
        messages = [system, *turns, {"role": "user", "content": "And 9 plus 9?"}]
        room = answer_room(engine.n_ctx, 16)
        fitted = fit_conversation(engine, messages, room)
        assert fitted.dropped > 0 and fitted.messages[0] == system and fitted.messages[-1] == messages[-1]
        assert fitted.messages[1]["role"] == "user"  # whole turns go, never half of one
        assert len(fitted.tokens) + room <= engine.n_ctx
        assert fitted.messages == [system, *messages[1 + fitted.dropped :]]
        # fewer dropped would not have fit
        fewer = [system, *messages[1 + fitted.dropped - 2 :]]  # one more whole turn
        assert len(engine.tokenize_prompt(engine.render_chat(fewer))) + room > engine.n_ctx
    finally:
        backend.close()


def test_prompt_on_stdin_is_the_prompt() -> None:
    as_argument = one_shot(QUESTION)
    r = run_cli("run", "--temperature", "0", "--max-tokens", str(MAX_TOKENS), "--json", input=QUESTION + "\n")  # as `echo` sends it
    assert r.returncode == 0, r.stderr
    on_stdin = json.loads(r.stdout)
    assert on_stdin["text"] == as_argument["text"]
    assert on_stdin["usage"]["prompt_tokens"] == as_argument["usage"]["prompt_tokens"]


def test_empty_stdin_without_prompt_is_an_error() -> None:
    r = run_cli("run", input="")
    assert r.returncode == 2 and "no prompt given" in r.stderr
