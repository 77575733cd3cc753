"""The node process's own duties, apart from serving (which real-process tests cover)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from raftkv.node import process as node_module
from raftkv.core.errors import CorruptData
from raftkv.node.process import Node
from raftkv.core.spec import build_spec


class Replica:
    applied_index = 1
    group = SimpleNamespace(term=1, commit_index=1)

    def __init__(self, fails: bool):
        self.fails = fails
        self.compaction_checks = 0

    def maybe_compact(self, now: float, moving_in: bool) -> None:
        self.compaction_checks += 1
        if self.fails:
            raise RuntimeError("DB instance already closed")


def test_one_partitions_failing_housekeeping_does_not_stop_the_others(tmp_path, monkeypatch):
    """Found by the chaos harness: a replica wedged by a full disk raised in maybe_compact, which
    ended the housekeeping task, and with it compaction and the gauges of every partition."""
    monkeypatch.setattr(asyncio, "sleep", _no_wait_after(3))
    node = Node(build_spec(nodes=1, partitions=2, replication=1, base_port=20000, data_dir=tmp_path), "n1")
    broken, healthy = Replica(fails=True), Replica(fails=False)
    node.replicas.frontends = {0: SimpleNamespace(replica=broken), 1: SimpleNamespace(replica=healthy)}
    node.hub = SimpleNamespace(is_up=lambda node_id: True)  # started: its Raft hub runs
    try:
        asyncio.run(node._housekeeping())
    except _Stop:
        pass
    assert broken.compaction_checks == healthy.compaction_checks == 3


class _Stop(Exception):
    pass


def _no_wait_after(rounds: int):
    """asyncio.sleep that returns at once, and ends the caller after `rounds` calls."""
    calls = []

    async def sleep(_seconds):
        calls.append(1)
        if len(calls) >= rounds:
            raise _Stop

    return sleep


def test_a_node_stopped_by_corrupt_data_reports_that_even_if_closing_fails_too(monkeypatch):
    """Found by the chaos harness: closing a database with a damaged block raised as well, and that
    error replaced the reason to stop: exit code 1 and a traceback instead of one clear line."""

    class DamagedNode:
        def __init__(self, spec, node_id, initial):
            self.me = SimpleNamespace(api_address="127.0.0.1:1", host="127.0.0.1", metrics_port=2)
            self.tls = None
            self.peers = None
            self.topology = SimpleNamespace(nodes=())  # no other node to tell why it stops
            self.removed = asyncio.Event()

        async def start(self) -> None:
            self.failure = asyncio.get_running_loop().create_future()
            self.failure.set_exception(CorruptData("database p0001/db is corrupt (block checksum mismatch)"))

        async def stop(self) -> None:
            raise RuntimeError("Corruption: block checksum mismatch (while closing)")

    monkeypatch.setattr(node_module, "Node", DamagedNode)
    with pytest.raises(CorruptData, match="is corrupt"):
        asyncio.run(node_module.serve(spec=None, node_id="n1"))
