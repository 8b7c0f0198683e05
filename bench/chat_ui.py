"""What the chat app's display costs the model: decode tokens/s of the same greedy reply
in the app (headless Textual, in-process engine) at several UI update rates, against the
engine alone in the same process, run after run in one process. On 2 cores the UI's
rendering and the decode threads share the CPU, so this is the app's real price there.

    .venv/bin/python bench/chat_ui.py [--engine llama.cpp|native] [--rates 5,15,30] [--runs 3] [--tokens 300] [--threads 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import localinfer.tui.app as app_module  # noqa: E402
from localinfer.cli.chat import model_loader  # noqa: E402
from localinfer.engine.loader import LoadOptions  # noqa: E402
from localinfer.tui.store import ChatStore  # noqa: E402
from localinfer.tui.widgets import PromptInput  # noqa: E402

PROMPT = "Tell me a long story about a dragon."


async def in_app(store: ChatStore, load: LoadOptions, tokens: int) -> float:
    chat = store.new_chat("bench")
    store.save_settings(chat.id, {"temperature": 0.0, "max_tokens": tokens})
    app = app_module.ChatApp(store, model_loader(load), chat_id=chat.id)
    async with app.run_test(size=(120, 40)) as pilot:
        while app.model is None:
            await pilot.pause(0.05)
        app.query_one(PromptInput).text = PROMPT
        await pilot.press("enter")
        while not store.messages(chat.id) or store.messages(chat.id)[-1].role != "assistant":
            await pilot.pause(0.05)
    return store.messages(chat.id)[-1].tokens_per_s


def engine_alone(load: LoadOptions, tokens: int) -> float:
    model = model_loader(load)(None, None)
    try:
        reply = model.reply([{"role": "user", "content": PROMPT}], {"temperature": 0.0, "max_tokens": tokens})
        for _ in reply:
            pass
        return reply.figures.tokens_per_s
    finally:
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rates", default="5,15,30")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", default="llama.cpp")
    args = ap.parse_args()
    load = LoadOptions(engine=args.engine, threads=args.threads)
    rates = [float(r) for r in args.rates.split(",")]
    results: dict[str, list[float]] = {"engine alone": []} | {f"app, {r:g} updates/s": [] for r in rates}
    with tempfile.TemporaryDirectory() as home:
        store = ChatStore.open(Path(home) / "chats.db")
        for _ in range(args.runs):  # interleaved, so drift on a shared machine hits every row alike
            results["engine alone"].append(engine_alone(load, args.tokens))
            for r in rates:
                app_module.UPDATES_PER_S = r
                results[f"app, {r:g} updates/s"].append(asyncio.run(in_app(store, load, args.tokens)))
    base = statistics.median(results["engine alone"])
    print(f"| {'setting':<22} | tok/s (median of {args.runs}) | vs engine alone |")
    print(f"|{'-' * 24}|{'-' * 23}|{'-' * 17}|")
    for name, values in results.items():
        m = statistics.median(values)
        print(f"| {name:<22} | {m:21.1f} | {m / base:15.2f} |")


if __name__ == "__main__":
    main()
