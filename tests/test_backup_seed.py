"""BackupCatalog: which backup copy a node may seed a new replica from (the move itself: test_replica_move)."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone
from pathlib import Path

from raftkv.backup.store import BackupStore
from raftkv.core.spec import BackupConfig
from raftkv.node.backup_seed import BackupCatalog
from raftkv.storage.engine import Position
from raftkv.storage.rocks_engine import RocksEngine

START = datetime.now(timezone.utc) - timedelta(hours=1)  # an export dated more than half a day ago fails


def export(store: BackupStore, tmp_path: Path, cluster_id: str, positions: dict[int, Position], minute: int) -> str:
    checkpoints = {}
    for p, position in positions.items():
        engine = RocksEngine(tmp_path / f"src-{minute}-{p}")
        engine.write([], position)
        checkpoints[p] = (tmp_path / f"cp-{minute}-{p}", engine.checkpoint(tmp_path / f"cp-{minute}-{p}"))
        engine.close()
    return store.export("raftkv", checkpoints, START + timedelta(minutes=minute), cluster_id).id


def test_the_newest_copy_of_each_partition_from_this_cluster_with_a_term_is_chosen(tmp_path):
    url = (tmp_path / "backups").as_uri()
    store = BackupStore(url)
    old = export(store, tmp_path, "ours", {0: Position(10, 2), 1: Position(12, 2)}, minute=0)
    newer = export(store, tmp_path, "ours", {0: Position(50, 3), 1: Position(60, 0)}, minute=1)  # p1: term unknown
    export(store, tmp_path, "theirs", {0: Position(90, 3), 1: Position(90, 3)}, minute=2)  # another cluster, one name
    catalog = BackupCatalog(BackupConfig(url), cluster_id=lambda: "ours")
    catalog.refresh()
    assert {p: (c.backup.id, c.copy.position) for p, c in catalog.newest.items()} == {
        0: (newer, Position(50, 3)), 1: (old, Position(12, 2))}
    assert (catalog.index(0), catalog.index(1), catalog.index(2)) == (50, 12, 0)


def test_a_cluster_without_an_id_seeds_from_nothing(tmp_path):
    url = (tmp_path / "backups").as_uri()
    export(BackupStore(url), tmp_path, "", {0: Position(10, 2)}, minute=0)
    catalog = BackupCatalog(BackupConfig(url), cluster_id=lambda: "")  # bootstrapped before ids existed
    catalog.refresh()
    assert catalog.newest == {} and catalog.index(0) == 0
