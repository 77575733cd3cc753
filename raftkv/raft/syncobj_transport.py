"""pysyncobj's TCP transport with the changes raftkv needs.

- Every append-entries message sent is counted (entry and snapshot bytes).
- In fsync mode a dirty journal is synced before any message leaves, so an
  entry is durable before a follower acknowledges it or a leader counts itself,
  at one fsync per group commit.
- The peers the cluster metadata named when the replica opened stay connected
  while a snapshot is loaded. pysyncobj takes the members from the snapshot,
  which may predate a member that joined since, and only the member with the
  higher address opens a connection: a replica whose snapshot predates its
  leader would never reach it, and would catch up only after its elections had
  disrupted the group into electing a leader it knows. Membership entries in
  the log still add and drop peers as pysyncobj applies them.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from pysyncobj.transport import TCPTransport


class GroupTransport(TCPTransport):
    def __init__(self, syncObj, selfNode, otherNodes):
        self._named = frozenset(otherNodes)
        self._loading_snapshot = False
        super().__init__(syncObj, selfNode, otherNodes)

    @contextlib.contextmanager
    def loading_snapshot(self) -> Iterator[None]:
        """While a snapshot is loaded, its members do not disconnect the peers named at open."""
        self._loading_snapshot = True
        try:
            yield
        finally:
            self._loading_snapshot = False

    def addNode(self, node):
        if node in self._nodes:  # kept through a snapshot load: its connection stands
            return
        super().addNode(node)

    def dropNode(self, node):
        if self._loading_snapshot and node in self._named:
            return
        super().dropNode(node)

    def send(self, node, message):
        self._syncObj.sync_journal()
        if not super().send(node, message):
            return False
        if isinstance(message, dict) and message.get("type") == "append_entries":
            self._syncObj.on_sent(message)
        return True
