"""The gRPC service's own helpers (the service itself is tested through real nodes)."""

from __future__ import annotations

import asyncio

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
