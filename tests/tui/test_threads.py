"""The chat app's UI threads give way to the model's (tui/threads.py). Checked in a process of
its own: a raised nice value cannot be lowered again, and the test process's threads must
keep theirs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from ..conftest import THREADS

NICE = 7

# The app, headless, on the embedded model: a reply, then every thread's nice value and CPU
# time from /proc, by role.
SCRIPT = """
import asyncio, json, os, sys, threading, time
from pathlib import Path
from localinfer.cli.chat import model_loader
from localinfer.engine.loader import LoadOptions
from localinfer.tui.app import ChatApp
from localinfer.tui.store import ChatStore
from localinfer.tui.widgets import PromptInput

def task(tid):
    stat = Path(f"/proc/self/task/{tid}/stat").read_text()
    fields = stat[stat.rindex(")") + 2:].split()
    return {"nice": int(fields[16]), "cpu": int(fields[11]) + int(fields[12])}

async def until(pilot, condition):
    deadline = time.monotonic() + 300
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.05)

BASE = os.getpriority(os.PRIO_PROCESS, 0)  # the nice value this process started with

async def main():
    store = ChatStore.open(Path(sys.argv[1]) / "chats.db")
    chat = store.new_chat("Nice", None)
    store.save_settings(chat.id, {"temperature": 0.0, "max_tokens": 16})
    app = ChatApp(store, model_loader(LoadOptions(threads=int(sys.argv[2]), ctx=512)), chat_id=chat.id, ui_nice=int(sys.argv[3]))
    async with app.run_test(size=(100, 30)) as pilot:
        await until(pilot, lambda: app.model is not None)
        prompt = app.query_one(PromptInput)
        prompt.text = "Hi"
        await pilot.press("enter")
        await until(pilot, lambda: app.reply is not None or not prompt.text)
        await until(pilot, lambda: app.reply is None)
        named = {t.native_id: t.name for t in threading.enumerate()}
        tasks = {int(tid): task(tid) for tid in [p.name for p in Path("/proc/self/task").iterdir()]}
        print(json.dumps({"base": BASE, "main": threading.main_thread().native_id, "starter": app.model_threads.starter_id,
                          "threads": [{"tid": tid, "name": named.get(tid), **t} for tid, t in tasks.items()]}))

asyncio.run(main())
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a thread's own nice value is Linux's (elsewhere give_way does nothing)")
def test_the_ui_threads_take_the_nice_value_and_the_models_keep_theirs(tmp_path: Path) -> None:
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path), str(THREADS), str(NICE)], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    by_tid = {t["tid"]: t for t in seen["threads"]}
    base, nice = seen["base"], max(seen["base"], NICE)  # pytest itself may run niced
    assert by_tid[seen["main"]]["nice"] == nice  # the UI's own thread gives way
    assert by_tid[seen["starter"]]["nice"] == base  # the thread that starts the model's never does
    model_side = [t for t in seen["threads"] if (t["name"] or "").startswith("localinfer-")]  # the engine, its prompt cache's writer
    assert {t["name"] for t in model_side} >= {"localinfer-engine", "localinfer-starter"} and all(t["nice"] == base for t in model_side), model_side
    [engine] = [t for t in model_side if t["name"] == "localinfer-engine"]
    team = [t for t in seen["threads"] if t["name"] is None and t["tid"] > engine["tid"]]  # started by the engine's thread: its OpenMP team
    assert len(team) >= THREADS - 1 and all(t["nice"] == base for t in team), team
    ui_side = [t for t in seen["threads"] if t["name"] is not None and t not in model_side]  # Textual's threads, the load's and the reply's workers
    assert ui_side and all(t["nice"] == nice for t in ui_side), ui_side
