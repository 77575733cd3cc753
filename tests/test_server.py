"""The gRPC service's own helpers (the service itself is tested through real nodes)."""

from __future__ import annotations

import asyncio
import gc

from raftkv.core.errors import Undetermined
from raftkv.node.service import _chain


def test_a_write_answered_after_its_request_was_cancelled_is_dropped_quietly():
    """A client that gives up cancels its request; the write's answer arriving later used to raise
    InvalidStateError in the event loop (found by the chaos harness under a full disk)."""

    async def scenario() -> list:
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _, context: errors.append(context))
        answered = loop.create_future()
        converted = _chain(answered, lambda value: value * 2)
        converted.cancel()
        answered.set_result(21)
        await asyncio.sleep(0.01)
        ok = loop.create_future()
        doubled = _chain(ok, lambda value: value * 2)
        ok.set_result(21)
        assert await doubled == 42
        return errors

    assert asyncio.run(scenario()) == []


def test_a_write_failed_after_its_request_was_cancelled_logs_no_error_never_retrieved():
    """Seen in the node logs of long chaos runs: "Future exception was never retrieved" with a
    traceback, for every write that timed out after its client had given up."""

    async def scenario() -> list:
        loop = asyncio.get_running_loop()
        errors = []
        loop.set_exception_handler(lambda _, context: errors.append(context["message"]))
        answered = loop.create_future()
        converted = _chain(answered, lambda value: value)
        converted.cancel()
        answered.set_exception(Undetermined("no commit within 3.0s"))
        await asyncio.sleep(0.01)
        del answered, converted
        gc.collect()
        return errors

    assert asyncio.run(scenario()) == []
