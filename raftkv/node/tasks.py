"""Background tasks of a node whose failure is never lost: asyncio only says "Task exception was never
retrieved" when the task is collected, if ever, and without saying what the task was for."""

from __future__ import annotations

import asyncio
import logging
from typing import Coroutine

log = logging.getLogger(__name__)


def background(coroutine: Coroutine, what: str) -> asyncio.Task:
    """Run `coroutine` as a task; if it ever fails, its error is logged at once, naming `what`."""
    task = asyncio.ensure_future(coroutine)
    task.add_done_callback(lambda done: _report(done, what))
    return task


def _report(task: asyncio.Task, what: str) -> None:
    if not task.cancelled() and (error := task.exception()) is not None:
        log.error("%s failed: %s", what, error, exc_info=error)
