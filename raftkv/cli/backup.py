"""raftkv backup create | list | restore."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import click
from rich.table import Table

from learners.backup_restore import backup_cluster, restore
from raftkv.backup.store import LATEST, BackupInfo, BackupStore, list_backups, parse_storage_options
from raftkv.cli.options import config_option, json_option, tls_files
from raftkv.cli.output import console
from raftkv.client.sync_client import Client
from raftkv.core.errors import ConfigError
from raftkv.core.spec import load_spec



def _storage_options(pairs: tuple[str, ...]) -> dict:
    for pair in pairs:
        if "=" not in pair:
            raise ConfigError(f"expected KEY=VALUE, got {pair!r}", source="--storage-option")
    return parse_storage_options(tuple(pair.split("=", 1)) for pair in pairs)


storage_option = click.option(
    "--storage-option", "storage_pairs", multiple=True, metavar="KEY=VALUE",
    help="An fsspec storage option, repeatable; e.g. endpoint_url=http://127.0.0.1:9000 for a local S3. "
         "Dotted keys nest (client_kwargs.region_name=eu-west-1).",
)

from_option = click.option("--from", "url", required=True, help="The URL backups were written to.")


@click.group()
def backup() -> None:
    """Back up a cluster to a file:// or s3:// URL, list backups, restore a new cluster."""


@backup.command()
@config_option
@click.option("--to", "url", required=True, help="Where backups go: file:///path, s3://bucket/prefix, any fsspec URL.")
@storage_option
def create(config: str, url: str, storage_pairs: tuple[str, ...]) -> None:
    """Back up a running cluster, without a learner.

    Each partition is read by one linearizable scan and is consistent on its
    own, at the index that scan was served at. Partitions are read one after
    another, so the backup is not a single point in time across partitions.
    """
    spec = load_spec(config)
    store = BackupStore(url, _storage_options(storage_pairs), source="--to")
    with Client([n.api_address for n in spec.nodes], tls=tls_files(spec)) as kv, tempfile.TemporaryDirectory(prefix="raftkv-backup-") as tmp:
        info = backup_cluster(kv, spec.name, store, work=Path(tmp), created=datetime.now(timezone.utc))
    console.print(f"backup {info.id}: {len(info.partitions)} partitions, {_size(info.total_bytes)} -> {store.url}")


@backup.command("list")
@from_option
@storage_option
@json_option
def list_(url: str, storage_pairs: tuple[str, ...], as_json: bool) -> None:
    """Complete backups, oldest first."""
    backups = list_backups(url, _storage_options(storage_pairs))
    if as_json:
        console.print_json(json.dumps([_row(info) for info in backups]))
        return
    table = Table(title=f"backups in {url}")
    table.add_column("id (= created, UTC)", no_wrap=True)
    table.add_column("cluster")
    table.add_column("partitions", justify="right")
    table.add_column("partition:index")
    table.add_column("size", justify="right", no_wrap=True)
    for info in backups:
        positions = " ".join(f"{p}:{pos.index}" for p, pos in info.positions.items())
        table.add_row(info.id, info.cluster, str(len(info.partitions)), positions, _size(info.total_bytes))
    console.print(table)


@backup.command("restore")
@from_option
@click.option("--backup", "backup_id", default=LATEST, show_default=True, help="A backup id (see `backup list`).")
@config_option
@storage_option
def restore_(url: str, backup_id: str, config: str, storage_pairs: tuple[str, ...]) -> None:
    """Build a NEW cluster's data (the nodes of --config) from a backup.

    Run it before the new cluster's nodes first start: their data dirs must be
    empty. The spec must have the backup's partition count. Raft positions are
    reset, so the new cluster's log starts at index 1 on top of the data.
    """
    spec = load_spec(config)
    info = restore(url, backup_id, spec, _storage_options(storage_pairs))
    console.print(f"restored backup {info.id} ({len(info.partitions)} partitions, {_size(info.total_bytes)}) "
                  f"into {len(spec.nodes)} nodes; start them with: raftkv node start --config {config} --node <id>",
                  soft_wrap=True)


def _row(info: BackupInfo) -> dict:
    return {
        "id": info.id,
        "created": info.created.isoformat(),
        "cluster": info.cluster,
        "cluster_id": info.cluster_id,
        "partitions": list(info.partitions),
        "positions": {str(p): {"index": pos.index, "term": pos.term} for p, pos in info.positions.items()},
        "total_bytes": info.total_bytes,
    }


def _size(count: int) -> str:
    value, unit = float(count), "B"
    for bigger in ("KiB", "MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
