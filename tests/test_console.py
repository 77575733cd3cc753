"""The console's pure parts: the ring and its quantiles, the event log, parameters, page access and
the pages' shaping; and its HTTP rules on a real socket, in process."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import math
import socket
import threading
import urllib.error
import urllib.request

import pytest
from hypothesis import given, strategies as st

from raftkv.api import kv_pb2 as pb
from raftkv.console import views
from raftkv.console.access import VERBS, readable
from raftkv.console.events import Event, EventLog, merge, topology_events
from raftkv.console.http import ConsoleApp
from raftkv.core.http_server import serve
from raftkv.console.params import BadParameter, parse
from raftkv.console.ring import Reading, Ring, quantile, sample
from raftkv.dev.local_cluster import free_port_block
from raftkv.meta.records import ClusterMeta, Move, MoveStep, NodeRecord, NodeState
from raftkv.security.permissions import Access, Grant, Identity, check

INF = math.inf


# -- ring ---------------------------------------------------------------------

def test_quantile_interpolates_within_the_bucket_as_prometheus_does():
    buckets = [(0.001, 0), (0.002, 50), (0.005, 100), (INF, 100)]
    assert quantile(0.5, buckets) == pytest.approx(0.002)
    assert quantile(0.25, buckets) == pytest.approx(0.0015)
    assert quantile(0.99, buckets) == pytest.approx(0.002 + 0.003 * 49 / 50)
    assert quantile(0.5, [(0.001, 0), (INF, 0)]) is None
    assert quantile(0.99, [(0.001, 0), (0.01, 1), (INF, 10)]) == 0.01  # in +Inf: the highest finite bound


@given(st.lists(st.integers(0, 50), min_size=2, max_size=8), st.floats(0.01, 1.0))
def test_quantile_stays_within_the_bucket_bounds(counts, q):
    bounds = [0.001 * 2 ** i for i in range(len(counts) - 1)] + [INF]
    cumulative = [sum(counts[:i + 1]) for i in range(len(counts))]
    value = quantile(q, list(zip(bounds, cumulative)))
    if cumulative[-1] == 0:
        assert value is None
    else:
        assert 0 <= value <= bounds[-2]


def test_a_sample_is_the_rates_between_two_readings_and_the_window_s_latencies():
    before = Reading(100.0, 10, 20, ((0.001, 5), (0.01, 10), (INF, 10)), 7, 1000, 0)
    now = Reading(102.0, 30, 60, ((0.001, 5), (0.01, 20), (INF, 20)), 11, 5000, 42)
    at, reads, writes, p50, p99, lag, fsyncs, raft = sample(before, now)
    assert (at, reads, writes, lag, fsyncs, raft) == (102.0, 10, 20, 42, 2, 2000)
    assert 1 < p50 < p99 <= 10  # milliseconds: every new observation was between 1 and 10 ms


def test_the_ring_keeps_the_newest_rows_and_answers_a_window():
    ring = Ring(capacity=5)
    for t in range(10):
        ring.add((float(t), t))
    assert ring.since(-1) == [(float(t), t) for t in range(5, 10)]
    assert ring.since(7.0) == [(8.0, 8), (9.0, 9)]
    assert ring.last() == (9.0, 9)


# -- events ----------------------------------------------------------------

def _node(i: str, state: NodeState = NodeState.UP) -> NodeRecord:
    return NodeRecord(i, "127.0.0.1", 1000, 1001, 1002, 1003, state)


def _meta(epoch: int, states=("up", "up", "up"), moves=(), placement=(("n1", "n2", "n3"),)) -> ClusterMeta:
    nodes = tuple(_node(f"n{i + 1}", NodeState(s)) for i, s in enumerate(states))
    return ClusterMeta(epoch=epoch, replication=3, nodes=nodes, placement=placement, moves=tuple(moves))


def test_topology_changes_become_events():
    move = Move(0, "n1", "n4")
    before = _meta(1)
    during = _meta(2, states=("up", "up", "dead"), moves=[move])
    texts = {(e.kind, e.subject, e.text) for e in topology_events(before, during, 5.0)}
    assert texts == {("node", "node n3", "up → dead"), ("move", "partition 0", "move n1 → n4 begun")}
    done = _meta(3, states=("up", "up", "dead"), placement=(("n4", "n2", "n3"),))
    assert [e.text for e in topology_events(during, done, 6.0)] == ["move n1 → n4 completed"]
    assert [e.text for e in topology_events(during, _meta(3, states=("up", "up", "dead")), 6.0)] == \
        ["move n1 → n4 rolled back"]


def test_merge_keeps_one_record_of_a_change_every_node_saw_and_every_leader_change():
    seen = [[Event(10.0, "node", "node n3", "up → dead", "n1")],
            [Event(11.5, "node", "node n3", "up → dead", "n2")],
            [Event(12.0, "leader", "partition 1", "n2 leads (term 2)", "n2"),
             Event(30.0, "node", "node n3", "up → dead", "n2")]]
    merged = merge(seen)
    assert [(e.at, e.kind) for e in merged] == [(30.0, "node"), (12.0, "leader"), (10.0, "node")]


def test_the_event_log_is_bounded_and_newest_first():
    log = EventLog("n1", capacity=3)
    for t in range(5):
        log.record(float(t), "leader", "partition 0", f"{t}")
    assert [e.text for e in log.newest()] == ["4", "3", "2"]
    assert log.newest()[0].node == "n1"


# -- parameters and access --------------------------------------------------

@pytest.mark.parametrize("page, query, message", [
    ("partition", {}, "which partition? add ?p=N"),
    ("partition", {"p": ["9"]}, "p=9 is out of range: expected a partition number, 0 to 3"),
    ("partition", {"p": ["x"]}, "p='x' is not a number: expected a partition number, 0 to 3"),
    ("partition", {"p": ["1", "2"]}, "parameter 'p' given 2 times; give it once"),
    ("overview", {"p": ["1"]}, "unknown parameter 'p' for the overview page (it takes: none)"),
    ("series", {"window": ["5"]}, "window=5 is out of range: expected seconds, 10 to 3600"),
    ("events", {"kind": ["x"]}, "kind 'x' is none of leader, node, move, learner, storage"),
    ("series", {"since": ["nan"]}, "since='nan' is not a time: expected unix seconds"),
])
def test_a_bad_parameter_is_one_clear_line(page, query, message):
    with pytest.raises(BadParameter) as raised:
        parse(page, query, partitions=4)
    assert str(raised.value) == message


def test_parameters_get_their_defaults():
    assert parse("partition", {"p": ["3"]}, 4) == {"p": 3}
    assert parse("series", {}, 4) == {"window": 3600, "since": 0.0}
    assert parse("series", {"since": ["1795735239.07"]}, 4)["since"] == 1795735239.07
    assert parse("events", {"kind": ["move"]}, 4) == {"limit": 200, "kind": "move"}


def test_a_reader_sees_the_status_pages_and_an_admin_every_page():
    roles = {"ann": ["reader"], "bob": ["root"], "cid": []}
    grants = {"reader": [Grant(Access.READ)], "root": [Grant(Access.ADMIN)]}

    def pages(name: str) -> list[str]:
        return readable(lambda request: check(Identity(name), [request], roles, grants))

    assert pages("ann") == pages("cid") == ["overview", "placement", "partition", "series", "events"]
    assert sorted(pages("bob")) == sorted(VERBS)
    assert sorted(readable(lambda request: check(Identity("n1", "node"), [request], {}, {}))) == sorted(VERBS)


# -- pages ------------------------------------------------------------------

def _status(node: str, *hosted: tuple) -> pb.StatusResponse:
    return pb.StatusResponse(node_id=node, hosted=[
        pb.PartitionStatus(partition=p, role=role, term=2, commit_index=commit, applied_index=applied,
                           last_data_index=commit,
                           learners=[pb.LearnerStatus(name="feed", sink="kafka", progress=commit - 7)]
                           if role == "leader" else [])
        for p, role, commit, applied in hosted])


def _gathered(statuses, moves=(), progress=None) -> views.Gathered:
    meta = _meta(4, moves=moves, placement=(("n1", "n2", "n3"), ("n1", "n2", "n3")))
    reports = {n: pb.NodeReportResponse(node_id=n, started_at=50.0, write_rate=10, read_rate=5)
               for n, s in statuses.items() if s is not None}
    return views.Gathered(at=100.0, me="n1", partitions=2, topology=meta, meta_leader="n1", statuses=statuses,
                          reports=reports, progress=progress or {})


def test_a_node_that_does_not_answer_is_dead_and_what_only_it_knew_is_unknown():
    g = _gathered({"n1": _status("n1", (0, "leader", 100, 100), (1, "follower", 90, 90)),
                   "n2": _status("n2", (0, "follower", 100, 97), (1, "follower", 90, 90)), "n3": None})
    page = views.overview(g)
    dead = next(n for n in page["nodes"] if n["id"] == "n3")
    assert (dead["state"], dead["recorded_state"], dead["replicas"], dead["uptime_s"]) == ("dead", "up", None, None)
    assert page["leaderless"] == [1] and page["under_replicated"] == [0]
    assert (page["writes_per_s"], page["rates_complete"]) == (20, False)
    grid = views.placement(g)
    row = grid["rows"][0]
    assert row["cells"]["n3"] == {"role": "unknown"}
    assert row["cells"]["n2"]["lag"] == 3 and row["cells"]["n1"]["role"] == "leader"


def test_a_moving_replica_shows_its_progress_and_learners_their_lag():
    statuses = {n: _status(n, (0, "leader" if n == "n1" else "follower", 200, 200), (1, "follower", 5, 5))
                for n in ("n1", "n2", "n3")}
    progress = {0: pb.ReplicaState(mode="learner", applied_index=50, snapshot_bytes_received=4096)}
    g = _gathered(statuses, moves=[Move(0, "n3", "n4", MoveStep.CATCHING_UP)], progress=progress)
    moves = views.moves(g, [])
    assert moves["under_way"][0] | {"fraction": 0.25, "bytes": 4096, "applied": 50} == moves["under_way"][0]
    learners = views.learners(g)["learners"]
    assert learners[0]["name"] == "feed" and learners[0]["partitions"][0]["lag"] == 7
    assert learners[0]["unknown"] == [1]  # partition 1 has no leader that answered


# -- HTTP -------------------------------------------------------------------

@pytest.fixture(scope="module")
def console_port():
    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()

    async def answer(page, query, authorization):
        if page == "slow":
            await asyncio.sleep(10)
        return (200, {"page": page, "query": query}) if authorization != "Bearer bad" else (401, {"login": True})

    def metrics_app(environ, start_response):
        start_response("200 OK", [])
        return [b"m 1\n"]

    port = free_port_block(1)
    server = serve(ConsoleApp(loop, answer, metrics_app), "127.0.0.1", port)
    yield port
    server.shutdown()
    loop.call_soon_threadsafe(loop.stop)


def test_the_metrics_port_starts_without_asking_dns_for_its_address_s_name(monkeypatch):
    """wsgiref looks the listening address up (socket.getfqdn) for SERVER_NAME: where no DNS server
    answers, as on a host of its own (raftkv.dev.netns), that held a node's start for 10 s."""
    def no_dns(name=""):
        raise AssertionError(f"a DNS lookup of {name!r}")
    monkeypatch.setattr(socket, "getfqdn", no_dns)
    port = free_port_block(1)
    def app(environ, start_response):
        start_response("200 OK", [])
        return [b"up"]
    server = serve(app, "127.0.0.1", port)
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=5) as reply:
            assert reply.read() == b"up"
    finally:
        server.shutdown()
        server.server_close()


def _get(port: int, path: str, method: str = "GET", headers: dict | None = None) -> tuple[int, bytes, dict]:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=5) as reply:
            return reply.status, reply.read(), dict(reply.headers)
    except urllib.error.HTTPError as error:
        return error.code, error.read(), dict(error.headers)


def test_the_console_is_read_only_and_answers_unknown_paths_with_404(console_port):
    assert _get(console_port, "/metrics")[1] == b"m 1\n"
    status, body, headers = _get(console_port, "/placement")
    assert status == 200 and b"/static/console.js" in body
    assert _get(console_port, "/static/console.js")[0] == 200
    for path in ("/nope", "/static/../setup.cfg", "/static/other.js"):
        assert _get(console_port, path)[0] == 404
    for method in ("POST", "PUT", "DELETE"):
        status, body, headers = _get(console_port, "/api/overview", method)
        assert status == 405 and headers["Allow"] == "GET, HEAD" and b"read-only" in body
    status, body, _ = _get(console_port, "/api/partition?p=2")
    assert json.loads(body) == {"page": "partition", "query": {"p": ["2"]}}
    assert _get(console_port, "/api/overview", headers={"Authorization": "Bearer bad"})[0] == 401


def test_an_answer_that_takes_too_long_is_a_504_within_the_bound(console_port):
    status, body, _ = _get(console_port, "/api/slow")
    assert status == 504 and b"did not answer" in body


# -- the sampler ------------------------------------------------------------

def test_the_sampler_records_leader_changes_stalled_learners_and_full_disks(tmp_path):
    from raftkv.console.sampler import ReplicaView, Sampler

    now = [1000.0]
    log, ring = EventLog("n1"), Ring()
    sampler = Sampler("n1", tmp_path, log, ring, clock=lambda: now[0])
    meta = _meta(1)

    def tick(*replicas: ReplicaView, seconds: float = 1.0, topology: ClusterMeta = meta) -> None:
        now[0] += seconds
        sampler.tick(topology, replicas)

    leading = ReplicaView(0, True, 3, False, live_voters=3, last_data_index=500, learners=(("feed", 400),))
    tick(leading)
    tick(leading, seconds=20)
    tick(leading, seconds=20)  # 40 s without delivering, 100 entries behind
    tick(dataclasses.replace(leading, learners=(("feed", 450),)))
    tick(ReplicaView(0, True, 4, True), topology=_meta(2, states=("up", "dead", "up")))
    texts = [(e.kind, e.text) for e in reversed(log.newest())]
    assert texts == [("leader", "n1 leads (term 3)"),
                     ("learner", "partition 0: nothing delivered for 40s, 100 entries behind"),
                     ("learner", "partition 0: delivering again"),
                     ("leader", "n1 leads (term 4)"),
                     ("storage", "disk full on n1: writes refused"),
                     ("node", "up → dead")]
    assert len(ring.since(0)) == 4 and ring.last()[5] == 0  # the feed lag: no learner reported any more
