"""Make docs/chat.svg, the README's screenshot: a real greedy conversation with the embedded
model, in-process, saved by Textual's own screenshot action. Run from the repository root:
    .venv/bin/python docs/chat_screenshot.py
"""

import asyncio
import tempfile
from pathlib import Path

from localinfer.cli.chat import model_loader
from localinfer.engine.loader import LoadOptions
from localinfer.tui.app import ChatApp
from localinfer.tui.store import ChatStore
from localinfer.tui.widgets import PromptInput

QUESTIONS = ["What is the capital of France? One sentence.", "Write a Python function that reverses a string."]


async def main(out: Path) -> None:
    with tempfile.TemporaryDirectory() as home:
        store = ChatStore.open(Path(home) / "chats.db")
        store.new_chat("Ideas for a picnic", "smollm2:135m")
        chat = store.new_chat("Capitals and code", None)
        store.save_settings(chat.id, {"temperature": 0.0, "max_tokens": 120})
        app = ChatApp(store, model_loader(LoadOptions()), chat_id=chat.id)
        async with app.run_test(size=(124, 36)) as pilot:
            for question in QUESTIONS:
                while app.model is None or app.reply is not None:
                    await pilot.pause(0.05)
                app.query_one(PromptInput).text = question
                await pilot.press("enter")
                await pilot.pause(0.3)
            while app.reply is not None:
                await pilot.pause(0.05)
            await pilot.pause(0.5)
            app.action_screenshot(filename=out.name, path=str(out.parent))


if __name__ == "__main__":
    asyncio.run(main(Path("docs/chat.svg")))
