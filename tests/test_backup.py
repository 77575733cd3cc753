"""The backup engine: the sink, the store, restore, and `raftkv backup` against real RocksDB, S3 and nodes.

S3 is moto's standalone server (tests/s3_server.py, the `s3` fixture); clusters are real node
processes (the make_cluster fixture).
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timezone
from pathlib import Path

import pytest

from learners.backup_restore import restore, restore_targets
from raftkv.backup.manifest import partition_dir
from raftkv.backup.store import LATEST, BackupStore, list_backups, parse_storage_options
from learners.change_event import ChangeEvent
from learners.sinks.backup_sink import BackupSink
from learners.sinks.base import DeliveryBatch, load_sink
from raftkv import Client, ConfigError, CorruptData, Unavailable
from raftkv.storage.engine import ZERO, KeyRange, Position
from raftkv.storage.rocks_engine import RocksEngine
from raftkv.core.spec import build_spec
from raftkv.dev.local_cluster import free_port_block
from tests.conftest import BUCKET, wait_until
from tests.s3_server import s3_server
from tests.test_cli import assert_one_line_error, run

FAST_FAIL = {"storage.config_kwargs.retries.max_attempts": "1", "storage.config_kwargs.connect_timeout": "1"}


def event(op: str, key: bytes, after: bytes | None, partition: int, index: int, seq: int = 0,
          snapshot: bool = False) -> ChangeEvent:
    return ChangeEvent(op, key, None, after, "demo", partition, index, 3, seq, snapshot, 0)


# Two partitions: every op kind, several events in one entry, a snapshot 'r', and a no-op entry (p0 reaches 7).
EVENTS = [
    event("c", b"a", b"1", 0, 3),
    event("u", b"a", b"2", 0, 4),
    event("c", b"b", b"x", 0, 4, seq=1),
    event("d", b"b", None, 0, 5),
    event("r", b"k", b"snap", 1, 2, snapshot=True),
    event("c", b"z", b"26", 1, 6),
]
STATE = {0: {b"a": b"2"}, 1: {b"k": b"snap", b"z": b"26"}}
POSITIONS = {0: 7, 1: 6}


def open_sink(tmp_path: Path, url: str, **options: str) -> BackupSink:
    sink = BackupSink()
    sink.open({"url": url, "work_dir": str(tmp_path / "work"), "interval_seconds": "0", **options})
    return sink


def fill(sink: BackupSink) -> None:
    sink.deliver(DeliveryBatch(EVENTS, POSITIONS))
    sink.flush()


def storage(options: dict[str, str]) -> dict:
    """Sink options `storage.<key>` as the store's fsspec options."""
    prefix = "storage."
    return parse_storage_options((k.removeprefix(prefix), v) for k, v in options.items() if k.startswith(prefix))


def contents(folder: Path) -> tuple[Position, dict[bytes, bytes]]:
    engine = RocksEngine(folder)
    try:
        position, items = engine.scan(KeyRange())
        return position, dict(items)
    finally:
        engine.close()


def test_sink_exports_lists_keeps_and_restores(tmp_path, target):
    url, options = target
    sink = open_sink(tmp_path, url, keep="2", **options)
    fill(sink)
    first = sink.export_now()
    listed = list_backups(url, storage(options))
    assert [b.id for b in listed] == [first.id]
    assert listed[0].partitions == (0, 1) and listed[0].cluster == "demo" and listed[0].total_bytes > 0
    assert {p: pos.index for p, pos in listed[0].positions.items()} == POSITIONS
    newer = [sink.export_now().id, sink.export_now().id]
    sink.close()
    assert [b.id for b in list_backups(url, storage(options))] == newer  # keep=2 deleted the oldest

    spec = build_spec(nodes=3, partitions=2, replication=2, base_port=40000, data_dir=tmp_path / "restored")
    assert restore(url, LATEST, spec, storage(options)).id == newer[-1]
    for p, folders in restore_targets(spec).items():
        assert len(folders) == 2
        for folder in folders:
            assert contents(folder) == (ZERO, STATE[p])  # the data, with the Raft position reset


def test_a_backup_records_the_term_of_each_position_and_the_clusters_id(tmp_path):
    """A node seeds a new replica from a copy only if its leader's log has the copy's entry with the copy's
    term, and only from its own cluster's backups."""
    url = (tmp_path / "backups").as_uri()
    sink = open_sink(tmp_path, url, cluster_id="c0ffee")
    sink.deliver(DeliveryBatch(EVENTS, {0: 9, 1: 6}, {0: 4, 1: 3}))  # p0 ends on a no-op of term 4
    sink.flush()
    info = sink.export_now()
    sink.close()
    [listed] = list_backups(url)
    assert listed == info and info.cluster_id == "c0ffee"
    assert info.positions == {0: Position(9, 4), 1: Position(6, 3)}


def test_recover_after_reopen_and_redelivery_is_skipped(tmp_path):
    url = (tmp_path / "backups").as_uri()
    sink = load_sink("backup")  # found through its entry point, as a learner finds it
    sink.open({"url": url, "work_dir": str(tmp_path / "work"), "interval_seconds": "0", "learner": "nightly"})
    assert isinstance(sink, BackupSink) and sink.recover() == {}
    fill(sink)
    sink.close()

    sink = open_sink(tmp_path, url)
    assert sink.recover() == POSITIONS
    # A crash between our flush and the learner's copy: the pump delivers again from the copy's position.
    sink.deliver(DeliveryBatch([event("u", b"a", b"stale", 0, 4), event("c", b"n", b"new", 0, 8)], {0: 9, 1: 6}))
    sink.flush()
    assert sink.recover() == {0: 9, 1: 6}
    sink.close()
    assert contents(tmp_path / "work" / partition_dir(0))[1] == {**STATE[0], b"n": b"new"}


def test_failed_export_raises_unavailable_and_a_later_export_works(tmp_path, s3):
    port = free_port_block(1)
    options = {"storage.endpoint_url": f"http://127.0.0.1:{port}", **FAST_FAIL}
    url = f"s3://{BUCKET}/{tmp_path.name}"
    sink = open_sink(tmp_path, url, **options)
    fill(sink)
    with pytest.raises(Unavailable, match=f"cannot .* {url}: Could not connect") as failure:
        sink.export_now()
    assert "\n" not in str(failure.value)
    assert sink.recover() == POSITIONS

    with s3_server(BUCKET, tmp_path / "moto.log", port=port):  # the storage comes back
        info = sink.export_now()
        assert [b.id for b in list_backups(url, storage(options))] == [info.id]
    sink.close()
    for p, state in STATE.items():  # the failure left the copy as it was
        assert contents(tmp_path / "work" / partition_dir(p)) == (Position(POSITIONS[p], 3), state)


def test_periodic_export_follows_new_writes(tmp_path):
    url = (tmp_path / "backups").as_uri()
    sink = open_sink(tmp_path, url, interval_seconds="0.1")
    try:
        fill(sink)
        wait_until(lambda: list_backups(url), 10, "the first periodic export")
        sink.deliver(DeliveryBatch([event("c", b"later", b"1", 1, 7)], {1: 7}))
        sink.flush()
        latest = wait_until(lambda: [b for b in list_backups(url) if b.positions[1].index == 7], 10,
                            "an export with partition 1 at index 7")
        assert latest[0].positions[0].index == POSITIONS[0]
    finally:
        sink.close()


@pytest.mark.parametrize("options, named", [
    ({"url": " "}, "option 'url' is required"),
    ({"url": "nope://bucket"}, "url"),
    ({"keep": "0"}, "option 'keep': must be at least 1"),
    ({"interval_seconds": "soon"}, "option 'interval_seconds': expected a number"),
    ({"kepp": "3"}, "unknown option 'kepp'"),
])
def test_invalid_options_name_the_option(tmp_path, options, named):
    config = {"url": (tmp_path / "b").as_uri(), "work_dir": str(tmp_path / "w"), **options}
    with pytest.raises(ConfigError) as error:
        BackupSink().open(config)
    assert named in str(error.value)


def test_restore_refuses_damage_a_wrong_spec_and_a_used_target(tmp_path):
    url = (tmp_path / "backups").as_uri()
    sink = open_sink(tmp_path, url)
    fill(sink)
    info = sink.export_now()
    sink.close()
    spec = build_spec(nodes=2, partitions=2, replication=2, base_port=40000, data_dir=tmp_path / "new")

    with pytest.raises(ConfigError, match="holds partitions 0-1 but the spec has 4 partitions"):
        restore(url, info.id, build_spec(nodes=2, partitions=4, replication=2, base_port=40000,
                                         data_dir=tmp_path / "four"))
    with pytest.raises(ConfigError, match="no backup 'nope'"):
        restore(url, "nope", spec)

    entry = next(f for f in info.copy_of(1).files if f.path.endswith(".sst"))
    sst = tmp_path / "backups" / info.location(entry)
    original = sst.read_bytes()
    sst.write_bytes(b"X" + original[1:])
    with pytest.raises(CorruptData, match=f"backup {info.id}: {entry.path} "):
        restore(url, info.id, spec)
    assert not any(folder.exists() for folders in restore_targets(spec).values() for folder in folders)

    sst.write_bytes(original)
    restore(url, info.id, spec)
    with pytest.raises(ConfigError, match="already holds data"):
        restore(url, info.id, spec)


def test_restore_drops_the_learners_a_leaders_checkpoint_names(tmp_path):
    """`backup create` copies voters' databases, which hold the learner registry and progress in the old
    cluster's log indices: the new cluster starts with no learners, as with no position."""
    url = (tmp_path / "backups").as_uri()
    checkpoints = {}
    (tmp_path / "cp").mkdir()
    for p in (0, 1):
        engine = RocksEngine(tmp_path / "voter" / partition_dir(p))
        engine.write([], Position(40, 2), meta={b"learner/nightly": b'{"sink": "backup"}', b"progress/nightly": b"x"})
        checkpoints[p] = (tmp_path / "cp" / partition_dir(p), engine.checkpoint(tmp_path / "cp" / partition_dir(p)))
        engine.close()
    info = BackupStore(url).export("demo", checkpoints, datetime.now(timezone.utc))
    spec = build_spec(nodes=1, partitions=2, replication=1, base_port=40000, data_dir=tmp_path / "new")
    restore(url, info.id, spec)
    for folders in restore_targets(spec).values():
        engine = RocksEngine(folders[0])
        assert (engine.position, engine.meta_items()) == (ZERO, [])
        engine.close()


def test_cli_backup_of_a_running_cluster_restores_into_a_fresh_one(make_cluster, tmp_path, s3):
    source = make_cluster(nodes=3, partitions=4)
    written = {f"key/{i:05d}".encode(): f"value-{i}".encode() for i in range(2000)}
    with Client(source.endpoints) as kv, ThreadPoolExecutor(32) as pool:
        list(pool.map(lambda item: kv.put(*item), written.items()))
        cluster_id = kv.topology().meta.cluster_id

    file_url = (tmp_path / "cli-backups").as_uri()
    s3_url = f"s3://{BUCKET}/cli"
    s3_options = ["--storage-option", f"endpoint_url={s3}"]
    for url, extra in ((file_url, []), (s3_url, s3_options)):
        created = run("backup", "create", "--config", str(source.spec_path), "--to", url, *extra)
        assert created.returncode == 0, created.stderr
        listed = run("backup", "list", "--from", url, "--json", *extra)
        assert listed.returncode == 0, listed.stderr
        [backup] = json.loads(listed.stdout)
        assert backup["partitions"] == [0, 1, 2, 3] and backup["id"] in created.stdout
        assert all(pos["index"] > 0 and pos["term"] > 0 for pos in backup["positions"].values())
        assert backup["cluster_id"] == cluster_id  # a node of this cluster may seed replicas from it
    table = run("backup", "list", "--from", file_url)
    assert table.returncode == 0 and source.spec.name in table.stdout
    source.stop_all()

    fresh = make_cluster(nodes=3, partitions=4, start=False)
    restored = run("backup", "restore", "--from", s3_url, "--config", str(fresh.spec_path), *s3_options)
    assert restored.returncode == 0, restored.stderr
    assert_one_line_error(run("backup", "restore", "--from", file_url, "--config", str(fresh.spec_path)),
                          "already holds data")
    fresh.start_all()
    fresh.wait_ready(timeout=60)
    with Client(fresh.endpoints) as kv:
        assert dict(kv.scan()) == written
        # The new cluster's log starts at index 1: with the old positions kept, this write would be skipped.
        kv.put(b"after-restore", b"new")
        assert kv.get(b"after-restore") == b"new"
