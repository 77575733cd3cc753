"""Point-in-time restore and an interrupted restore (issue 15), with real processes: nodes with TLS, a changelog
learner, a Kafka learner on tansu, `raftkv backup restore` (into a new cluster with its own CA, too), file:// and
S3 (moto's server, the `s3` fixture)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import tempfile
from datetime import datetime, timedelta, timezone
from pathlib import Path

from learners.backup_restore import STAGING
from learners.cluster_backup import backup_cluster
from raftkv import Client, failpoints
from raftkv.backup.store import BackupStore, list_backups
from raftkv.core.commands import Delete, Put
from raftkv.core.partitioning import partition_for_key
from raftkv.core.spec import build_spec, ports_per_node
from raftkv.core.spec_toml import load_spec, save_spec
from raftkv.dev.local_cluster import LocalCluster, free_port_block
from raftkv.dev.local_feed import LocalFeed
from tests.conftest import BUCKET, wait_until
from tests.test_backup import contents, open_sink
from tests.test_backup_incremental import by_partition, deliver, fs_of, initial_data
from tests.test_cli import RAFTKV, assert_one_line_error, run

PARTITIONS = 2


def new_cluster_spec(folder: Path) -> Path:
    """The spec of a fresh one-node cluster with empty data dirs, for a restore to write into."""
    spec = build_spec(nodes=1, partitions=PARTITIONS, replication=1, base_port=40000, data_dir=folder)
    return save_spec(spec, folder / "cluster.toml")


def cluster_init(folder: Path) -> Path:
    """A new one-node cluster as the README makes one: `raftkv cluster init`, with a CA of its own."""
    spec_path = folder / "cluster.toml"
    done = run("cluster", "init", "--nodes", "1", "--partitions", str(PARTITIONS), "--replication", "1",
               "--base-port", str(free_port_block(ports_per_node(PARTITIONS))), "--data-dir", str(folder / "data"),
               "-o", str(spec_path))
    assert done.returncode == 0, done.stderr
    return spec_path


def restored(spec_path: Path) -> dict[int, dict[bytes, bytes]]:
    spec = load_spec(spec_path)
    return {p: contents(spec.nodes[0].data_dir / f"p{p:04d}")[1] for p in range(PARTITIONS)}


def scan_at_applied_index(kv: Client) -> tuple[dict[int, int], dict[int, dict[bytes, bytes]]]:
    """Each partition's contents from one linearizable view, and the applied index of that view."""
    indices, state = {}, {}
    for p in range(PARTITIONS):
        chunks = list(kv.scan_chunks(p, consistency="linearizable"))
        assert len({c.applied_index for c in chunks}) == 1
        indices[p] = chunks[0].applied_index
        state[p] = {item.key: item.value for c in chunks for item in c.items}
    return indices, state


def write(kv: Client, round_: int) -> None:
    """Creates, updates and deletes in each partition, a batch (one entry, several events), a delete_range."""
    for i in range(60):
        kv.put(b"k%03d" % i, b"r%d-%d" % (round_, i))
    for i in range(0, 60, 7):
        kv.delete(b"k%03d" % i)
    kv.delete_range(b"k05", b"k06")  # k050..k059: one `d` event per key it removes
    same_partition = [key for key in (b"b%03d" % i for i in range(100)) if partition_for_key(key, PARTITIONS) == 0]
    kv.batch([Put(same_partition[0], b"r%d" % round_), Put(same_partition[1], b"r%d" % round_),
              Delete(same_partition[2 + round_ % 2])])


def feeds_caught_up(kv: Client) -> bool:
    """Whether both learners have delivered every entry that was more than a progress report (they report
    none for entries that were only reports, so their progress stays behind those)."""
    learners = kv.learners()
    return all(learners[name].lag(p) == 0 for name in ("changes", "feed") for p in range(PARTITIONS))


def backup_to(kv: Client, urls: list[tuple[str, dict]]) -> None:
    created = datetime.now(timezone.utc)
    for url, options in urls:
        with tempfile.TemporaryDirectory() as work:
            backup_cluster(kv, "raftkv", BackupStore(url, options), Path(work), created)


def test_point_in_time_restore_between_two_backups_gives_the_contents_at_that_index(
        make_cluster, changelog_learner, s3, tmp_path):
    cluster = make_cluster(nodes=3, partitions=PARTITIONS, tls=True)
    changelog = changelog_learner(cluster)
    old = cluster.spec.tls
    feed_tls = ("--feed-cacert", str(old.ca), "--feed-cert", str(old.client_cert), "--feed-key", str(old.client_key))
    kafka = LocalFeed(load_spec(cluster.spec_path), name="feed", topic="pitr", sink_options={"timeout.ms": "5000"})
    kafka.start()
    urls = [((tmp_path / "backups").as_uri(), {}), (f"s3://{BUCKET}/pitr", {"endpoint_url": s3})]
    try:
        with Client(cluster.endpoints, timeout=30, tls=cluster.tls) as kv:
            write(kv, 1)
            backup_to(kv, urls)
            write(kv, 2)
            target, expected = scan_at_applied_index(kv)
            wait_until(lambda: feeds_caught_up(kv), 60, "both feeds to deliver up to the target")
            at = datetime.now(timezone.utc)  # every change up to the target was captured before this
            # events carry whole milliseconds: the next round is captured at least one later
            wait_until(lambda: datetime.now(timezone.utc) - at > timedelta(milliseconds=2), 1, "2 ms to pass")
            write(kv, 3)
            backup_to(kv, urls)
            after_second, _ = scan_at_applied_index(kv)
            wait_until(lambda: feeds_caught_up(kv), 60, "both feeds to deliver the third round")
        first, second = list_backups(urls[0][0])
        assert all(first.positions[p].index < target[p] < second.positions[p].index for p in target)
        to_index = ",".join(f"{p}:{i}" for p, i in target.items())
        bootstrap = kafka.bootstrap

        def restore(name: str, *args: str, spec_path: Path | None = None) -> tuple[subprocess.CompletedProcess, Path]:
            spec_path = spec_path or new_cluster_spec(tmp_path / name)
            return run("backup", "restore", "--config", str(spec_path), *args, timeout=120), spec_path

        done, spec_path = restore("from-changelog", "--from", urls[0][0], "--to-index", to_index,
                                  "--feed", f"changelog://{changelog}", *feed_tls)
        assert done.returncode == 0, done.stderr
        assert restored(spec_path) == expected
        assert f"partition 0: backup {first.id} (index {first.positions[0].index}), then " in done.stdout

        done, spec_path = restore("from-kafka", "--from", urls[1][0], f"--storage-option=endpoint_url={s3}",
                                  "--to-index", to_index, "--feed", f"kafka://{bootstrap}/pitr",
                                  "--feed-option", "learner=feed")
        assert done.returncode == 0, done.stderr
        assert restored(spec_path) == expected

        # issue 25, item 7: into a new cluster with its own CA, the feed read with the old cluster's certificates
        by_time = ("--from", urls[0][0], "--to-time", at.isoformat(), "--feed", f"changelog://{changelog}")
        new_spec = cluster_init(tmp_path / "by-time")
        refused, _ = restore("by-time", *by_time, spec_path=new_spec)
        assert_one_line_error(refused, "does not trust the node's certificate", "--feed-cacert, --feed-cert, --feed-key")
        done, _ = restore("by-time", *by_time, *feed_tls, spec_path=new_spec)
        assert done.returncode == 0, done.stderr
        assert restored(new_spec) == expected
        new = LocalCluster(load_spec(new_spec), new_spec)
        try:
            new.start_all()
            new.wait_ready()
            assert new.tls.ca != old.ca
            with Client(new.endpoints, timeout=30, tls=new.tls) as kv:
                assert dict(kv.scan()) == {k: v for state in expected.values() for k, v in state.items()}
        finally:
            new.stop_all()

        beyond = ",".join(f"{p}:{i + 1000}" for p, i in after_second.items())
        refused, spec_path = restore("beyond", "--from", urls[0][0], "--to-index", beyond,
                                     "--feed", f"changelog://{changelog}", *feed_tls)
        assert_one_line_error(refused, "partition 0: from the backup at index", "the feed has delivered only up to",
                              "partition 1:", "nothing was restored")
        assert not any((tmp_path / "beyond" / "n1").glob("*"))  # nothing written, not even the staging folder
    finally:
        kafka.stop()


def test_a_restore_killed_mid_download_completes_when_run_again_and_fetches_only_what_it_lacked(tmp_path):
    url = (tmp_path / "backups").as_uri()
    sink = open_sink(tmp_path, url)
    state = dict(list(initial_data(random.Random(15)).items())[:40_000])
    deliver(sink, state, index=1)
    info = sink.export_now()
    sink.close()
    assert sum(len(c.files) for c in info.copies) >= 8, "too few files to interrupt a restore between them"
    spec_path = new_cluster_spec(tmp_path / "new")
    objects = load_spec(spec_path).nodes[0].data_dir / STAGING / "objects"
    command = [*RAFTKV, "backup", "restore", "--from", url, "--config", str(spec_path)]
    env = {**os.environ, failpoints.ENVIRONMENT_VARIABLE: "backup-download-after=3*off->delay(60000)"}
    with open(tmp_path / "restore.log", "ab") as log:
        proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    try:
        # three files pass the fail point and are staged; every later one waits at it, a minute, unstaged
        staged = wait_until(lambda: len(checked := [f for f in objects.glob("*") if f.suffix != ".part"]) == 3 and
                            checked, 60, "three files staged")
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    assert len(staged) == 3 and not any((tmp_path / "new" / "n1").glob("p0*"))  # no partition placed

    fs, root = fs_of(url, {})
    for path in staged:  # gone from the storage: the second run can only succeed if it takes them from staging
        fs.rm_file(f"{root}/files/{path.name[:2]}/{path.name}")
    again = run("backup", "restore", "--from", url, "--config", str(spec_path), timeout=120)
    assert again.returncode == 0, again.stderr
    assert restored(spec_path) == by_partition(state)
    assert not (objects.parent).exists()  # the staging folder goes once every target is placed


def test_a_target_at_a_backups_index_needs_no_feed_and_one_past_it_does(tmp_path):
    url = (tmp_path / "backups").as_uri()
    sink = open_sink(tmp_path, url)
    state = {b"k%03d" % i: b"v%d" % i for i in range(100)}
    deliver(sink, state, index=7)
    sink.export_now()
    sink.close()
    spec_path = new_cluster_spec(tmp_path / "new")
    assert_one_line_error(run("backup", "restore", "--from", url, "--config", str(spec_path), "--to-index", "0:9,1:7"),
                          "partition 0: from the backup at index 7 to index 9, but no feed holds", "give --feed")
    assert_one_line_error(run("backup", "restore", "--from", url, "--config", str(spec_path),
                              "--to-time", "2026-01-02T03:04:05"), "--to-time", "no time zone")
    assert not (tmp_path / "new" / "n1").exists()
    done = run("backup", "restore", "--from", url, "--config", str(spec_path), "--to-index", "0:7,1:7")
    assert done.returncode == 0, done.stderr
    assert restored(spec_path) == by_partition(state)
