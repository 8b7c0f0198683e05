"""Option parsers and checks shared by the commands that load a model."""

from __future__ import annotations

import typer


def gpu_layers(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        n = int(value)
    except ValueError:
        raise typer.BadParameter(f"'{value}' is not a number of layers or 'auto'") from None
    if n < 0:
        raise typer.BadParameter("must be 0 or more (or 'auto')")
    return n


def at_least(minimum: float):
    def check(value: float | None) -> float | None:
        if value is not None and value < minimum:
            raise typer.BadParameter(f"must be at least {minimum:g}, not {value:g}")
        return value

    return check


def between(low: float, high: float):
    def check(value: float | None) -> float | None:
        if value is not None and not low <= value <= high:
            raise typer.BadParameter(f"must be between {low:g} and {high:g}, not {value:g}")
        return value

    return check


def engine_name(value: str) -> str:
    from localinfer.backends import BACKENDS

    if value not in BACKENDS:
        raise typer.BadParameter(f"'{value}' is not one of: {', '.join(BACKENDS)}")
    return value


def kernel_set(value: str | None) -> str | None:
    from localinfer_native import KERNEL_SETS

    if value is not None and value not in KERNEL_SETS:
        raise typer.BadParameter(f"'{value}' is not one of: {', '.join(KERNEL_SETS)}")
    return value
