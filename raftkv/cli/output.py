"""All CLI output goes through these two consoles.

Markup is off: what they print quotes keys, names and paths users chose, and `[/]` in one would
be a markup error. A styled part is a rich Text.

Progress bars (`progress_bars`) go to stderr, and only when it is a terminal or when asked: scripts and
tests read clean output.

rich is imported when a console is first used (PEP 562): `raftkv learner start`, which prints one line,
starts sooner without it.
"""

from __future__ import annotations

import sys
from contextlib import contextmanager
from typing import TYPE_CHECKING, Iterator

if TYPE_CHECKING:
    from rich.console import Console
    from rich.progress import Progress, TaskID


def __getattr__(name: str) -> Console:
    """`console` (stdout) and `err_console` (stderr), made on first use."""
    if name not in ("console", "err_console"):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from rich.console import Console

    # soft_wrap: a line is never broken at the console's width, which for a pipe is 80 columns: a command
    # printed for the user to copy must stay one command (tables still fit themselves to the width)
    globals().update(console=Console(highlight=False, markup=False, soft_wrap=True),
                     err_console=Console(stderr=True, highlight=False, markup=False, soft_wrap=True))
    return globals()[name]


def _console(name: str) -> Console:
    """A console by name, from inside this module (where `__getattr__` is not consulted)."""
    return globals().get(name) or __getattr__(name)


def print_bytes(data: bytes) -> None:
    """Stored bytes to stdout as they are, when it is a pipe or a file (rich would wrap long lines and
    expand tabs); to a terminal as text, undecodable bytes escaped, with a line break."""
    out = _console("console")
    if out.is_terminal:
        out.print(data.decode("utf-8", errors="backslashreplace"))
    else:
        sys.stdout.flush()  # what went through the text layer first
        sys.stdout.buffer.write(data)
        sys.stdout.buffer.flush()


class Bar:
    """One transfer's bar: bytes and rate. Safe to advance from several threads (rich locks)."""

    def __init__(self, progress: Progress | None, task: TaskID | None):
        self._progress, self._task = progress, task

    def total(self, count: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, total=count)

    def advance(self, count: int) -> None:
        if self._progress is not None:
            self._progress.advance(self._task, count)

    def at(self, count: int) -> None:
        if self._progress is not None:
            self._progress.update(self._task, completed=count)

    def describe(self, text: str) -> None:
        if self._progress is not None:
            self._progress.update(self._task, description=text)


class Bars:
    def __init__(self, progress: Progress | None):
        self._progress = progress

    def add(self, description: str, total: int | None = None) -> Bar:
        task = self._progress.add_task(description, total=total) if self._progress is not None else None
        return Bar(self._progress, task)


@contextmanager
def progress_bars(enabled: bool | None, counts: bool = False) -> Iterator[Bars]:
    """Bars on stderr when `enabled`, or, for None, when stderr is a terminal; else bars that show nothing.
    They count bytes and their rate, or with `counts`, things done of a total (replicas moved)."""
    err_console = _console("err_console")
    if not (err_console.is_terminal if enabled is None else enabled):
        yield Bars(None)
        return
    from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, TextColumn,
                               TimeElapsedColumn, TimeRemainingColumn, TransferSpeedColumn)

    columns = (TextColumn("{task.description}"), BarColumn(),
               *((MofNCompleteColumn(), TimeElapsedColumn()) if counts else
                 (DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn())))
    with Progress(*columns, console=err_console) as progress:
        try:
            yield Bars(progress)
        except BaseException:
            progress.live.transient = True  # a failure ends in its one error line, with no bar left above it
            raise
