"""Incremental backups (issue 15): shared files, prune, verify and crashes, against real RocksDB, file:// and S3.

S3 is moto's standalone server (the `s3` and `target` fixtures); `backup create` and the crash run against
real node and learner processes.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from datetime import datetime, timedelta, timezone
from pathlib import Path

import fsspec
import grpc
import pytest

from learners.backup_restore import restore
from learners.cluster_backup import backup_cluster
from learners.change_event import ChangeEvent
from learners.sinks.base import DeliveryBatch
from raftkv import Client, CorruptData, NotLeader, Unavailable, failpoints
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.api.rpc_errors import error_of
from raftkv.backup.manifest import FILES, LOCKS, MANIFEST, PENDING, BackupInfo, backup_id_for, lock_name, object_path
from raftkv.backup.plan import MAX_EXPORT, PENDING_GRACE
from raftkv.backup.store import BackupStore, list_backups
from raftkv.backup.verification import bytes_to_read, verify_backups
from raftkv.core.commands import Put
from raftkv.core.partitioning import partition_for_key
from raftkv.core.spec import build_spec
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine
from tests.conftest import BUCKET, wait_until
from tests.raft_admin import lead
from tests.test_backup import contents, fill, open_sink, storage
from tests.test_cli import assert_one_line_error, run

KEYS = 200_000
PARTITIONS = 2


def fs_of(url: str, options: dict[str, str]) -> tuple[fsspec.AbstractFileSystem, str]:
    """The storage under a backup URL, as the test reads and damages it (folders made as needed)."""
    local = {"auto_mkdir": True} if url.startswith("file:") else {}
    fs, root = fsspec.core.url_to_fs(url, skip_instance_cache=True, **local, **storage(options))
    return fs, root.rstrip("/")


def pending_markers(url: str, options: dict[str, str]) -> list[str]:
    """The ids of backups under way (a new fs each call: one caches its listings)."""
    fs, root = fs_of(url, options)
    return [Path(path).parent.name for path in fs.glob(f"{root}/*/{PENDING}")]


def stored_objects(url: str, options: dict[str, str]) -> dict[str, int]:
    """sha256 -> size of every file under <url>/files/."""
    fs, root = fs_of(url, options)
    return {Path(path).name: entry["size"] for path, entry in fs.find(f"{root}/{FILES}", detail=True).items()}


def new_bytes(newer: BackupInfo, older: BackupInfo) -> int:
    """What `newer` had to upload with `older` already stored."""
    return sum(size for name, size in newer.objects.items() if name not in older.objects)


def restored(url: str, options: dict[str, str], backup_id: str, data_dir: Path) -> dict[int, dict[bytes, bytes]]:
    """Each partition's keys, as `restore` writes them into a fresh one-node cluster."""
    spec = build_spec(nodes=1, partitions=PARTITIONS, replication=1, base_port=40000, data_dir=data_dir)
    restore(url, backup_id, spec, storage(options))
    return {p: contents(data_dir / "n1" / f"p{p:04d}")[1] for p in range(PARTITIONS)}


def by_partition(state: dict[bytes, bytes]) -> dict[int, dict[bytes, bytes]]:
    split: dict[int, dict[bytes, bytes]] = {p: {} for p in range(PARTITIONS)}
    for key, value in state.items():
        split[partition_for_key(key, PARTITIONS)][key] = value
    return split


def deliver(sink, changes: dict[bytes, bytes | None], index: int) -> None:
    """`changes` (a value, or None: deleted) as one Raft entry per partition at `index`, flushed."""
    seq: dict[int, int] = defaultdict(int)
    events = []
    for key, value in changes.items():
        p = partition_for_key(key, PARTITIONS)
        events.append(ChangeEvent("d" if value is None else "u", key, None, value, "demo", p, index, 2, seq[p],
                                  False, 0))
        seq[p] += 1
    sink.deliver(DeliveryBatch(events, {p: index for p in range(PARTITIONS)}))
    sink.flush()


def initial_data(rng: random.Random) -> dict[bytes, bytes]:
    return {b"key/%06d" % i: rng.randbytes(100) for i in range(KEYS)}  # incompressible: 24 MB in all


def load(kv: Client, items: dict[bytes, bytes]) -> None:
    """Write `items` with put_many (atomic within one partition), in chunks of 2,000 rows."""
    rows: dict[int, list[tuple[bytes, bytes]]] = defaultdict(list)
    for key, value in items.items():
        rows[partition_for_key(key, PARTITIONS)].append((key, value))
    chunks = [part[i:i + 2000] for part in rows.values() for i in range(0, len(part), 2000)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda chunk: kv.put_many([k for k, _ in chunk], [v for _, v in chunk]), chunks))


def test_the_sink_uploads_only_what_changed_and_prune_keeps_every_file_a_kept_backup_needs(tmp_path, target):
    url, options = target
    rng = random.Random(15)
    state = initial_data(rng)
    sink = open_sink(tmp_path, url, keep="2", **options)
    deliver(sink, state, index=10)
    states, infos = [dict(state)], [sink.export_now()]

    changed = {key: rng.randbytes(100) for key in rng.sample(sorted(state), KEYS // 100)}  # 1%
    deliver(sink, changed, index=20)
    state.update(changed)
    states.append(dict(state))
    infos.append(sink.export_now())
    assert new_bytes(infos[1], infos[0]) <= infos[0].total_bytes / 10
    assert set(stored_objects(url, options)) == set(infos[0].objects) | set(infos[1].objects)

    gone = {key: None for key in rng.sample(sorted(state), KEYS // 100)}
    deliver(sink, {**gone, b"key/new": b"n"}, index=30)
    state = {k: v for k, v in state.items() if k not in gone} | {b"key/new": b"n"}
    states.append(dict(state))
    infos.append(sink.export_now())  # keep=2: its prune deletes the first backup
    sink.close()

    assert [b.id for b in list_backups(url, storage(options))] == [infos[1].id, infos[2].id]
    assert stored_objects(url, options) == infos[1].objects | infos[2].objects  # all they need, nothing else
    for i in (1, 2):
        assert restored(url, options, infos[i].id, tmp_path / f"restore-{i}") == by_partition(states[i])

    extra = [f"--storage-option={k.removeprefix('storage.')}={v}" for k, v in options.items()]
    pruned = run("backup", "prune", "--from", url, "--keep", "1", *extra)
    assert pruned.returncode == 0, pruned.stderr
    assert f"deleted 1 backups ({infos[1].id})" in pruned.stdout
    assert [b.id for b in list_backups(url, storage(options))] == [infos[2].id]
    assert stored_objects(url, options) == infos[2].objects
    assert restored(url, options, infos[2].id, tmp_path / "restore-last") == by_partition(states[2])


def checkpoint_bytes_sent(cluster) -> dict[tuple[str, int], float]:
    """(node, partition) -> the bytes of checkpoint files the node's voter sent so far, from its metrics."""
    sent = {}
    for node in cluster.spec.nodes:
        with urllib.request.urlopen(f"http://{node.host}:{node.metrics_port}/metrics", timeout=5) as response:
            text = response.read().decode()
        for p, value in re.findall(r'^raftkv_checkpoint_bytes_sent_total\{partition="(\d+)"\} (\S+)$', text, re.M):
            sent[node.id, int(p)] = float(value)
    return sent


def test_backup_create_fetches_and_uploads_only_the_files_a_change_made(make_cluster, tmp_path, s3):
    """`backup create` fetches from the leaders only the files the store lacks: after 1% of 200,000 keys
    changed, the second backup moves at most 5% of the first's bytes over the network (the nodes'
    raftkv_checkpoint_bytes_sent_total) and uploads under 10% (from the manifests, and from what the
    storage holds), to S3 and to file://. The first file:// backup is made as the release before did
    (whole checkpoints, exported): the next one reuses its files, and both restore.

    Each replica writes its own table files, so a partition whose leader changed is fetched whole once
    (docs/backup.md): leadership is kept where the first backup found it."""
    cluster = make_cluster(nodes=3, partitions=PARTITIONS)
    rng = random.Random(16)
    data = initial_data(rng)
    targets = [(f"s3://{BUCKET}/create", {"storage.endpoint_url": s3}), ((tmp_path / "backups").as_uri(), {})]

    def create(url: str, options: dict[str, str]) -> dict[tuple[str, int], float]:
        """(node, partition) -> the bytes it sent for the backup."""
        before = checkpoint_bytes_sent(cluster)
        extra = [f"--storage-option=endpoint_url={s3}"] if options else []
        created = run("backup", "create", "--config", str(cluster.spec_path), "--to", url, *extra, timeout=120)
        assert created.returncode == 0, created.stderr
        return {sender: n - before.get(sender, 0) for sender, n in checkpoint_bytes_sent(cluster).items()
                if n > before.get(sender, 0)}

    def keep_leaders(leaders: dict[int, str]) -> None:
        for p, node in leaders.items():
            lead(cluster, p, node)

    with Client(cluster.endpoints, timeout=30) as kv:
        load(kv, data)
        first = data.copy()
        moved = [create(*targets[0])]
        leaders = {p: node for node, p in moved[0]}
        assert sorted(leaders) == list(range(PARTITIONS)) and sum(moved[0].values()) >= 20_000_000, moved
        keep_leaders(leaders)
        whole = {p: (tmp_path / "whole" / f"p{p}", kv.checkpoint(p, tmp_path / "whole" / f"p{p}"))
                 for p in range(PARTITIONS)}
        BackupStore(targets[1][0]).export(cluster.spec.name, whole, datetime.now(timezone.utc),
                                          kv.topology().meta.cluster_id)
        stored = [sum(stored_objects(url, options).values()) for url, options in targets]
        changed = {key: rng.randbytes(100) for key in rng.sample(sorted(data), KEYS // 100)}
        load(kv, changed)
        data.update(changed)
        keep_leaders(leaders)
        moved += [create(*target) for target in targets]
        blocked = tmp_path / "a-file"  # the fetched files cannot land: the backup fails after its marker
        blocked.write_bytes(b"")
        with pytest.raises(OSError):
            backup_cluster(kv, cluster.spec.name, BackupStore(targets[1][0]), blocked, datetime.now(timezone.utc))
        started = time.monotonic()  # a store that fails is not a reason to ask the other nodes until the timeout
        with pytest.raises(Unavailable, match="cannot prepare a backup in"):
            backup_cluster(kv, cluster.spec.name, BackupStore(blocked.as_uri()), tmp_path / "w",
                           datetime.now(timezone.utc))
        assert time.monotonic() - started < 10
    assert pending_markers(targets[1][0], {}) == []  # its marker went with it
    for later in moved[1:]:
        assert {p: node for node, p in later} == leaders, later
        assert sum(later.values()) <= sum(moved[0].values()) * 0.05, moved
    for (url, options), before in zip(targets, stored):
        earlier, latest = list_backups(url, storage(options))
        assert new_bytes(latest, earlier) <= earlier.total_bytes / 10, (new_bytes(latest, earlier), earlier.total_bytes)
        assert sum(stored_objects(url, options).values()) - before == new_bytes(latest, earlier)
    file_url, _ = targets[1]
    earlier, latest = list_backups(file_url)
    assert {p.name for p in (tmp_path / "backups").iterdir()} == {FILES, earlier.id, latest.id}  # no partial one
    assert restored(file_url, {}, earlier.id, tmp_path / "earlier") == by_partition(first)
    assert restored(file_url, {}, latest.id, tmp_path / "latest") == by_partition(data)
    verified = run("backup", "verify", "--from", targets[0][0], "--backup", "all",
                   f"--storage-option=endpoint_url={s3}")
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.count("every size and hash matches, every checkpoint opens") == 2


def test_a_backups_checkpoint_comes_from_the_leader_after_a_read_barrier(make_cluster, tmp_path):
    """A follower's database may lag what was acknowledged: asked for a backup's checkpoint, a follower
    refuses and names the leader, and the client takes it there, with every acknowledged write."""
    cluster = make_cluster(nodes=3, partitions=1)
    with Client(cluster.endpoints, timeout=30) as kv:
        written = {b"k%03d" % i: b"v%d" % i for i in range(50)}
        for key, value in written.items():
            kv.put(key, value)
        refusals = []
        for address in cluster.endpoints:
            with grpc.insecure_channel(address) as channel:
                call = kv_pb2_grpc.AdminStub(channel).Checkpoint(pb.ReplicaRequest(group=0, linearizable=True))
                try:
                    sum(len(chunk.data) for chunk in call)
                except grpc.RpcError as exc:
                    refusals.append(error_of(exc, 0))
        assert len(refusals) == 2 and all(isinstance(error, NotLeader) and error.leader_hint for error in refusals)
        position = kv.checkpoint(0, tmp_path / "p0" / "db")
    held_at, held = contents(tmp_path / "p0")
    assert held_at == position and held == written


def test_verify_names_a_flipped_byte_and_a_missing_file_and_restore_writes_nothing(tmp_path, target):
    url, options = target
    sink = open_sink(tmp_path, url, **options)
    fill(sink)
    info = sink.export_now()
    sink.close()
    fs, root = fs_of(url, options)
    extra = [f"--storage-option={k.removeprefix('storage.')}={v}" for k, v in options.items()]
    verified = run("backup", "verify", "--from", url, *extra)
    assert verified.returncode == 0, verified.stderr
    assert f"backup {info.id}: " in verified.stdout and "every checkpoint opens" in verified.stdout

    entry = next(f for f in info.copy_of(1).files if f.path.endswith(".sst"))
    damaged = f"{root}/{info.location(entry)}"
    original = fs.cat_file(damaged)
    fs.pipe_file(damaged, original[:100] + bytes([original[100] ^ 1]) + original[101:])
    assert_one_line_error(run("backup", "verify", "--from", url, "--backup", info.id, *extra),
                          f"backup {info.id}: {entry.path} ", "sha256", "the manifest says")
    spec = build_spec(nodes=1, partitions=PARTITIONS, replication=1, base_port=40000, data_dir=tmp_path / "new")
    with pytest.raises(CorruptData, match=f"{entry.path} "):
        restore(url, info.id, spec, storage(options))
    assert not (tmp_path / "new" / "n1" / "p0000").exists()  # partition 0 checked out, but nothing was written

    fs.rm_file(damaged)
    assert_one_line_error(run("backup", "verify", "--from", url, *extra), f"backup {info.id}: {entry.path} ",
                          "is missing")
    fs.pipe_file(damaged, original)
    assert run("backup", "verify", "--from", url, *extra).returncode == 0

    # Every file intact, but the manifest leaves one out: only opening the checkpoint tells.
    manifest = f"{root}/{info.id}/{MANIFEST}"
    copies = tuple(dataclasses.replace(c, files=tuple(f for f in c.files if f != entry)) for c in info.copies)
    fs.pipe_file(manifest, dataclasses.replace(info, copies=copies).to_manifest())
    assert_one_line_error(run("backup", "verify", "--from", url, *extra),
                          f"backup {info.id}: partition 1: RocksDB cannot open it")
    assert_one_line_error(run("backup", "verify", "--from", url, "--backup", "nope", *extra), "no backup 'nope'")


def test_verify_all_reads_each_shared_file_once_and_names_a_missing_one(tmp_path):
    """Two backups sharing their table files: `backup verify --backup all` fetches each file once, and a
    shared file gone from the store is one line naming it and the backup, exit code 2."""
    url = (tmp_path / "backups").as_uri()
    rng = random.Random(31)
    sink = open_sink(tmp_path, url, keep="5")
    deliver(sink, {b"key/%05d" % i: rng.randbytes(100) for i in range(5000)}, index=10)
    infos = [sink.export_now()]
    deliver(sink, {b"key/00001": b"x"}, index=20)
    infos.append(sink.export_now())
    sink.close()
    shared = {sha256: size for sha256, size in infos[0].objects.items() if sha256 in infos[1].objects}
    assert sum(shared.values()) > infos[0].total_bytes / 2

    read: list[int] = []
    verify_backups(BackupStore(url), infos, tmp_path / "verify", received=read.append)
    assert sum(read) == bytes_to_read(infos) == sum((infos[0].objects | infos[1].objects).values())
    assert not [p for p in (tmp_path / "verify").rglob("*") if p.is_file()]  # each file deleted once checked

    entry = next(f for f in infos[0].copy_of(1).files if f.sha256 in shared and f.path.endswith(".sst"))
    fs, root = fs_of(url, {})
    fs.rm_file(f"{root}/{object_path(entry.sha256)}")
    assert_one_line_error(run("backup", "verify", "--from", url, "--backup", "all"),
                          f"backup {infos[0].id}: {entry.path} ", "is missing")


def test_prune_spares_what_a_backup_under_way_announced_and_an_export_waits_for_a_running_prune(tmp_path, target):
    url, options = target
    sink = open_sink(tmp_path, url, **options)
    fill(sink)
    sink.export_now()
    fs, root = fs_of(url, options)
    store = BackupStore(url, storage(options))

    # A backup under way has announced an object no manifest references yet.
    orphan, under_way = "f" * 64, backup_id_for(datetime.now(timezone.utc))
    fs.pipe_file(f"{root}/{object_path(orphan)}", b"uploaded by a backup that has not written its manifest")
    fs.pipe_file(f"{root}/{under_way}/{PENDING}", json.dumps(
        {"format": "raftkv-backup-pending", "id": under_way, "objects": [orphan]}).encode())
    assert store.prune(keep=1).objects == 0 and orphan in stored_objects(url, options)
    later = BackupStore(url, storage(options), clock=lambda: datetime.now(timezone.utc) + PENDING_GRACE)  # a day on
    assert later.prune(keep=1).partial == (under_way,)
    assert orphan not in stored_objects(url, options) and not fs.exists(f"{root}/{under_way}")

    # A prune that may not have seen an export's marker holds the export until it is done.
    lock = f"{root}/{LOCKS}/{lock_name(datetime.now(timezone.utc), 'abc123')}"
    fs.pipe_file(lock, b"")
    done = threading.Event()
    exporting = threading.Thread(target=lambda: (sink.export_now(), done.set()))
    exporting.start()
    wait_until(lambda: pending_markers(url, options), 10, "the export's pending marker")
    assert not done.wait(1) and len(list_backups(url, storage(options))) == 1
    fs.rm_file(lock)
    exporting.join(10)
    assert done.is_set() and len(list_backups(url, storage(options))) == 2
    sink.close()


def test_an_export_still_running_half_a_day_after_it_started_writes_no_manifest(tmp_path):
    """Prunes honour a pending marker for a day after the backup's id: past half of that, an export may
    be reusing files a prune collected, so it stops short of making a backup."""
    engine = RocksEngine(tmp_path / "copy")
    engine.write([Put(b"k", b"v")], Position(3, 1))
    checkpoint = tmp_path / "checkpoint"
    engine.checkpoint(checkpoint)
    engine.close()
    url = (tmp_path / "backups").as_uri()
    created = datetime.now(timezone.utc)
    store = BackupStore(url, clock=lambda: created + MAX_EXPORT + timedelta(seconds=1))
    with pytest.raises(Unavailable, match="took longer than 12:00:00"):
        store.export("demo", {0: (checkpoint, Position(3, 1))}, created)
    assert list_backups(url) == [] and pending_markers(url, {}) == [backup_id_for(created)]


def test_version_1_backups_are_listed_verified_restored_and_pruned(tmp_path):
    """A version-1 backup (each file in its own folder) from before shared files, beside version-2 ones."""
    url = (tmp_path / "backups").as_uri()
    sink = open_sink(tmp_path, url)
    fill(sink)
    info = sink.export_now()
    old = dataclasses.replace(info, id=backup_id_for(info.created - timedelta(days=30)), version=1)
    root = tmp_path / "backups"
    for entry in info.copies[0].files + info.copies[1].files:
        (root / old.id / entry.path).parent.mkdir(parents=True, exist_ok=True)
        (root / old.id / entry.path).write_bytes((root / info.location(entry)).read_bytes())
    (root / old.id / MANIFEST).write_bytes(old.to_manifest())
    assert [b.id for b in list_backups(url)] == [old.id, info.id] and list_backups(url)[0].version == 1
    assert run("backup", "verify", "--from", url, "--backup", old.id).returncode == 0
    assert restored(url, {}, old.id, tmp_path / "r") == restored(url, {}, info.id, tmp_path / "r2")
    sink.export_now()  # keep=7: nothing pruned
    assert len(list_backups(url)) == 3
    assert run("backup", "prune", "--from", url, "--keep", "2").returncode == 0
    assert not (root / old.id).exists() and len(list_backups(url)) == 2
    sink.close()


def test_a_learner_killed_mid_backup_leaves_nothing_listed_and_the_next_prune_collects_its_files(
        make_cluster, tmp_path, target):
    url, options = target
    cluster = make_cluster(nodes=3, partitions=PARTITIONS)
    with Client(cluster.endpoints) as kv:
        for i in range(200):
            kv.put(b"k%03d" % i, b"v" * 100)
    sink_options = {"url": url, "work_dir": str(tmp_path / "work"), "interval_seconds": "0.3", "keep": "2", **options}
    added = run("learner", "add", "--name", "nightly", "--sink", "backup", "--config", str(cluster.spec_path),
                *[w for k, v in sink_options.items() for w in ("--sink-option", f"{k}={v}")])
    assert added.returncode == 0, added.stderr
    fs, root = fs_of(url, options)

    def start(env: dict[str, str]) -> subprocess.Popen:
        with open(tmp_path / "learner.log", "ab") as log:
            return subprocess.Popen([sys.executable, "-m", "raftkv", "learner", "start", "--name", "nightly",
                                     "--config", str(cluster.spec_path)], stdout=log, stderr=subprocess.STDOUT,
                                    stdin=subprocess.DEVNULL, env={**os.environ, **env})

    learner = start({failpoints.ENVIRONMENT_VARIABLE: "backup-upload-after=3*off->delay(60000)"})
    try:
        [crashed] = wait_until(lambda: len(stored_objects(url, options)) >= 4 and pending_markers(url, options), 60,
                               "the first export to pause after its fourth upload")
        learner.send_signal(signal.SIGKILL)
        learner.wait(10)
        uploaded = set(stored_objects(url, options))
        assert list_backups(url, storage(options)) == []  # uploaded files and a marker, but no backup

        learner = start({})
        wait_until(lambda: list_backups(url, storage(options)) and crashed not in pending_markers(url, options), 60,
                   "an export after the restart, and its prune")


        def orphans() -> set[str]:
            """The crashed export's files that no listed backup keeps (a later export's, cut short by the
            kill below, are the next prune's)."""
            kept = {name for info in list_backups(url, storage(options)) for name in info.objects}
            return (set(stored_objects(url, options)) - kept) & uploaded

        # Its marker goes first (the restarted learner abandons the export it finds), the files with the
        # prune after the next export (CI stop 37 looked in between).
        wait_until(lambda: not orphans(), 60, "the prune to collect the crashed export's files")
    finally:
        learner.kill()
        learner.wait(10)
    backups = list_backups(url, storage(options))
    assert crashed not in {b.id for b in backups}
    kept = {name for info in backups for name in info.objects}
    assert uploaded - kept, "the crashed export uploaded nothing the next one did not need: the test proves nothing"


def test_a_failed_backup_with_progress_bars_ends_in_one_error_line(make_cluster, tmp_path):
    """`--progress` draws bars on stderr even when it is not a terminal; a failure removes them, so what is
    left is the one line that says what went wrong (found by the CLI fuzzer)."""
    cluster = make_cluster(nodes=3, partitions=2, start=False)
    failed = run("backup", "create", "--config", str(cluster.spec_path), "--to", (tmp_path / "b").as_uri(),
                 "--progress", timeout=60)
    assert_one_line_error(failed, "no node answered")
