"""The console of one node, on its loop: the sampler's ring and event log, this node's report to the
others (Admin.NodeReport), and each API call's answer: who asks, may they, what the page shows."""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from pathlib import Path
from typing import Callable, Protocol

from raftkv.api import kv_pb2 as pb
from raftkv.console import views
from raftkv.console.access import VERBS, readable
from raftkv.console.events import Event, EventLog, merge
from raftkv.console.gather import PeerStubs, gather
from raftkv.console.params import BadParameter, parse
from raftkv.console.ring import FIELDS, Ring
from raftkv.console.sampler import DATA_BYTES_EVERY, ReplicaView, Sampler, tree_bytes
from raftkv.core.errors import Unauthenticated
from raftkv.meta.records import ClusterMeta
from raftkv.security.permissions import Identity, Request

log = logging.getLogger(__name__)


class ConsoleHost(Protocol):
    """What the console needs of its node (raftkv/node/console_host.py)."""

    me_id: str
    partitions: int
    data_dir: Path
    peers: PeerStubs

    def topology(self) -> ClusterMeta: ...

    def meta_leader_id(self) -> str | None: ...

    def replica_views(self) -> list[ReplicaView]: ...

    def caller(self, authorization: str) -> Identity: ...  # Unauthenticated for a token of no one

    def refusal(self, caller: Identity, request: Request) -> str | None: ...


class Console:
    def __init__(self, host: ConsoleHost, scheme: str, token_needed: bool):
        self._host = host
        self.scheme = scheme
        self._token_needed = token_needed
        self.events = EventLog(host.me_id)
        self.ring = Ring()
        self.sampler = Sampler(host.me_id, host.data_dir, self.events, self.ring)

    async def run(self) -> None:
        """Sample once a second until cancelled."""
        for turn in itertools.count():
            try:
                if turn % DATA_BYTES_EVERY == 0:
                    self.sampler.measured_data(await asyncio.to_thread(tree_bytes, self._host.data_dir))
                self.sampler.tick(self._host.topology(), self._host.replica_views())
            except Exception:
                log.exception("console: sampling failed; trying again in a second")
            await asyncio.sleep(1.0)

    def record(self, kind: str, subject: str, text: str) -> None:
        self.events.record(time.time(), kind, subject, text)

    def report(self) -> pb.NodeReportResponse:
        s = self.sampler
        writes, reads = s.rates()
        return pb.NodeReportResponse(
            node_id=self._host.me_id, started_at=s.started_at, rss_bytes=s.rss, cpu_percent=s.cpu_percent,
            data_bytes=s.data_bytes, disk_free_bytes=s.disk_free, write_rate=writes, read_rate=reads,
            events=[pb.ConsoleEvent(at=e.at, kind=e.kind, subject=e.subject, text=e.text, node=e.node)
                    for e in self.events.newest()])

    async def answer(self, page: str, query: dict[str, list[str]], authorization: str) -> tuple[int, dict]:
        """(HTTP status, JSON body) of `/api/<page>`; `whoami` says who the caller is and what they may read."""
        try:
            caller = self._host.caller(authorization)
        except Unauthenticated as error:
            return 401, {"error": str(error) if authorization else "this console needs a user's token",
                         "login": True}
        if page == "whoami":
            return 200, {"user": caller.name if caller.kind == "user" else None, "node": self._host.me_id,
                         "token_needed": self._token_needed,
                         "pages": readable(lambda r: self._host.refusal(caller, r))}
        if page not in VERBS:
            return 404, {"error": f"no such page: {page}"}
        if (why := self._host.refusal(caller, VERBS[page])) is not None:
            return 403, {"error": why}
        try:
            params = parse(page, query, self._host.partitions)
        except BadParameter as error:
            return 400, {"error": str(error)}
        return 200, await self.page(page, params)

    async def page(self, page: str, params: dict) -> dict:
        if page == "series":
            return {"node": self._host.me_id,
                    **views.series(self.ring.since(max(time.time() - params["window"], params["since"])), FIELDS)}
        host = self._host
        g = await gather(host.me_id, host.partitions, host.topology(), host.meta_leader_id(), host.peers,
                         self.scheme, moves=page in ("moves", "placement", "partition"))
        if page == "overview":
            return views.overview(g)
        if page == "placement":
            return views.placement(g)
        if page == "learners":
            return {**views.learners(g), "node": host.me_id}
        events = self._merged(g)
        if page == "partition":
            return views.partition(g, params["p"], events)
        if page == "moves":
            return views.moves(g, events)
        return views.events_page(events, params["limit"], params["kind"])

    def _merged(self, g: views.Gathered) -> list[Event]:
        logs = [[Event(e.at, e.kind, e.subject, e.text, e.node) for e in r.events]
                for n, r in g.reports.items() if r is not None and n != self._host.me_id]
        return merge(logs + [self.events.newest()])
