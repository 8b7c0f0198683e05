"""`localinfer chat`: the Textual app. The layout is in compose() and chat.tcss; the chats
are in the store; replies come from a LocalModel (our Engine, in-process) or a
RemoteModel (`--url`), streamed by a worker thread so the UI never waits on the model.

Who does what: the UI thread owns the store and the widgets. Workers load models and
stream replies; they hand text and figures to the UI through call_from_thread, batched
to 10 updates a second, so a fast model costs the UI no more than a slow one.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Iterable
from pathlib import Path

from platformdirs import user_downloads_path
from textual import on, work
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Input, Label, ListView

from localinfer.engine.templates import Message
from localinfer.engine.types import SamplingParams
from localinfer.errors import UserError
from localinfer.tui.attachments import Attachment, typed_path
from localinfer.tui.export import export_chat
from localinfer.tui.replies import Reply, ReplyFigures
from localinfer.tui.screens import SETTINGS, AskScreen, ConfirmScreen, SettingsScreen
from localinfer.tui.store import Chat, ChatMessage, ChatStore
from localinfer.tui.threads import ModelThreads, give_way
from localinfer.tui.widgets import ChatItem, MessageView, PromptInput, StatusLine, warm_up

UPDATES_PER_S = 10  # what the eye needs to see text flow; each update's drawing is CPU the decode threads lose (docs/benchmarks.md)
TITLE_LENGTH = 40

# A model loader: (model reference or None, URL or None) -> LocalModel | RemoteModel.
Loader = Callable[[str | None, str | None], object]


class ChatApp(App):
    CSS_PATH = "chat.tcss"
    TITLE = "localinfer chat"
    BINDINGS = [
        Binding("escape", "stop", "Stop"),
        Binding("ctrl+n", "new_chat", "New"),
        Binding("ctrl+r", "regenerate", "Regen"),
        Binding("ctrl+b", "other_reply", "Other reply"),
        Binding("ctrl+t", "edit", "Edit"),
        Binding("ctrl+f", "search", "Search"),
        Binding("ctrl+s", "settings", "Settings"),
        Binding("ctrl+o", "attach_image", "Image"),
        Binding("f2", "rename", "Rename"),
        Binding("f3", "copy", "Copy"),
        Binding("f4", "export", "Export"),
        Binding("f9", "json_mode", "JSON"),
        Binding("f8", "delete", "Delete"),
        Binding("f5", "thinking", "Thinking"),
    ]
    # What the command palette offers: (title, help, action), one per binding's action.
    ACTIONS = [
        ("New chat", "Start a new conversation", "new_chat"),
        ("Stop reply", "Stop the reply being written; what it wrote is kept", "stop"),
        ("Regenerate", "Write the last reply again (the earlier one stays: Other reply)", "regenerate"),
        ("Other reply", "Show the last reply's other versions, in turn", "other_reply"),
        ("Edit message", "Change the focused (or last) message of yours and resend from there", "edit"),
        ("Attach image", "Attach an image file to your next message, for a vision model to read (or type /image PATH)", "attach_image"),
        ("Search chats", "Filter the chat list by title or content", "search"),
        ("Chat settings", "System prompt, sampling, max tokens, seed and model", "settings"),
        ("Rename chat", "Give this chat a new title", "rename"),
        ("Copy reply", "Copy the focused (or last) reply to the clipboard", "copy"),
        ("Export chat", "Write this chat to a Markdown or JSON file", "export"),
        ("JSON mode", "Turn this chat's JSON mode on or off: every reply a JSON object", "json_mode"),
        ("Delete chat", "Delete this chat, after asking", "delete"),
        ("Show thinking", "Expand or collapse the focused (or last) reply's thinking", "thinking"),
    ]

    def __init__(self, store: ChatStore, loader: Loader, model: str | None = None, url: str | None = None, chat_id: int | None = None,
                 sampling: dict[str, object] | None = None, ui_nice: int = 0) -> None:  # fmt: skip
        super().__init__()
        self.store = store
        self.loader = loader
        self.ui_nice = ui_nice  # the nice value the UI's threads take, so the decode's come first (tui/threads.py)
        self.model_threads = ModelThreads()  # started here, before any thread gives way
        # The command line's sampling options: a new chat starts with them, a saved one takes
        # those it does not set itself, and Settings shows them.
        self.given_sampling = {k: v for k, v in (sampling or {}).items() if v is not None}
        self.model_ref, self.url = model, url  # what the next new chat talks to
        self.model = None  # the loaded LocalModel | RemoteModel, None while loading or after a failure
        self.loaded: tuple[str | None, str | None] | None = None  # the (ref, url) self.model was loaded for
        self.model_state = "loading…"  # what the status line says while self.model is None
        self.chat: Chat | None = None  # None: a new chat, saved at its first message
        self.open_chat_id = chat_id
        self.pending_settings: dict[str, object] = dict(self.given_sampling)  # a new chat's settings, until it is saved
        self.reply: Reply | None = None  # the reply streaming now
        self._dropped_told = 0  # how many trimmed messages the user has been told of, for the reply streaming now
        self.editing: int | None = None  # the position of the user message being edited
        self.attached: list[Attachment] = []  # images that go with the next message sent
        self._view: MessageView | None = None
        self._text: list[str] = []
        self._last_figures: ReplyFigures | None = None

    # --- layout ------------------------------------------------------------------------
    def compose(self) -> ComposeResult:
        with Horizontal():
            with Vertical(id="sidebar"):
                yield Input(placeholder="Search chats", id="search")
                yield ListView(id="chats")
            with Vertical(id="main"):
                yield VerticalScroll(id="conversation")
                yield StatusLine(id="status")
                yield Label("", id="mode")
                yield PromptInput(id="prompt", soft_wrap=True, show_line_numbers=False)
        yield Footer(compact=True)

    def on_mount(self) -> None:
        give_way(self.ui_nice, keep={self.model_threads.starter_id})
        self.refresh_chats()
        if self.open_chat_id is not None:
            self.open_chat(self.store.chat(self.open_chat_id))
        else:
            self.ensure_model()
            self.show_conversation()
        self.query_one("#prompt").focus()

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        yield from super().get_system_commands(screen)
        for title, help, action in self.ACTIONS:
            yield SystemCommand(title, help, lambda action=action: self.run_action(action))

    def deliver_screenshot(self, filename: str | None = None, path: str | None = None, time_format: str | None = None) -> str | None:
        """Textual saves screenshots to the Downloads folder; a server or a container often has
        none, and then the palette's "Screenshot" failed. There it goes to the current folder."""
        if path is None:
            downloads = user_downloads_path()
            path = str(downloads if downloads.is_dir() else Path.cwd())
        return super().deliver_screenshot(filename, path, time_format)

    # --- the model ---------------------------------------------------------------------
    def target(self) -> tuple[str | None, str | None]:
        """The (model, URL) the open chat talks to."""
        return (self.chat.model, self.chat.url) if self.chat else (self.model_ref, self.url)

    def model_label(self) -> tuple[str, str]:
        if self.model is not None:
            return self.model.name, self.model.engine_name
        ref, url = self.target()
        return (ref or "default model"), self.model_state

    def ensure_model(self) -> None:
        """Load the open chat's model unless it is the one loaded (or loading) already."""
        if self.loaded != self.target():
            old, self.model = self.model, None
            self.loaded, self.model_state = self.target(), "loading…"
            self.show_status()
            self.load_model(*self.loaded, old)

    @work(thread=True, exclusive=True, group="load")
    def load_model(self, ref: str | None, url: str | None, old) -> None:
        """Close the model being replaced (`old`, if any), then load the new one."""
        if old is not None:
            old.close()
        warm_up()
        try:
            model = self.model_threads.run(self.loader, ref, url)  # not on this pooled, niced thread: see ModelThreads
        except Exception as e:  # a UserError, or a bug: never a traceback over the screen, and the app stays usable
            if self.loaded == (ref, url):
                self.model_state = "not loaded (pick another model in Settings)"
            self.call_from_thread(self.notify, str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}", title="The model did not load", severity="error", timeout=10)
            self.call_from_thread(self.show_status)
            return
        if self.loaded != (ref, url):  # the user moved on while it loaded
            model.close()
            return
        settle_heap()
        self.model = model
        self.call_from_thread(self.show_status)

    def show_status(self, figures: ReplyFigures | None = None, streaming: bool = False) -> None:
        name, engine = self.model_label()
        status = self.query_one(StatusLine)
        status.show_figures(name, engine, figures or self._last_figures, streaming)
        status.tooltip = self.model.engine_reason if self.model is not None else None  # which engine runs the model, and why

    # --- chats -------------------------------------------------------------------------
    def refresh_chats(self) -> None:
        search = self.query_one("#search", Input).value.strip()
        chats = self.query_one("#chats", ListView)
        chats.clear()
        counts = self.store.message_counts()
        chats.extend([ChatItem(chat, _chat_detail(chat, counts.get(chat.id, 0))) for chat in self.store.chats(search)])
        self.call_after_refresh(self._highlight_open_chat)  # once the items are mounted

    async def _list_new_chat(self) -> None:
        """The chat just saved, first in the list, which is not rebuilt for it: a reply starts
        streaming now, and a long list's rebuild would take the CPU from its decode."""
        if self.query_one("#search", Input).value.strip():  # it may not match the search
            self.refresh_chats()
            return
        await self.query_one("#chats", ListView).insert(0, [ChatItem(self.chat, _chat_detail(self.chat, 1))])
        self._highlight_open_chat()

    def _highlight_open_chat(self) -> None:
        chats = self.query_one("#chats", ListView)
        ids = [item.chat.id for item in chats.query(ChatItem)]
        if self.chat is not None and self.chat.id in ids and chats.index != ids.index(self.chat.id):
            chats.index = ids.index(self.chat.id)

    @on(ListView.Selected, "#chats")
    def chat_selected(self, event: ListView.Selected) -> None:
        if isinstance(event.item, ChatItem) and (self.chat is None or event.item.chat.id != self.chat.id):
            self.open_chat(event.item.chat)

    @on(Input.Changed, "#search")
    def search_changed(self) -> None:
        self.refresh_chats()

    def open_chat(self, chat: Chat | None) -> None:
        self.action_stop()
        self.chat = chat
        self.editing = None
        self.attached = []
        self.pending_settings = dict(self.given_sampling)
        self._last_figures = None
        self.ensure_model()
        self.show_conversation()
        self._highlight_open_chat()

    def show_conversation(self) -> None:
        conversation = self.query_one("#conversation", VerticalScroll)
        conversation.remove_children()
        messages = self.store.messages(self.chat.id) if self.chat else []
        images = self.store.images(self.chat.id) if self.chat else {}
        conversation.mount_all([MessageView(m.role, m.content, m, self._alternatives_note(m), images=images.get(m.id, ())) for m in messages])
        conversation.scroll_end(animate=False)
        last = next((m for m in reversed(messages) if m.role == "assistant"), None)
        self._last_figures = _stored_figures(last) if last else None
        self.show_status()
        self.show_mode()

    def show_mode(self) -> None:
        """The line above the prompt: a message being edited, and the images that go with the next one."""
        lines = ["Editing a message: Enter resends from there (the replies after it are replaced), Esc cancels."] if self.editing is not None else []
        if self.attached:
            lines.append("With your next message: " + "; ".join(a.describe() for a in self.attached) + " (/image none drops them)")
        self.query_one("#mode", Label).update("\n".join(lines))

    def _alternatives_note(self, message: ChatMessage | None) -> str:
        if message is None or message.role != "assistant" or self.chat is None:
            return ""
        alternatives = self.store.alternatives(self.chat.id, message.position)
        if len(alternatives) < 2:
            return ""
        return f"version {[a.id for a in alternatives].index(message.id) + 1} of {len(alternatives)}"

    def settings(self) -> dict[str, object]:
        return self.store.settings(self.chat.id) if self.chat else dict(self.pending_settings)

    def sampling(self) -> dict[str, object]:
        """The chat's own sampling settings (and JSON mode), then the command line's; the model's defaults fill in the rest."""
        values = {**self.given_sampling, **self.settings()}
        return {k: values[k] for k in (*SETTINGS, "json_mode") if values.get(k) is not None}

    # --- sending and streaming ---------------------------------------------------------
    @on(PromptInput.Submitted)
    async def send(self, event: PromptInput.Submitted) -> None:
        command, _, argument = event.text.strip().partition(" ")
        if command == "/image":  # a command, not a message
            self.query_one(PromptInput).clear()
            self.attach(argument.strip())
            return
        if self.reply is not None:
            self.notify("A reply is being written; Esc stops it.", severity="warning")
            return
        if self.model is None:
            self.notify("The model is not loaded yet (see the status line); try again in a moment, or pick another in Settings.", severity="warning")
            return
        text = event.text.strip()
        new = self.chat is None
        if new:
            title = text.splitlines()[0][:TITLE_LENGTH]
            ref, url = self.target()
            self.chat = self.store.new_chat(title, ref or (None if url else self.model.name), url)
            if self.pending_settings:
                self.store.save_settings(self.chat.id, self.pending_settings)
        position, self.editing = self.editing, None
        images, self.attached = tuple(self.attached), []
        message = self.store.add(self.chat.id, "user", text, position=position, images=images)
        self.query_one(PromptInput).clear()
        self.show_mode()
        if new:
            await self._list_new_chat()  # an older chat's item is brought up to date when the reply ends
        if position is None:  # only the new message is mounted, not the whole chat again
            await self._add_view(MessageView("user", message.content, message, images=images))
        else:  # an edit: the messages after it are gone
            self.show_conversation()
        await self.start_reply()

    async def _add_view(self, view: MessageView) -> None:
        conversation = self.query_one("#conversation", VerticalScroll)
        await conversation.mount(view)
        conversation.scroll_end(animate=False)

    def conversation(self, before: int | None = None) -> list[Message]:
        """The messages the model sees: the system prompt, then the chat up to `before`, each
        with its images' bytes."""
        system = self.settings().get("system")
        messages: list[Message] = [{"role": "system", "content": str(system)}] if system else []
        images = self.store.images(self.chat.id)
        for m in self.store.messages(self.chat.id):
            if before is not None and m.position >= before:
                break
            if m.content or m.role != "assistant":
                messages.append({"role": m.role, "content": m.content, **({"images": [a.data for a in images[m.id]]} if m.id in images else {})})
        return messages

    async def start_reply(self, position: int | None = None) -> None:
        """Write a reply to the conversation (at `position`: in place of the reply there)."""
        messages = self.conversation(before=position)
        view = MessageView("assistant", note="writing…", streaming=True)
        await self._add_view(view)
        await view.wait_for_refresh()  # drawn before the request, not on the cores of its decode
        try:
            reply = self.model.reply(messages, self.sampling())
        except UserError as e:  # the conversation cannot fit, even trimmed
            await view.remove()
            self.notify(str(e), title="Not sent", severity="error", timeout=10)
            return
        self._tell_dropped(reply)
        self._dropped_told = reply.dropped
        self.reply = reply
        self.query_one(PromptInput).cursor_blink = False  # a blink is a frame, drawn on a core the decode wants
        self._text = []
        self._view = view
        self.show_status(reply.figures, streaming=True)
        self.stream_reply(reply, position)

    @work(thread=True, exclusive=True, group="reply")
    def stream_reply(self, reply: Reply, position: int | None) -> None:
        thinking: list[str] = []
        pending: list[str] = []
        last = 0.0
        error = None
        try:
            for thought, text in reply:
                thinking.append(thought)
                pending.append(text)
                now = time.monotonic()
                if now - last >= 1 / UPDATES_PER_S:
                    self.call_from_thread(self.append, "".join(thinking), "".join(pending))
                    thinking, pending, last = [], [], now
        except UserError as e:
            error = str(e)
        except Exception as e:  # never a traceback over the screen
            error = f"{type(e).__name__}: {e}"
        self.call_from_thread(self.append, "".join(thinking), "".join(pending))
        self.call_from_thread(self.finish_reply, reply, position, error)

    async def append(self, thinking: str, text: str) -> None:
        with self.batch_update():  # one frame for the text, the scroll and the status line
            if thinking and self._view is not None:
                await self._view.add_thinking(thinking)
            if text and self._view is not None:
                self._text.append(text)
                await self._view.stream(text)
            if thinking or text:
                self.query_one("#conversation", VerticalScroll).scroll_end(animate=False)
            if self.reply is not None:
                self.show_status(self.reply.figures, streaming=True)

    def _tell_dropped(self, reply: Reply, told: int = 0) -> None:
        """Say when the conversation was trimmed: before a local reply, after a remote one (an
        endpoint's refusal is what tells a remote reply to trim); `told`: said already."""
        if reply.dropped > told:
            self.notify(f"The conversation outgrew the context: the {reply.dropped} oldest messages were left out (the system prompt stays).", severity="warning")

    async def finish_reply(self, reply: Reply, position: int | None, error: str | None) -> None:
        self._tell_dropped(reply, told=self._dropped_told)
        if self._view is not None and self._view.streaming:
            await self._view.end_stream()
        self.reply = None
        self.query_one(PromptInput).cursor_blink = True
        f = reply.figures
        error = error or f.error
        text = "".join(self._text)
        if error:
            self.notify(error, title="The reply failed", severity="error", timeout=10)
            f.finish_reason = "error"
        reasoning = self._view.reasoning if self._view is not None else ""
        if not text and not reasoning and error:
            self._view.remove()
        else:
            name, engine = self.model_label()
            saved = self.store.add(self.chat.id, "assistant", text, position=position, model=name, engine=engine, reasoning=reasoning or None, **f.stored())
            self._view.set_message(saved)
            self._view.set_note(self._alternatives_note(saved))
        self._last_figures = f
        self.show_status()
        self.refresh_chats()

    # --- actions -----------------------------------------------------------------------
    def action_stop(self) -> None:
        if self.reply is not None:
            self.reply.cancel()
        elif self.editing is not None:
            self.editing, self.attached = None, []
            self.query_one(PromptInput).clear()
            self.show_mode()

    def action_new_chat(self) -> None:
        if self.chat is not None:
            self.model_ref, self.url = self.chat.model, self.chat.url  # a new chat goes on with the same model
        self.open_chat(None)
        self.refresh_chats()
        self.query_one(PromptInput).focus()

    def _idle(self) -> bool:
        if self.reply is not None:
            self.notify("Wait for the reply, or stop it with Esc.", severity="warning")
            return False
        return True

    def _focused_or_last(self, role: str) -> ChatMessage | None:
        focused = self.focused
        if isinstance(focused, MessageView) and focused.role == role and focused.message is not None:
            return focused.message
        messages = self.store.messages(self.chat.id) if self.chat else []
        return next((m for m in reversed(messages) if m.role == role), None)

    async def action_regenerate(self) -> None:
        if not self._idle():
            return
        messages = self.store.messages(self.chat.id) if self.chat else []
        last = messages[-1] if messages else None
        if last is None or self.model is None:
            self.notify("Nothing to regenerate yet." if last is None else "The model is not loaded yet.", severity="warning")
            return
        if last.role == "assistant":
            for view in self.query(MessageView):
                if view.message is not None and view.message.id == last.id:
                    view.remove()
            await self.start_reply(position=last.position)
        else:  # the last reply failed or was never written: answer the last message
            await self.start_reply()

    def action_other_reply(self) -> None:
        if not self._idle():
            return
        last = self._focused_or_last("assistant")
        if last is None:
            return
        alternatives = self.store.alternatives(self.chat.id, last.position)
        if len(alternatives) < 2:
            self.notify("This reply has no other versions (Regenerate makes one).")
            return
        ids = [a.id for a in alternatives]
        self.store.activate(ids[ids.index(last.id) - 1])
        self.show_conversation()

    def action_edit(self) -> None:
        if not self._idle():
            return
        message = self._focused_or_last("user")
        if message is None:
            return
        self.editing = message.position
        self.attached = list(self.store.images(self.chat.id).get(message.id, ()))  # resent with it, unless dropped
        prompt = self.query_one(PromptInput)
        prompt.text = message.content
        prompt.focus()
        self.show_mode()

    def action_attach_image(self) -> None:
        self.push_screen(AskScreen("Attach an image (its path)", ""), lambda path: self.attach(path) if path else None)

    def attach(self, path: str) -> None:
        """Attach the image at `path` to the next message ("none": drop those attached; "": ask
        for a path). Checked now, so a bad file is said before anything is sent."""
        if not path:
            self.action_attach_image()
            return
        if path == "none":
            self.attached = []
            self.show_mode()
            return
        if self.model is not None and self.model.reads_images is False:
            self.notify(f"{self.model.name} reads no images: chat with a vision model (its mmproj-*.gguf projector beside it, or --mmproj FILE).", title="Not attached", severity="error")
            return
        try:
            attachment = Attachment.from_file(typed_path(path))
            if self.model is not None:
                self.model.check_image(attachment.data, attachment.name)
        except UserError as e:
            self.notify(str(e), title="Not attached", severity="error")
            return
        self.attached.append(attachment)
        self.show_mode()

    def action_search(self) -> None:
        self.query_one("#search", Input).focus()

    def action_settings(self) -> None:
        from localinfer.store.inventory import local_names

        defaults = (self.model.defaults if self.model is not None else SamplingParams()).with_overrides(**self.given_sampling)
        model = self.target()[0]
        models = [] if self.target()[1] else local_names()
        self.push_screen(SettingsScreen(self.settings(), defaults, models, model), self._settings_saved)

    def action_json_mode(self) -> None:
        values = self.settings()
        values["json_mode"] = None if values.get("json_mode") else True
        if self.chat is None:
            self.pending_settings = values
        else:
            self.store.save_settings(self.chat.id, values)
        self.notify("JSON mode on: replies are JSON objects." if values["json_mode"] else "JSON mode off.")

    def _settings_saved(self, values: dict | None) -> None:
        if values is None:
            return
        model = values.pop("model")
        if self.chat is None:
            self.pending_settings = values
            self.model_ref = model
        else:
            self.store.save_settings(self.chat.id, values)
            if model != self.chat.model:
                self.store.set_model(self.chat.id, model, self.chat.url)
                self.chat = self.store.chat(self.chat.id)
                self.refresh_chats()
        self.ensure_model()
        self.notify("Settings saved.")

    def action_rename(self) -> None:
        if self.chat is None:
            self.notify("This chat is not saved yet: send a message first.")
            return

        def renamed(title: str | None) -> None:
            if title:
                self.store.rename(self.chat.id, title)
                self.chat = self.store.chat(self.chat.id)
                self.refresh_chats()

        self.push_screen(AskScreen("New title", self.chat.title), renamed)

    def action_delete(self) -> None:
        if self.chat is None:
            return
        chat = self.chat

        def answered(yes: bool | None) -> None:
            if yes:
                self.store.delete(chat.id)
                self.open_chat(None)
                self.refresh_chats()
                self.notify(f"Deleted '{chat.title}'.")

        self.push_screen(ConfirmScreen(f"Delete the chat '{chat.title}' and all its messages?"), answered)

    def action_copy(self) -> None:
        reply = self._focused_or_last("assistant")
        if reply is None:
            self.notify("No reply to copy yet.")
            return
        self.copy_to_clipboard(reply.content)
        self.notify("Copied the reply to the clipboard.")

    def action_thinking(self) -> None:
        focused = self.focused
        views = [focused] if isinstance(focused, MessageView) else list(reversed(self.query(MessageView)))
        if not any(view.toggle_thinking() for view in views if view.role == "assistant"):
            self.notify("No reply here has any thinking to show.")

    def action_export(self) -> None:
        if self.chat is None:
            self.notify("This chat is not saved yet: send a message first.")
            return
        chat_id = self.chat.id

        def chosen(name: str | None) -> None:
            if not name:
                return
            path = Path(name).expanduser()
            try:
                kind = export_chat(self.store, chat_id, path)
            except UserError as e:
                self.notify(str(e), title="Not exported", severity="error")
                return
            self.notify(f"Exported the chat as {kind} to {path}.")

        self.push_screen(AskScreen("Export to (a .md file, or .json)", f"chat-{chat_id}.md"), chosen)

    async def action_quit(self) -> None:
        if self.reply is not None:
            self.reply.cancel()
        await super().action_quit()

    def on_unmount(self) -> None:
        if self.model is not None:
            self.model.close()
        self.model_threads.close()


def settle_heap() -> None:
    """Collect, then freeze what is left (the modules, the model, the app as it stands): a full
    garbage collection walks every object the process holds and took 60 ms and more with the
    GIL held, in the middle of a reply, stopping the UI and the engine's own Python alike.
    Frozen objects are not walked again; what later replies leave behind still is. Unfrozen
    first, so that a model replaced since the last load is collected, not kept frozen."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _chat_detail(chat: Chat, n: int) -> str:
    """The line under a chat's title in the list: its model and its number of messages."""
    return f"{chat.model or 'default model'} · {n} message{'s' * (n != 1)}"


def _stored_figures(m: ChatMessage) -> ReplyFigures:
    return ReplyFigures(**{k: getattr(m, k) for k in ReplyFigures().stored() if getattr(m, k) is not None})
