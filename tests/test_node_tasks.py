"""A node's background tasks: a failure is logged at once, naming the task, never left for the collector."""

from __future__ import annotations

import asyncio
import logging

from raftkv.node.tasks import background


def test_a_failed_task_is_logged_with_what_it_was_for_and_a_cancelled_one_is_not(caplog):
    async def fails():
        raise ValueError("the base is wrong")

    async def scenario():
        failed = background(fails(), "partition 3: the copy of a checkpoint")
        cancelled = background(asyncio.sleep(10), "housekeeping")
        await asyncio.wait([failed])
        cancelled.cancel()
        await asyncio.gather(cancelled, return_exceptions=True)
        await asyncio.sleep(0)  # done callbacks run on the next turn

    with caplog.at_level(logging.ERROR, logger="raftkv.node.tasks"):
        asyncio.run(scenario())
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("ERROR", "partition 3: the copy of a checkpoint failed: the base is wrong")]
    assert caplog.records[0].exc_info[0] is ValueError
