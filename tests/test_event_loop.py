"""The processes' event loop ends even when a task will not (raftkv.core.event_loop)."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from raftkv.core import event_loop


async def _deaf_to_cancel(started: asyncio.Event) -> None:
    started.set()
    while True:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            pass


@pytest.mark.timeout(60)
def test_a_task_that_ignores_its_cancellation_is_logged_and_the_process_ends_anyway(monkeypatch, caplog):
    monkeypatch.setattr(event_loop, "STRAGGLER_SECONDS", 0.3)

    async def main() -> str:
        started = asyncio.Event()
        asyncio.get_running_loop().create_task(_deaf_to_cancel(started), name="deaf")
        await started.wait()
        raise LookupError("the reason the process stops")

    began = time.monotonic()
    with caplog.at_level(logging.WARNING, logger=event_loop.__name__), \
            pytest.raises(LookupError, match="the reason the process stops"):
        event_loop.run(main())  # asyncio.run waits for the deaf task for ever
    assert time.monotonic() - began < 10
    (line,) = [r.getMessage() for r in caplog.records]
    assert f"task deaf {event_loop.STRAGGLER}" in line
    where = line.split("It waits at: ")[1].split(" -> ")
    assert where[0].startswith("_deaf_to_cancel (") and "test_event_loop.py" in where[0]
    assert where[-1].startswith("sleep (")  # asyncio.sleep, where the deaf loop waits


def test_tasks_that_end_when_cancelled_end_quietly_and_the_result_is_returned(caplog):
    ended = []

    async def worker() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            ended.append("worker")

    async def main() -> int:
        asyncio.get_running_loop().create_task(worker())
        await asyncio.sleep(0)
        return 7

    with caplog.at_level(logging.WARNING):
        assert event_loop.run(main()) == 7
    assert ended == ["worker"] and not caplog.records
