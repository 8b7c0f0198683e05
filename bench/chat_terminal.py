"""The chat app's decode rate in a real terminal against `localinfer run`'s, on the same model,
prompt and settings: what a user sees, not a headless run (bench/chat_ui.py draws nothing).

The app runs as a user starts it, `localinfer chat MODEL ...`, in a tmux pane of the given
size (a pty: Textual draws every frame, tmux parses every escape sequence), and its tokens/s is
read off the status line with `tmux capture-pane` once the reply ends. `run`'s comes from
`run --json` (the engine's Timings: decode tokens over decode time, TTFT excluded), which is
what the status line shows once a reply ends. Both are greedy, speculation off, no prompt
cache (so nothing writes blocks to disk during the decode), the same --max-tokens. Each app run
is paired with a `run` just before it, in turn, so drift on a shared machine hits both alike;
the table gives medians of the pairs' ratios.

    .venv/bin/python bench/chat_terminal.py [--model REF]... [--sizes 120x35,200x50] [--pairs 3] [--threads 2] [--tokens 300]
    .venv/bin/python bench/synthetic.py qwen2.5-0.5b --types Q4_K_M   # a 0.5B-shaped model (random weights), then:
    .venv/bin/python bench/chat_terminal.py --model default --model ~/.cache/localinfer/bench-models/qwen2.5-0.5b-Q4_K_M.gguf
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = str(ROOT / ".venv" / "bin" / "localinfer") if (ROOT / ".venv" / "bin" / "localinfer").exists() else "localinfer"
PROMPT = "Write a Python function that checks if a number is prime."
FINAL_RATE = re.compile(r"([\d.]+) tok/s │")  # the status line once the reply ends (while it streams: "tok/s …")
TOKENS = re.compile(r"│ (\d+) tokens")
TIMEOUT_S = 300


@dataclass
class Settings:
    threads: int
    tokens: int
    prompt: str
    engine: str
    quiet: float  # idle share of the machine to wait for before each measurement (0: none)

    def flags(self, model: str) -> list[str]:
        """What both commands are given: the model, greedy, no speculation, no prompt cache."""
        return ([] if model == "default" else [model]) + ["--draft", "none", "--no-prompt-cache", "--temperature", "0",
                "-n", str(self.tokens), "--threads", str(self.threads), "--engine", self.engine]  # fmt: skip


def cpu_name() -> str:
    """The CPU, from /proc/cpuinfo, with the vector extensions that matter to the kernels."""
    text = Path("/proc/cpuinfo").read_text()
    name = re.search(r"model name\s*:\s*(.*)", text)
    flags = re.search(r"flags\s*:\s*(.*)", text)
    have = set(flags.group(1).split()) if flags else set()
    extras = [x for x, flag in (("AVX-512", "avx512f"), ("VNNI", "avx512_vnni"), ("AMX", "amx_tile")) if flag in have]
    return f"{name.group(1).strip() if name else 'unknown CPU'} ({'+'.join(extras) or 'no AVX-512'}), {os.cpu_count()} cores"


def run_rate(model: str, s: Settings, env: dict[str, str]) -> tuple[float, int]:
    """`localinfer run --json`: the engine's decode tokens/s and the tokens it wrote."""
    out = subprocess.run([CLI, "run", *s.flags(model), "--json", s.prompt], env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if out.returncode:
        sys.exit(f"run failed: {out.stderr.strip()}")
    result = json.loads(out.stdout)
    return float(result["timings"]["tokens_per_s"]), int(result["usage"]["completion_tokens"])


class Tmux:
    """A tmux server of our own (its own socket, no user config), one session at a time."""

    def __init__(self) -> None:
        self.socket = f"localinfer-bench-{os.getpid()}"

    def __call__(self, *args: str, check: bool = True) -> str:
        out = subprocess.run(["tmux", "-L", self.socket, "-f", "/dev/null", *args], capture_output=True, text=True)
        if check and out.returncode:
            raise RuntimeError(f"tmux {args[0]}: {out.stderr.strip()}")
        return out.stdout

    def screen(self) -> str:
        return self("capture-pane", "-p", "-t", "app")

    def wait(self, condition, what: str, poll: float = 0.25) -> str:
        """The screen once `condition(screen)` holds; polled a few times a second (capture-pane is cheap)."""
        deadline = time.monotonic() + TIMEOUT_S
        while time.monotonic() < deadline:
            screen = self.screen()
            if condition(screen):
                return screen
            time.sleep(poll)
        raise TimeoutError(f"the app did not {what} within {TIMEOUT_S} s; its screen:\n{self.screen()}")

    def close(self) -> None:
        self("kill-server", check=False)


def app_rate(model: str, s: Settings, size: tuple[int, int], tmux: Tmux) -> tuple[float, int]:
    """The app in a width x height pane, as a new user meets it (a data folder of its own, no
    saved chats): load, send the prompt, read the status line once the reply ends."""
    home = tempfile.mkdtemp(prefix="chat-terminal-")
    command = " ".join(shlex.quote(x) for x in ["env", f"LOCALINFER_HOME={home}", "HF_HUB_OFFLINE=1", CLI, "chat", *s.flags(model)])
    tmux("new-session", "-d", "-s", "app", "-x", str(size[0]), "-y", str(size[1]), command)
    try:
        tmux.wait(lambda screen: "loading…" not in screen and "tok/s" not in screen and " · " in screen, "load the model")
        tmux("send-keys", "-t", "app", "-l", s.prompt)
        tmux("send-keys", "-t", "app", "Enter")
        screen = tmux.wait(lambda screen: FINAL_RATE.search(screen) is not None, "finish the reply", poll=1.0)  # the line stays: look seldom, not to take the decode's CPU
        tokens = TOKENS.search(screen)
        tmux("send-keys", "-t", "app", "C-q")
        return float(FINAL_RATE.search(screen).group(1)), int(tokens.group(1)) if tokens else 0
    finally:
        tmux("kill-session", "-t", "app", check=False)
        shutil.rmtree(home, ignore_errors=True)


def idle_share(seconds: float = 1.0) -> float:
    """The share of the machine's CPU time that was idle over `seconds` (/proc/stat)."""

    def sample() -> tuple[int, int]:
        fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
        return fields[3] + fields[4], sum(fields)  # idle + iowait, all

    (idle0, all0), _, (idle1, all1) = sample(), time.sleep(seconds), sample()
    return (idle1 - idle0) / max(1, all1 - all0)


def wait_quiet(share: float, limit_s: float = 120) -> None:
    """Start a measurement once the machine is idle (on a shared machine, another job's burst
    would halve one run and not the other); after `limit_s`, start anyway."""
    deadline = time.monotonic() + limit_s
    while share and time.monotonic() < deadline and idle_share() < share:
        pass


def measure(models: list[str], sizes: list[tuple[int, int]], pairs: int, s: Settings) -> dict[tuple[str, tuple[int, int]], list[tuple[float, float, int, int]]]:
    """(model, size) -> [(run tok/s, app tok/s, run tokens, app tokens)], pairs interleaved."""
    results: dict[tuple[str, tuple[int, int]], list[tuple[float, float, int, int]]] = {(m, z): [] for m in models for z in sizes}
    tmux = Tmux()
    with tempfile.TemporaryDirectory() as home:
        env = {**os.environ, "LOCALINFER_HOME": home, "HF_HUB_OFFLINE": "1"}  # run's; each app run gets a folder of its own
        try:
            for i in range(pairs):
                for model in models:
                    for size in sizes:
                        wait_quiet(s.quiet)
                        alone, n_run = run_rate(model, s, env)
                        wait_quiet(s.quiet)
                        in_app, n_app = app_rate(model, s, size, tmux)
                        results[model, size].append((alone, in_app, n_run, n_app))
                        print(f"pair {i + 1}: {model} {size[0]}x{size[1]}: run {alone:.1f} tok/s, app {in_app:.1f} tok/s ({in_app / alone:.2f}x)", file=sys.stderr)
        finally:
            tmux.close()
    return results


def table(results: dict[tuple[str, tuple[int, int]], list[tuple[float, float, int, int]]], pairs: int) -> str:
    rows = [f"| model | terminal | run tok/s | app tok/s | app / run, median of {pairs} pairs | range | tokens run/app |", "|---|---|---:|---:|---:|---|---|"]
    for (model, size), values in results.items():
        ratios = [app / alone for alone, app, _, _ in values]
        rows.append(f"| {Path(model).name} | {size[0]}×{size[1]} | {statistics.median(v[0] for v in values):.1f} | {statistics.median(v[1] for v in values):.1f} | "
                    f"**{statistics.median(ratios):.2f}×** | {min(ratios):.2f}–{max(ratios):.2f} | {values[0][2]}/{values[0][3]} |")  # fmt: skip
    return "\n".join(rows)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", action="append", help="a model reference (repeatable); 'default': the embedded model (the default)")
    ap.add_argument("--sizes", default="120x35,200x50", help="terminal sizes, WIDTHxHEIGHT, comma-separated")
    ap.add_argument("--pairs", type=int, default=3, help="run/app pairs per model and size")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=300, help="--max-tokens of both")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--engine", default="auto")
    ap.add_argument("--quiet", type=float, default=0.9, help="before each measurement, wait (up to 2 min) until this share of the CPU was idle for a second; 0: don't")
    args = ap.parse_args()
    sizes = [tuple(int(x) for x in size.split("x")) for size in args.sizes.split(",")]
    settings = Settings(args.threads, args.tokens, args.prompt, args.engine, args.quiet)
    results = measure(args.model or ["default"], sizes, args.pairs, settings)  # type: ignore[arg-type]
    print(f"{cpu_name()}; {args.threads} threads, greedy, --draft none, --max-tokens {args.tokens}; prompt: {args.prompt!r}\n")
    print(table(results, args.pairs))


if __name__ == "__main__":
    main()
