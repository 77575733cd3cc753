"""Learners end to end: real nodes, a real learner process, the example JSON-lines sink plugin."""

from __future__ import annotations

import itertools
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import jsonschema
import pytest

from learners import learner_status
from learners.change_event import SCHEMA_PATH, ChangeEvent
from raftkv import Client, Timeout, Unavailable, Undetermined, failpoints
from raftkv.core.commands import Put
from raftkv.core.partitioning import partition_for_key
from raftkv.dev.local_cluster import free_port_block
from raftkv.dev.metrics_scrape import samples
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine
from tests.conftest import random_write, wait_for_compaction, wait_until
from tests.test_cli import assert_one_line_error, run

EXAMPLE_PLUGIN = Path(__file__).parent.parent / "examples" / "jsonl_sink"


@pytest.fixture(scope="session", autouse=True)
def jsonl_plugin_installed():
    """The example plugin is installed like any third-party sink: pip, entry point, no core change."""
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--disable-pip-version-check",
                    "-e", str(EXAMPLE_PLUGIN)], check=True, capture_output=True)


class Learner:
    """A learner process of `cluster`; on a host of its own when the cluster's nodes have theirs
    (`make_cluster(hosts=True)`), at `host`."""

    def __init__(self, cluster, name: str, feed: Path):
        self.cluster, self.name, self.feed = cluster, name, feed
        self.proc: subprocess.Popen | None = None
        self.host = cluster.hosts.add() if cluster.hosts else "127.0.0.1"

    def add(self) -> None:
        subprocess.run([sys.executable, "-m", "raftkv", "learner", "add", "--name", self.name, "--sink", "jsonl",
                        "--sink-option", f"path={self.feed}", "--config", str(self.cluster.spec_path)],
                       check=True, capture_output=True, timeout=60)

    def start(self, *extra: str, env: dict[str, str] | None = None) -> None:
        log = open(self.feed.parent / f"learner-{self.name}.log", "ab")
        command = [sys.executable, "-m", "raftkv", "learner", "start", "--name", self.name, "--config",
                   str(self.cluster.spec_path), "--host", self.host, *extra]
        self.proc = subprocess.Popen(
            self.cluster.hosts.command_for(self.host, command) if self.cluster.hosts else command,
            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **(env or {})})

    def kill(self) -> None:
        self.proc.kill()
        self.proc.wait()

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(15)

    def events(self) -> list[ChangeEvent]:
        if not self.feed.exists():
            return []
        return [ChangeEvent.from_json(line) for line in self.feed.read_bytes().splitlines() if line]


@pytest.fixture
def learner_factory(tmp_path):
    learners = []

    def make(cluster, name="l1") -> Learner:
        learner = Learner(cluster, name, tmp_path / f"{name}.jsonl")
        learners.append(learner)
        learner.add()
        learner.start()
        return learner

    yield make
    for learner in learners:
        if learner.proc and learner.proc.poll() is None:
            learner.kill()


def replay(events: list[ChangeEvent]) -> dict[bytes, bytes]:
    """Deduplicate by event id, then apply in feed order."""
    state: dict[bytes, bytes] = {}
    seen = set()
    for event in events:
        if event.event_id in seen:
            continue
        seen.add(event.event_id)
        if event.op == "d":
            state.pop(event.key, None)
        else:
            state[event.key] = event.after
    return state


def assert_in_index_order(events: list[ChangeEvent]) -> None:
    last: dict[int, tuple[int, int]] = {}
    for event in events:
        assert event.event_id[1:] > last.get(event.partition, (0, -1)), f"out of order: {event}"
        last[event.partition] = event.event_id[1:]


def test_feed_survives_learner_kills_and_crashes_at_its_fail_points_and_replays_to_the_final_state(
        make_cluster, learner_factory):
    cluster = make_cluster(nodes=3, partitions=4)
    learner = learner_factory(cluster)
    stop = threading.Event()
    rng = random.Random(7)

    def writer(seed: int) -> None:
        local = random.Random(seed)
        with Client(cluster.endpoints) as kv:
            while not stop.is_set():
                random_write(kv, local, keys=300, deletes=0.2)

    def bulk_writer() -> None:
        """put_manys large enough to be logged as table files (1 MiB: 150 values of 7 KB), over the same keys
        every 3 s: the feed must carry every file's rows, updates of the last round's, between the other
        writers' entries."""
        keys = [k for k in (b"bulk-%04d" % i for i in range(1000)) if partition_for_key(k, 4) == 0][:150]
        with Client(cluster.endpoints) as kv:
            for round_ in itertools.count():
                try:
                    kv.put_many(keys, [b"%06d" % round_ + b"b" * 7200] * len(keys))
                except (Unavailable, Undetermined):
                    pass
                if stop.wait(3):
                    return

    writers = [threading.Thread(target=writer, args=(rng.random(),)) for _ in range(4)]
    writers.append(threading.Thread(target=bulk_writer))
    for t in writers:
        t.start()
    for point in (None, *failpoints.LEARNER_POINTS):
        delivered = len(learner.events())
        wait_until(lambda: len(learner.events()) > delivered + 200, 30, "the learner to deliver events")
        learner.kill()
        if point is not None:  # it runs until it crashes exactly there
            learner.start(env={failpoints.ENVIRONMENT_VARIABLE: f"{point}=3*off->crash"})
            wait_until(lambda: learner.proc.poll() is not None, 60, f"the learner to crash at {point}")
            assert learner.proc.returncode == -signal.SIGKILL
        learner.start()
    delivered = len(learner.events())
    wait_until(lambda: len(learner.events()) > delivered + 200, 60, "more events after the restarts")
    stop.set()
    for t in writers:
        t.join(30)

    with Client(cluster.endpoints) as kv:
        final = dict(kv.scan())
        assert final, "the workload wrote nothing"
        kv.put(b"zz-last", b"end")  # written last: once the feed has it, the feed has everything
    final[b"zz-last"] = b"end"
    wait_until(lambda: any(e.key == b"zz-last" for e in learner.events()), 30, "the feed to reach the last write")
    events = learner.events()
    schema = json.loads(SCHEMA_PATH.read_text())
    for line in learner.feed.read_bytes().splitlines()[:2000]:
        jsonschema.validate(json.loads(line), schema)
    assert_in_index_order(events)
    assert len({e.event_id for e in events}) == len(events), "the sink wrote an event twice"
    assert replay(events) == final
    assert ingested_files(cluster) > 0, "no put_many was logged as a file"


def ingested_files(cluster) -> float:
    """raftkv_ingest_files_total over every node and partition."""
    return sum(s.value for node in cluster.spec.nodes for s in samples(f"{node.host}:{node.metrics_port}")
               if s.name == "raftkv_ingest_files_total")


def test_learner_added_after_compaction_emits_snapshot_reads_then_live_changes(make_cluster, learner_factory):
    cluster = make_cluster(nodes=3, partitions=2, compaction_min_entries=200)
    old_keys = {b"old-%05d" % i for i in range(10_000)}

    def write(part: int) -> None:
        with Client(cluster.endpoints) as kv:
            for i in range(part, 10_000, 8):
                kv.put(b"old-%05d" % i, b"%d" % i)

    writers = [threading.Thread(target=write, args=(part,)) for part in range(8)]
    for t in writers:
        t.start()
    for t in writers:
        t.join(300)
    with Client(cluster.endpoints) as kv:
        learner = learner_factory(cluster)
        # keys the leader compacted into its snapshot come as r; the retained log tail as c
        wait_until(lambda: {e.key for e in learner.events()} >= old_keys, 60, "every existing key in the feed")
        kv.put(b"old-00000", b"changed")
        kv.put(b"new", b"1")
        final = dict(kv.scan())
    wait_until(lambda: any(e.key == b"new" for e in learner.events()), 30, "live changes after the catch-up")
    events = learner.events()
    catch_up = [e for e in events if e.key in old_keys and e.after != b"changed"]
    assert sorted(e.key for e in catch_up) == sorted(old_keys), "each existing key exactly once"
    snapshot_events = [e for e in catch_up if e.snapshot]
    assert snapshot_events and {e.op for e in snapshot_events} == {"r"}
    assert {e.op for e in catch_up if not e.snapshot} <= {"c"}
    live = events[events.index(next(e for e in events if e.after == b"changed")):]
    assert [(e.op, e.key, e.before, e.after) for e in live] == [
        ("u", b"old-00000", b"0", b"changed"), ("c", b"new", None, b"1")]
    assert replay(events) == final


def registered_progress(cluster, name: str) -> dict[int, int]:
    with Client(cluster.endpoints, timeout=5) as kv:
        view = kv.learners().get(name)
    return dict(view.progress) if view else {}


def test_voters_retain_the_log_for_a_stopped_learner_within_the_bound(make_cluster, learner_factory):
    cluster = make_cluster(nodes=3, partitions=2, compaction_min_entries=20, learner_retention_entries=5000)
    learner = learner_factory(cluster)
    with Client(cluster.endpoints) as kv:
        kv.put(b"first", b"1")
        wait_until(lambda: all(i > 0 for i in registered_progress(cluster, "l1").values()), 30,
                   "the learner to report progress")
        learner.kill()
        for i in range(200):  # far past compaction_min_entries: only retention keeps these
            kv.put(b"k%03d" % i, b"%d" % i)
        final = dict(kv.scan())
    learner.start()
    wait_until(lambda: replay(learner.events()) == final, 60, "the restarted learner to catch up")
    assert not [e for e in learner.events() if e.snapshot], "no re-sync was needed"


def test_a_learner_stopped_past_the_bound_resyncs_through_a_snapshot(make_cluster, learner_factory):
    cluster = make_cluster(nodes=3, partitions=2, compaction_min_entries=20, learner_retention_entries=60)
    learner = learner_factory(cluster)
    with Client(cluster.endpoints) as kv:
        for i in range(50):
            kv.put(b"k%03d" % i, b"before")
        wait_until(lambda: all(i > 0 for i in registered_progress(cluster, "l1").values()), 30,
                   "the learner to report progress")
        delivered = max(registered_progress(cluster, "l1").values())
        learner.kill()
        for i in range(400):
            kv.put(b"k%03d" % (i % 120), b"after-%d" % i)
        kv.delete(b"k000")
        final = dict(kv.scan())
    wait_for_compaction(cluster, range(2), past_index=delivered)  # past the bound, so past the learner
    learner.start()
    wait_until(lambda: replay(learner.events()) == final, 60, "the restarted learner to re-sync")
    resync = [e for e in learner.events() if e.snapshot]
    assert resync and {e.op for e in resync} <= {"r", "d"}


def test_learner_progress_survives_a_leader_change(make_cluster, learner_factory):
    cluster = make_cluster(nodes=3, partitions=1)
    learner_factory(cluster)
    with Client(cluster.endpoints) as kv:
        for i in range(20):
            kv.put(b"k%d" % i, b"v")
        reached = wait_until(lambda: registered_progress(cluster, "l1").get(0, 0) >= 21, 30,
                             "progress to be reported")
        leader = next(s.node_id for s in kv.status() for ps in s.partitions if ps.role == "leader")
    cluster.kill(leader)
    survivors = [n.api_address for n in cluster.spec.nodes if n.id != leader]

    def progress_on_new_leader():
        with Client(survivors, timeout=5) as kv:
            view = kv.learners().get("l1")
        return view and view.progress.get(0, 0) >= 21

    wait_until(progress_on_new_leader, 30, "the new leader to know the learner's progress")
    assert reached


def test_a_leader_change_during_streaming_loses_and_duplicates_nothing(make_cluster, learner_factory):
    cluster = make_cluster(nodes=3, partitions=2)
    learner = learner_factory(cluster)
    stop = threading.Event()
    acked: dict[bytes, bytes] = {}

    def writer() -> None:
        with Client(cluster.endpoints) as kv:
            i = 0
            while not stop.is_set():
                key, value = b"w%05d" % i, b"%d" % i
                try:
                    kv.put(key, value)
                    acked[key] = value
                except (Unavailable, Undetermined):
                    pass
                i += 1

    thread = threading.Thread(target=writer)
    thread.start()
    wait_until(lambda: len(learner.events()) > 200, 30, "streaming to start")
    with Client(cluster.endpoints) as kv:
        leader = next(s.node_id for s in kv.status() for ps in s.partitions if ps.role == "leader")
    cluster.kill(leader)
    wait_until(lambda: len(acked) > 600, 60, "writes to continue after the leader change")
    stop.set()
    thread.join(30)
    survivors = [n.api_address for n in cluster.spec.nodes if n.id != leader]
    with Client(survivors) as kv:
        final = dict(kv.scan())
    wait_until(lambda: replay(learner.events()) == final, 60, "the feed to reach the final state")
    events = learner.events()
    assert len({e.event_id for e in events}) == len(events), "an event was delivered twice"
    assert all(final.get(k) == v for k, v in acked.items())
    assert_in_index_order(events)


def test_a_learner_serves_follower_reads_from_its_copy_even_with_every_voter_down_and_says_so_once(
        make_cluster, learner_factory):
    """Issue 25, item 11e: the learner said nothing while no node answered; now one warning, and one line
    when the cluster is back, not a line per retry. The nodes and the learner each on a host of their own,
    this test's clients on another."""
    cluster = make_cluster(nodes=3, partitions=2, hosts=True)
    learner = learner_factory(cluster)
    learner.kill()
    api = f"{learner.host}:{free_port_block(1)}"
    learner.start("--api-port", api.rsplit(":", 1)[1])
    with Client(cluster.endpoints) as kv:
        for i in range(30):
            kv.put(b"k%02d" % i, b"v%d" % i)
    wait_until(lambda: len(learner.events()) >= 30, 30, "the learner to have every write")
    for node_id in cluster.spec.node_ids:
        cluster.kill(node_id)
    with Client([api], timeout=3) as kv:
        read = wait_until(lambda: kv.read(b"k07", consistency="follower"), 30, "the learner's API")
        assert read.value == b"v7" and read.applied_index > 0
        assert list(kv.scan(prefix=b"k", consistency="stale")) == [(b"k%02d" % i, b"v%d" % i) for i in range(30)]
        with pytest.raises((Unavailable, Timeout)):
            kv.get(b"k07")  # linearizable needs a leader
    log = learner.feed.parent / f"learner-{learner.name}.log"
    down, back = "WARNING learners.learner_process: no node of the cluster answers; retrying", \
        "INFO learners.learner_process: the cluster answers again"
    wait_until(lambda: down in log.read_text(), 30, "the learner to say that no node answers")
    down_since = time.monotonic()
    wait_until(lambda: time.monotonic() - down_since > 3, 5, "the learner to retry a few times (once a second)")
    cluster.start_all()
    cluster.wait_ready()
    wait_until(lambda: back in log.read_text(), 30, "the learner to say that the cluster answers again")
    lines = log.read_text().splitlines()
    said = [line for line in lines if down in line or back in line]
    assert len(said) == 2 and down in said[0] and back in said[1], said
    assert len([line for line in lines if "could not report progress" in line]) <= 1, lines[-20:]


def test_a_learner_whose_journal_fsync_fails_stops_with_one_line(make_cluster, learner_factory):
    """As a node does (fsyncgate): a partition whose copy cannot be trusted must not stop ticking silently
    while the learner runs on, its feed behind for good."""
    cluster = make_cluster(nodes=3, partitions=2)
    learner = learner_factory(cluster)
    learner.kill()
    learner.start(env={failpoints.ENVIRONMENT_VARIABLE: "journal-fsync-before=3*off->error"})
    with Client(cluster.endpoints) as kv:
        for i in range(10_000):  # its journal syncs once a second while there are entries to sync
            kv.put(b"k%d" % (i % 100), b"v")
            if learner.proc.poll() is not None:
                break
    wait_until(lambda: learner.proc.poll() is not None, 30, "the learner to stop on its failed fsync")
    output = (learner.feed.parent / f"learner-{learner.name}.log").read_text()
    errors = [line for line in output.splitlines() if line.startswith("error: ")]
    assert learner.proc.returncode == 2 and len(errors) == 1 and "fsync of" in errors[0], output[-3000:]
    assert "Traceback" not in output


def test_an_idle_cluster_with_a_learner_is_still_and_the_learner_shows_no_lag(make_cluster, learner_factory):
    """Issue 16: a learner reported every index it delivered, its report was an entry it then delivered
    and reported, and so on: with no client writing, every partition's log grew by about one entry per
    learner per second, forever, and `learner list` showed lag 1."""
    cluster = make_cluster(nodes=3, partitions=2)
    learner = learner_factory(cluster)
    with Client(cluster.endpoints) as kv:
        for i in range(50):
            kv.put(b"k%d" % i, b"v")
        wait_until(lambda: len(learner.events()) >= 50, 30, "the learner to deliver the writes")

        def commit_indices() -> dict:
            return {(s.node_id, ps.partition): ps.commit_index for s in kv.status() for ps in s.partitions}

        def still_for_three_seconds() -> bool:
            before = commit_indices()
            time.sleep(3)
            return commit_indices() == before

        wait_until(still_for_three_seconds, 20, "the commit indices to stop moving with no client writing")
    listed = run("learner", "list", "--config", str(cluster.spec_path), "--json")
    assert listed.returncode == 0, listed.stderr
    partitions = json.loads(listed.stdout)[learner.name]["partitions"]
    assert {p: v["lag"] for p, v in partitions.items()} == {"0": 0, "1": 0}, partitions


def test_a_learner_is_not_started_without_the_partitions_that_have_no_leader(make_cluster):
    """Found by the chaos kill run: `learner start` read the registration from the partitions that had a
    leader at that moment, so a learner started while one had none never fed it (2,190 keys of one
    partition were missing from the feed). It waits for every partition, or says which have no leader."""
    cluster = make_cluster(nodes=2, partitions=2, replication=1, request_timeout=2.0)
    with Client(cluster.endpoints, timeout=10) as kv:
        kv.register_learner("l1", "memory")
        assert sorted(kv.learners()["l1"].progress) == [0, 1]
    holder = next(n for n in cluster.spec.node_ids if _hosts(cluster, n) == [1])
    cluster.kill(holder)
    with Client(cluster.endpoints, timeout=3) as kv, pytest.raises(Unavailable, match=r"partition\(s\) 1 have no leader"):
        kv.learners()
    started = run("learner", "start", "--name", "l1", "--config", str(cluster.spec_path))
    assert_one_line_error(started, "partition(s) 1 have no leader")


def _hosts(cluster, node_id: str) -> list[int]:
    with Client(cluster.endpoints, timeout=10) as kv:
        return kv.topology().meta.voter_partitions(node_id)


def test_a_partition_whose_log_contradicts_the_learners_copy_resyncs_while_the_others_flow(
        make_cluster, learner_factory):
    """Issue 30: it stopped the whole learner. Here partition 0's copy says it holds entry X of another
    term than the log's, and a key the cluster does not have (as after a whole-cluster power cut that
    lost entries the learner had delivered): the learner re-syncs partition 0 from the cluster, feeds
    partition 1, counts it in its metrics, and the feed ends equal to the store, the lost key deleted."""
    cluster = make_cluster(nodes=3, partitions=2)
    learner = learner_factory(cluster)
    keys = {p: [k for k in (b"k%d" % i for i in range(200)) if partition_for_key(k, 2) == p][:20] for p in (0, 1)}
    with Client(cluster.endpoints) as kv:
        for key in keys[0] + keys[1]:
            kv.put(key, b"1")
        wait_until(lambda: len(replay(learner.events())) == 40, 30, "the learner to deliver the writes")
        learner.stop()
        ghost = next(k for k in (b"ghost%d" % i for i in range(100)) if partition_for_key(k, 2) == 0)
        copy = RocksEngine(cluster.spec_path.parent / "learners" / learner.name / "p0000")
        at = copy.position
        copy.write([Put(ghost, b"lost")], Position(at.index, at.term + 7))
        copy.close()
        metrics_port = free_port_block(1)
        learner.start("--metrics-port", str(metrics_port))

        def resynced() -> bool:
            return "re-synced from the cluster after its log contradicted" in (
                learner.feed.parent / f"learner-{learner.name}.log").read_text()

        kv.put(keys[1][0], b"2")  # partition 1 flows, whatever partition 0 does
        wait_until(lambda: replay(learner.events())[keys[1][0]] == b"2", 30, "partition 1 to flow")
        # Its re-sync waits for the cluster's log to pass the copy's position: this write, or the
        # learner's own first progress report, whichever comes first.
        kv.put(keys[0][0], b"2")
        wait_until(resynced, 30, "partition 0 to re-sync")
        wait_until(lambda: replay(learner.events()).get(keys[0][0]) == b"2", 30, "partition 0 to flow again")
        store = dict(kv.scan())
    assert replay(learner.events()) == store and ghost not in store
    assert ("d", ghost) in {(e.op, e.key) for e in learner.events() if e.snapshot}

    def metric(name: str, state: str | None = None) -> float:  # published once a second
        return {(s.name, s.labels.get("state")): s.value for s in samples(f"127.0.0.1:{metrics_port}")}[name, state]

    wait_until(lambda: metric("raftkv_learner_resyncs_total") == 1, 10, "the metrics to count the re-sync")
    assert metric("raftkv_learner_partitions_not_flowing", "resyncing") == 0 and learner.proc.poll() is None
    learner.stop()  # what `learner list` shows of a partition while it re-syncs (the pump tests hold one there)
    learner_status.write(cluster.spec_path.parent / "learners" / learner.name, {}, {0: "the Raft log contradicts"})
    listed = run("learner", "list", "--config", str(cluster.spec_path), "--json")
    assert json.loads(listed.stdout)[learner.name]["partitions"]["0"]["resyncing"] == "the Raft log contradicts"
