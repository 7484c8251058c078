"""Progress bars for the benchmarks, on stderr: the JSON or Markdown a benchmark prints on stdout stays
clean for pipes and files. When stderr is not a terminal, rich draws no live bar."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)


def _bar(console: Console | None = None) -> Progress:
    return Progress(
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
        TextColumn("{task.fields[step]}"),
        console=console or Console(stderr=True),
    )


class Steps:
    """One bar: `done(what)` after each step, `doing(what)` to say which step runs now."""

    def __init__(self, progress: Progress, task: TaskID) -> None:
        self._progress = progress
        self._task = task

    def doing(self, what: str) -> None:
        self._progress.update(self._task, step=what)

    def done(self, what: str | None = None) -> None:
        if what is None:
            self._progress.update(self._task, advance=1)
        else:
            self._progress.update(self._task, advance=1, step=what)

    def reached(self, completed: int, what: str | None = None) -> None:
        """Set the count outright, for work measured by polling rather than stepped through."""
        if what is None:
            self._progress.update(self._task, completed=completed)
        else:
            self._progress.update(self._task, completed=completed, step=what)

    @property
    def completed(self) -> int:
        return int(self._progress.tasks[self._task].completed)


@contextmanager
def steps(description: str, total: int, console: Console | None = None) -> Iterator[Steps]:
    """A progress bar of `total` steps on stderr (or `console`)."""
    with _bar(console) as progress:
        yield Steps(progress, progress.add_task(description, total=total, step=""))
