"""Nodes that stopped on corrupt data or a failed disk, as the others know it.

Such a node exits (code 2, not restarted by its unit), so nothing it exports can be scraped and an
alert could only say "down". Before it exits it tells the other nodes why (`Admin.ReportStop`, best
effort, a second at most); each keeps that in memory, exports it (`raftkv_node_stopped_on_bad_storage`)
and shows it on the console, until its Raft connection to that node is up again. Not in the cluster
metadata: a node of an older release would not know the command (docs/operations.md, upgrades).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Callable, Iterable

from raftkv.api import kv_pb2 as pb
from raftkv.core import metrics
from raftkv.node.peers import Peers, answer

log = logging.getLogger(__name__)

TELL_SECONDS = 1.0


class PeerStops:
    def __init__(self, record_event: Callable[[str, str, str], None]):
        self._record = record_event  # (kind, subject, text): the console's event log
        self.stopped: dict[str, str] = {}  # node -> why it stopped

    def heard(self, node_id: str, reason: str) -> None:
        if node_id not in self.stopped:
            log.warning("node %s stopped: %s", node_id, reason)
            self._record("storage", f"node {node_id}", f"stopped: {reason}")
        self.stopped[node_id] = reason
        metrics.PEER_STOPPED.labels(node_id).set(1)

    def forget_back(self, is_up: Callable[[str], bool]) -> None:
        """Once a second: a node that runs again (its Raft connection is up) is no longer stopped."""
        for node_id in [n for n in self.stopped if is_up(n)]:
            del self.stopped[node_id]
            metrics.PEER_STOPPED.labels(node_id).set(0)
            self._record("storage", f"node {node_id}", "runs again")


async def tell_others(peers: Peers, me: str, others: Iterable[str], error: BaseException) -> None:
    """Tell every other node why this one stops; at most TELL_SECONDS, whoever did not answer by then."""
    report = pb.StopReport(node=me, reason=str(error))

    async def tell(node_id: str) -> None:
        try:
            await answer(peers.admin(node_id).ReportStop(report, timeout=TELL_SECONDS))
        except Exception as exc:  # best effort: a node down, or of a release without the call
            log.info("could not tell %s why this node stops: %s", node_id, exc)

    calls = [asyncio.ensure_future(tell(n)) for n in others]
    if calls:
        await asyncio.wait(calls, timeout=TELL_SECONDS)
        for call in calls:
            call.cancel()
