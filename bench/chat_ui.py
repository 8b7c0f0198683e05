"""What the chat app's display costs the model: decode tokens/s of the same greedy reply
in the app (headless Textual, in-process engine) at several UI update rates, against the
engine alone in the same process, run after run in one process. On 2 cores the UI's
rendering and the decode threads share the CPU, so this is the app's real price there.

And whether the display keeps up: the lag of each token, from the moment the engine hands it
over to the moment the Markdown widget has taken in text that far (its `append` returned;
the screen repaints within a frame after), as median, p99 and max over every token.

    .venv/bin/python bench/chat_ui.py [--engine llama.cpp|native] [--rates 5,15,30] [--runs 3] [--tokens 300] [--threads 2]
    .venv/bin/python bench/chat_ui.py --replay 150,300   # the display alone, fed at a fixed speed
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import localinfer.tui.app as app_module  # noqa: E402
from localinfer.cli.chat import model_loader  # noqa: E402
from localinfer.engine.loader import LoadOptions  # noqa: E402
from localinfer.tui.store import ChatStore  # noqa: E402
from localinfer.tui.widgets import PromptInput  # noqa: E402
from textual.widgets import Markdown  # noqa: E402

PROMPT = "Tell me a long story about a dragon."


class Clock:
    """Arrival times of the reply's text (cumulative characters) and display times, for lags."""

    def __init__(self) -> None:
        self.arrived: list[tuple[float, int]] = []
        self.shown: list[tuple[float, int]] = []
        self.paced = 0.0  # tokens/s handed over, under --replay

    def lags(self) -> list[float]:
        out, k = [], 0
        for t, n in self.arrived:
            while k < len(self.shown) and self.shown[k][1] < n:
                k += 1
            out.append(self.shown[k][0] - t if k < len(self.shown) else float("inf"))
        return out


class TimedReply:
    """A reply that stamps each piece of text as the engine hands it over; the rest is the reply's."""

    def __init__(self, reply, clock: Clock) -> None:
        self._reply, self._clock = reply, clock

    def __getattr__(self, name: str):
        return getattr(self._reply, name)

    def __iter__(self):
        n = 0
        for text in self._reply:
            n += len(text)
            self._clock.arrived.append((time.monotonic(), n))
            yield text


class PacedReply(TimedReply):
    """The model's reply, written whole first, then handed over token by token at exactly
    `rate` tokens/s: what the display does at a given speed, whatever the model's own speed
    on this machine (its decode threads no longer share the cores with the UI)."""

    def __init__(self, reply, clock: Clock, rate: float) -> None:
        super().__init__(reply, clock)
        self._rate = rate

    def __iter__(self):
        pieces = list(self._reply)
        start, n = time.monotonic(), 0
        for i, text in enumerate(pieces):
            time.sleep(max(0.0, start + i / self._rate - time.monotonic()))
            n += len(text)
            self._clock.arrived.append((time.monotonic(), n))
            yield text
        self._clock.paced = len(pieces) / (time.monotonic() - start)


def timed_loader(load: LoadOptions, clock: Clock, rate: float | None = None):
    inner = model_loader(load)

    def loader(*args):
        model = inner(*args)
        reply_of = model.reply
        if rate:
            model.reply = lambda messages, settings: PacedReply(reply_of(messages, settings), clock, rate)
        else:
            model.reply = lambda messages, settings: TimedReply(reply_of(messages, settings), clock)
        return model

    return loader


async def in_app(store: ChatStore, load: LoadOptions, tokens: int, replay: float | None = None) -> tuple[float, list[float]]:
    chat = store.new_chat("bench")
    store.save_settings(chat.id, {"temperature": 0.0, "max_tokens": tokens})
    clock = Clock()
    app = app_module.ChatApp(store, timed_loader(load, clock, replay), chat_id=chat.id)
    shown = 0
    original = Markdown.append

    async def append(widget, markdown: str):  # what the reply's MarkdownStream calls
        nonlocal shown
        result = await original(widget, markdown)
        shown += len(markdown)
        clock.shown.append((time.monotonic(), shown))
        return result

    Markdown.append = append
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            while app.model is None:
                await pilot.pause(0.05)
            app.query_one(PromptInput).text = PROMPT
            await pilot.press("enter")
            while not store.messages(chat.id) or store.messages(chat.id)[-1].role != "assistant":
                await pilot.pause(0.05)
    finally:
        Markdown.append = original
    return (clock.paced if replay else store.messages(chat.id)[-1].tokens_per_s), clock.lags()


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
    ap.add_argument("--rates", default="5,15,30", help="UI updates per second to compare")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=300)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--engine", default="llama.cpp")
    ap.add_argument("--replay", default="", help="instead of the live model, its reply handed over at these tokens/s (e.g. 150,300), at the default update rate")
    args = ap.parse_args()
    load = LoadOptions(engine=args.engine, threads=args.threads)
    if args.replay:
        settings = {f"replay at {float(r):g} tok/s": (None, float(r)) for r in args.replay.split(",")}
    else:
        settings = {"engine alone": (None, None)} | {f"app, {float(r):g} updates/s": (float(r), None) for r in args.rates.split(",")}
    results: dict[str, list[float]] = {name: [] for name in settings}
    lags: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory() as home:
        store = ChatStore.open(Path(home) / "chats.db")
        for _ in range(args.runs):  # interleaved, so drift on a shared machine hits every row alike
            for name, (updates, replay) in settings.items():
                if name == "engine alone":
                    results[name].append(engine_alone(load, args.tokens))
                    continue
                app_module.UPDATES_PER_S = updates or app_module.UPDATES_PER_S
                rate, lag = asyncio.run(in_app(store, load, args.tokens, replay))
                results[name].append(rate)
                lags[name] += lag
    base = statistics.median(results["engine alone"]) if "engine alone" in results else None
    print(f"| {'setting':<22} | tok/s (median of {args.runs}) | vs engine alone | display lag ms: median | p99 | max |")
    print(f"|{'-' * 24}|{'-' * 23}|{'-' * 17}|---:|---:|---:|")
    for name, values in results.items():
        m = statistics.median(values)
        lag = sorted(lags[name])
        shown = (f"{statistics.median(lag) * 1e3:.0f} | {lag[int(0.99 * (len(lag) - 1))] * 1e3:.0f} | {lag[-1] * 1e3:.0f}"
                 if lag else "– | – | –")  # fmt: skip
        ratio = f"{m / base:15.2f}" if base else f"{'–':>15}"
        print(f"| {name:<22} | {m:21.1f} | {ratio} | {shown} |")


if __name__ == "__main__":
    main()
