"""raftkv backup create | list | verify | prune | restore."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import click
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn, TransferSpeedColumn
from rich.table import Table

from learners.backup_restore import backup_cluster, restore
from raftkv.backup.manifest import BackupInfo
from raftkv.backup.store import LATEST, BackupStore, list_backups, parse_storage_options
from raftkv.cli.options import config_option, json_option, tls_files
from raftkv.cli.output import console
from raftkv.client.sync_client import Client
from raftkv.core.errors import ConfigError
from raftkv.core.spec import load_spec

ALL = "all"


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
    """Back up a cluster to a file:// or s3:// URL, list, verify and prune backups, restore a new cluster."""


@backup.command()
@config_option
@click.option("--to", "url", required=True, help="Where backups go: file:///path, s3://bucket/prefix, any fsspec URL.")
@storage_option
def create(config: str, url: str, storage_pairs: tuple[str, ...]) -> None:
    """Back up a running cluster, without a learner.

    Each partition is copied as a checkpoint of its leader's database, exactly
    the state after one Raft entry; only the files no backup under the URL
    holds yet are uploaded. Partitions are copied one after another, so the
    backup is not a single point in time across partitions. An admin verb.
    """
    spec = load_spec(config)
    store = BackupStore(url, _storage_options(storage_pairs), source="--to")
    uploaded: list[int] = []
    with Client([n.api_address for n in spec.nodes], tls=tls_files(spec)) as kv, \
            tempfile.TemporaryDirectory(prefix="raftkv-backup-") as tmp:
        info = backup_cluster(kv, spec.name, store, work=Path(tmp), created=datetime.now(timezone.utc),
                              sent=uploaded.append)
    console.print(f"backup {info.id}: {len(info.partitions)} partitions, {_size(info.total_bytes)} "
                  f"({_size(sum(uploaded))} uploaded, the rest already stored) -> {store.url}", soft_wrap=True)


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


@backup.command()
@from_option
@click.option("--backup", "backup_id", default=LATEST, show_default=True,
              help=f"A backup id (see `backup list`), or {ALL} for every backup.")
@storage_option
def verify(url: str, backup_id: str, storage_pairs: tuple[str, ...]) -> None:
    """Check a backup: every file's size and SHA-256, and that each partition's checkpoint opens.

    Each partition is downloaded to a temporary folder, checked and removed; a missing or damaged file
    is named and the exit code is 2.
    """
    store = BackupStore(url, _storage_options(storage_pairs), source="--from")
    infos = store.backups() if backup_id == ALL else [store.get(backup_id)]
    if not infos:
        raise ConfigError(f"no backups in {store.url}", source="--backup")
    columns = (TextColumn("{task.description}"), BarColumn(), DownloadColumn(), TransferSpeedColumn(),
               TimeRemainingColumn())
    with Progress(*columns, console=console) as progress, tempfile.TemporaryDirectory(prefix="raftkv-verify-") as tmp:
        for info in infos:
            task = progress.add_task(f"backup {info.id}", total=info.total_bytes)
            store.verify(info, Path(tmp), received=lambda n: progress.advance(task, n))
    for info in infos:
        console.print(f"backup {info.id}: {sum(len(c.files) for c in info.copies)} files, "
                      f"{_size(info.total_bytes)}: every size and hash matches, every checkpoint opens", soft_wrap=True)


@backup.command()
@from_option
@click.option("--keep", type=click.IntRange(min=1), required=True,
              help="How many complete backups to keep, the newest.")
@storage_option
def prune(url: str, keep: int, storage_pairs: tuple[str, ...]) -> None:
    """Delete all but the newest --keep backups, partial backups a day old, and the files nothing kept needs.

    Files a backup under way will reference are kept (docs/backup.md, "Prune").
    """
    store = BackupStore(url, _storage_options(storage_pairs), source="--from")
    if not store.backups():  # most likely a mistyped URL: leave it alone
        raise ConfigError(f"no backups in {store.url}", source="--from")
    pruned = store.prune(keep)
    console.print(f"deleted {len(pruned.backups)} backups ({', '.join(pruned.backups) or 'none'}), "
                  f"{len(pruned.partial)} partial ones and {pruned.objects} files no kept backup needs "
                  f"({_size(pruned.bytes)})", soft_wrap=True)
    if pruned.left:
        console.print(f"{pruned.left} more such files are left for the next prune: this one ran out of time")


@backup.command("restore")
@from_option
@click.option("--backup", "backup_id", default=LATEST, show_default=True, help="A backup id (see `backup list`).")
@config_option
@storage_option
def restore_(url: str, backup_id: str, config: str, storage_pairs: tuple[str, ...]) -> None:
    """Build a NEW cluster's data (the nodes of --config) from a backup.

    Run it before the new cluster's nodes first start: their data dirs must be
    empty. The spec must have the backup's partition count. The backup is
    verified (as `backup verify` does) before anything is written. Raft positions
    are reset, so the new cluster's log starts at index 1 on top of the data.
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
