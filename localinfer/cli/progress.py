"""A progress bar on stderr that appears only once there is progress to show, so an error
found before any work begins prints its one line and nothing else."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TimeRemainingColumn

err = Console(stderr=True)


@contextmanager
def work_bar(label: str, enabled: bool = True) -> Iterator[Callable[[int, int, str], None]]:
    """Yields update(done, total, note): N of M items, with a short note (tensor, perplexity)."""
    bar = Progress(label, BarColumn(), MofNCompleteColumn(), "[dim]{task.fields[note]}[/dim]", TimeRemainingColumn(), console=err, transient=True)
    task: list[int] = []

    def update(done: int, total: int, note: str) -> None:
        if not enabled:
            return
        if not task:
            bar.start()
            task.append(bar.add_task(label, total=total, note=""))
        bar.update(task[0], completed=done, total=total, note=note)

    try:
        yield update
    finally:
        if task:
            bar.stop()
