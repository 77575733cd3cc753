"""A process's main coroutine on uvloop, ended even when one of its tasks will not end.

`asyncio.run` cancels the tasks left when the main coroutine returns, then waits for every one of
them for as long as it takes. In a chaos run (docs/chaos.md, "Bugs it found") a node that met a
damaged node log as it started, and had to stop, waited there for minutes: its one-line error was
never printed and it never exited. Here a task gets STRAGGLER_SECONDS to end once cancelled; one
that has not is logged with where it waits, and the process ends anyway.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Coroutine, TypeVar

import uvloop

log = logging.getLogger(__name__)

T = TypeVar("T")

STRAGGLER_SECONDS = 5.0
STRAGGLER = "did not end when cancelled"  # what the log says of each (the chaos harness looks for it)


def run(main: Coroutine[object, object, T]) -> T:
    """`uvloop.run(main)`, with the tasks left after it bounded (above)."""
    loop = uvloop.new_event_loop()
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            _cancel_the_rest(loop)
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        finally:
            asyncio.set_event_loop(None)
            loop.close()


def _cancel_the_rest(loop: asyncio.AbstractEventLoop) -> None:
    tasks = asyncio.all_tasks(loop)
    if not tasks:
        return
    for task in tasks:
        task.cancel()
    done, pending = loop.run_until_complete(asyncio.wait(tasks, timeout=STRAGGLER_SECONDS))
    for task in pending:
        log.warning("task %s %s within %.1fs; the process ends without it. It waits at: %s",
                    task.get_name(), STRAGGLER, STRAGGLER_SECONDS, awaiting(task))
    for task in done:  # as asyncio.run reports them
        if not task.cancelled() and task.exception() is not None:
            loop.call_exception_handler({"message": "unhandled exception during shutdown",
                                         "exception": task.exception(), "task": task})


def awaiting(task: asyncio.Task) -> str:
    """Where `task` is suspended: each coroutine down its chain of awaits (a future at the end is not named:
    what awaits it is the clue)."""
    steps = []
    awaited: object = task.get_coro()
    while awaited is not None:
        if isinstance(awaited, asyncio.Task):
            awaited = awaited.get_coro()
        frame = getattr(awaited, "cr_frame", None) or getattr(awaited, "gi_frame", None)
        if frame is None:
            break
        steps.append(f"{frame.f_code.co_name} ({frame.f_code.co_filename}:{frame.f_lineno})")
        awaited = getattr(awaited, "cr_await", None) or getattr(awaited, "gi_yieldfrom", None)
    return " -> ".join(steps)
