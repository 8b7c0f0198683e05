"""The chat app's dialogs, each a ModalScreen that returns its answer through dismiss()."""

from __future__ import annotations

from textual import on
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Grid, Horizontal, Vertical, VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Select, Switch, TextArea

from localinfer.engine.types import SAMPLING, BadSamplingValue, SamplingParams, sampling_value

# The sampling settings a chat keeps, in the order the settings screen shows them.
SETTINGS = ("temperature", "top_p", "top_k", "min_p", "repeat_penalty", "max_tokens", "seed")


class ConfirmScreen(ModalScreen[bool]):
    BINDINGS = [Binding("escape", "dismiss(False)", "Cancel")]

    def __init__(self, question: str, yes: str = "Delete") -> None:
        super().__init__(classes="dialog")
        self.question, self.yes = question, yes

    def compose(self) -> ComposeResult:
        with Vertical(classes="box"):
            yield Label(self.question)
            with Horizontal(classes="buttons"):
                yield Button(self.yes, variant="error", id="yes")
                yield Button("Cancel", id="no")

    @on(Button.Pressed)
    def answer(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")


class AskScreen(ModalScreen[str | None]):
    """One line of text: a chat's new title, a file to export to."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel")]

    def __init__(self, question: str, value: str = "") -> None:
        super().__init__(classes="dialog")
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical(classes="box"):
            yield Label(self.question)
            yield Input(self.value, id="answer")

    @on(Input.Submitted)
    def answer(self, event: Input.Submitted) -> None:
        self.dismiss(event.value.strip() or None)


class SettingsScreen(ModalScreen[dict | None]):
    """A chat's system prompt, sampling settings and model. Empty fields take the defaults,
    shown as placeholders: the command line's options, else the model's (its catalog
    entry's). Values are checked against the engine's table, as the options and the API are."""

    BINDINGS = [Binding("escape", "dismiss(None)", "Cancel"), Binding("ctrl+s", "save", "Save")]

    def __init__(self, values: dict[str, object], defaults: SamplingParams, models: list[str], model: str | None) -> None:
        super().__init__(classes="dialog")
        self.values, self.defaults, self.models, self.model = values, defaults, models, model

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="box settings"):
            yield Label("Chat settings (empty fields: the defaults, shown dimmed)", classes="heading")
            yield Label("Model")
            options = [(name, name) for name in dict.fromkeys([*(self.models), *([self.model] if self.model else [])])]
            yield Select(options, value=self.model if self.model else Select.NULL, prompt="the default model", id="model", compact=True)
            yield Label("System prompt")
            yield TextArea(str(self.values.get("system") or ""), id="system", compact=True, soft_wrap=True)
            with Grid(classes="fields"):
                for name in SETTINGS:
                    default = getattr(self.defaults, name)
                    yield Label(name.replace("_", " "))
                    value = self.values.get(name)
                    yield Input("" if value is None else str(value), placeholder=f"{default if default is not None else 'none'}", id=name, compact=True)
            with Horizontal(classes="switch"):
                yield Switch(bool(self.values.get("json_mode")), id="json_mode")
                yield Label("JSON mode: every reply is a JSON object (structured output)")
            yield Label("", id="problem", classes="problem")
            with Horizontal(classes="buttons"):
                yield Button("Save", variant="primary", id="save")
                yield Button("Cancel", id="cancel")

    @on(Button.Pressed, "#cancel")
    def cancel(self) -> None:
        self.dismiss(None)

    @on(Button.Pressed, "#save")
    def action_save(self) -> None:
        values: dict[str, object] = {"system": self.query_one("#system", TextArea).text.strip() or None}
        for name in SETTINGS:
            text = self.query_one(f"#{name}", Input).value.strip()
            if not text:
                continue
            try:
                values[name] = sampling_value(name, text)
            except BadSamplingValue as e:
                self.query_one("#problem", Label).update(f"{name.replace('_', ' ')} {e}")
                self.query_one(f"#{name}", Input).focus()
                return
        values["json_mode"] = self.query_one("#json_mode", Switch).value or None
        model = self.query_one("#model", Select).value
        values["model"] = None if model is Select.NULL else model
        self.dismiss(values)


assert set(SETTINGS) <= set(SAMPLING)
