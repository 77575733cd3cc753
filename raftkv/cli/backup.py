"""raftkv backup create | list | verify | prune | restore."""

from __future__ import annotations

import json
import tempfile
from datetime import datetime, timezone
from pathlib import Path

import click
from rich.table import Table

from learners.backup_restore import restore, restore_to
from learners.cluster_backup import backup_cluster
from learners.feed_history import FeedHistory, open_feed
from learners.restore_plan import parse_index_targets, parse_time
from raftkv import failpoints
from raftkv.backup.manifest import BackupInfo
from raftkv.backup.store import LATEST, BackupStore, list_backups, parse_storage_options
from raftkv.backup.verification import bytes_to_read, verify_backups
from raftkv.cli.options import config_option, json_option, parse_key_values, tls_files
from raftkv.cli.output import console, progress_bars
from raftkv.client.sync_client import Client
from raftkv.core.errors import ConfigError, Unauthenticated
from raftkv.core.spec import ClusterSpec
from raftkv.core.spec_toml import load_spec
from raftkv.security.tls import Tls

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

progress_option = click.option("--progress/--no-progress", default=None,
                               help="Progress bars (bytes, rate) on stderr; default: when stderr is a terminal.")


@click.group()
def backup() -> None:
    """Back up a cluster to a file:// or s3:// URL, list, verify and prune backups, restore a new cluster."""


@backup.command()
@config_option
@click.option("--to", "url", required=True, help="Where backups go: file:///path, s3://bucket/prefix, any fsspec URL.")
@storage_option
@progress_option
def create(config: str, url: str, storage_pairs: tuple[str, ...], progress: bool | None) -> None:
    """Back up a running cluster, without a learner.

    Each partition is a checkpoint of its leader's database, exactly the state
    after one Raft entry; only its files no backup under the URL holds yet
    are copied from the leader and uploaded, several at once. Partitions are copied one after
    another, so the backup is not a single point in time across partitions.
    An admin verb.
    """
    failpoints.arm_from_environment()
    spec = load_spec(config)
    store = BackupStore(url, _storage_options(storage_pairs), source="--to")
    uploaded: list[int] = []
    fetched: list[int] = []
    with Client([n.api_address for n in spec.nodes], tls=tls_files(spec)) as kv, \
            tempfile.TemporaryDirectory(prefix="raftkv-backup-") as tmp, progress_bars(progress) as bars:
        bar = bars.add("copying from the leaders")

        def sent(count: int) -> None:
            uploaded.append(count)
            bar.advance(count)

        def planned(total: int) -> None:
            bar.describe("uploading")
            bar.total(total)

        info = backup_cluster(kv, spec.name, store, work=Path(tmp), created=datetime.now(timezone.utc), sent=sent,
                              planned=planned, copying=lambda p: bar.describe(f"copying partition {p} from its leader"),
                              fetched=fetched.append)
    console.print(f"backup {info.id}: {len(info.partitions)} partitions, {_size(info.total_bytes)} "
                  f"({_size(sum(fetched))} copied from the leaders, {_size(sum(uploaded))} uploaded, the rest "
                  f"already stored) -> {store.url}", soft_wrap=True)


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
@progress_option
def verify(url: str, backup_id: str, storage_pairs: tuple[str, ...], progress: bool | None) -> None:
    """Check a backup: every file's size and SHA-256, and that each partition's checkpoint opens.

    Each partition is downloaded to a temporary folder, checked and removed; a file several backups
    share is downloaded once. A missing or damaged file is named and the exit code is 2.
    """
    failpoints.arm_from_environment()
    store = BackupStore(url, _storage_options(storage_pairs), source="--from")
    infos = store.backups() if backup_id == ALL else [store.get(backup_id)]
    if not infos:
        raise ConfigError(f"no backups in {store.url}", source="--backup")
    with progress_bars(progress) as bars, tempfile.TemporaryDirectory(prefix="raftkv-verify-") as tmp:
        verify_backups(store, infos, Path(tmp), received=bars.add("verifying", total=bytes_to_read(infos)).advance)
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
@click.option("--backup", "backup_id", default=None, help="A backup id (see `backup list`); default: the latest.")
@click.option("--to-index", "to_index", metavar="PARTITION:INDEX,...",
              help="Restore each partition to exactly the state after this entry of its log: the newest backup at "
                   "or before it, then the feed's changes up to it. Name every partition.")
@click.option("--to-time", "to_time", metavar="ISO8601",
              help="Restore each partition to every change the feed captured by this time (with its zone: "
                   "2026-01-02T03:04:05Z).")
@click.option("--feed", "feed_url", metavar="URL",
              help="Where the changes after a backup come from: changelog://HOST:PORT (a changelog learner's "
                   "--api-port) or kafka://HOST:PORT[,HOST:PORT...]/TOPIC.")
@click.option("--feed-option", "feed_pairs", multiple=True, metavar="KEY=VALUE",
              help="For a Kafka feed, the sink options that find its learner's positions: learner=NAME, and "
                   "transactional.id=..., producer.ssl.*=... if the learner has them; repeatable.")
@click.option("--feed-cacert", type=click.Path(dir_okay=False), metavar="PEM",
              help="For a changelog feed of a cluster with TLS: that cluster's CA. A new cluster made by "
                   "`cluster init` has a CA of its own, so give the old cluster's here. Used only to read the feed.")
@click.option("--feed-cert", type=click.Path(dir_okay=False), metavar="PEM",
              help="A client certificate the feed's CA issued (the old cluster's certs/user-admin.pem).")
@click.option("--feed-key", type=click.Path(dir_okay=False), metavar="PEM", help="The key of --feed-cert.")
@config_option
@storage_option
@progress_option
def restore_(url: str, backup_id: str | None, to_index: str | None, to_time: str | None, feed_url: str | None,
             feed_pairs: tuple[str, ...], feed_cacert: str | None, feed_cert: str | None, feed_key: str | None,
             config: str, storage_pairs: tuple[str, ...], progress: bool | None) -> None:
    """Build a NEW cluster's data (the nodes of --config) from a backup, or from backups and a change feed
    up to a point of the log (--to-index, --to-time).

    Run it before the new cluster's nodes first start: their data dirs must be
    empty. The spec must have the backup's partition count. The backup is
    verified (as `backup verify` does), and the feed checked to hold every change
    up to the point, before anything is written. Raft positions are reset, so the
    new cluster's log starts at index 1 on top of the data. An interrupted restore
    finishes when run again, and downloads only what it did not have.

    The feed is read with --feed-cacert/--feed-cert/--feed-key when given (the old cluster's certificates),
    else with what the CLI presents to a cluster (--cacert/--cert/--key, or the spec's client_cert).
    """
    failpoints.arm_from_environment()
    if to_index is not None and to_time is not None:
        raise click.UsageError("give --to-index or --to-time, not both")
    point = to_index is not None or to_time is not None
    if point and backup_id is not None:
        raise click.UsageError("--to-index and --to-time choose the backups themselves: leave out --backup")
    feed_files = (feed_cacert, feed_cert, feed_key)
    if not point and (feed_url or feed_pairs):
        raise click.UsageError("--feed replays changes after a backup: give --to-index or --to-time too")
    if any(feed_files) and not (feed_url or "").startswith("changelog://"):
        raise click.UsageError("--feed-cacert, --feed-cert and --feed-key are for a --feed changelog://...; "
                               "a Kafka feed takes its TLS settings as --feed-option producer.ssl.*=...")
    spec = load_spec(config)
    storage = _storage_options(storage_pairs)
    if not point:
        with progress_bars(progress) as bars:
            bar = bars.add("downloading")
            info = restore(url, backup_id or LATEST, spec, storage, received=bar.advance, planned=bar.total)
        console.print(f"restored backup {info.id} ({len(info.partitions)} partitions, {_size(info.total_bytes)}) "
                      f"into {len(spec.nodes)} nodes; {_start_hint(config)}", soft_wrap=True)
        return
    with progress_bars(progress) as bars:
        bar = bars.add("downloading")
        targets = parse_index_targets(to_index) if to_index is not None else parse_time(to_time)
        feed = _open_feed(feed_url, parse_key_values(feed_pairs, "--feed-option"), _feed_tls(spec, *feed_files)) \
            if feed_url else None
        try:
            restored = restore_to(url, spec, targets, feed, storage, received=bar.advance, planned=bar.total)
        finally:
            if feed is not None:
                feed.close()
    for p, (plan, events) in sorted(restored.items()):
        replayed = "" if not plan.needs_feed else \
            f", then {events} changes of the feed" if events is not None else ", then the feed's changes (an earlier run)"
        console.print(f"partition {p}: backup {plan.backup.id} (index {plan.after}){replayed}: "
                      f"the state after index {plan.until}", soft_wrap=True)
    console.print(f"restored {len(restored)} partitions into {len(spec.nodes)} nodes; {_start_hint(config)}",
                  soft_wrap=True)


def _feed_tls(spec: ClusterSpec, cacert: str | None, cert: str | None, key: str | None) -> Tls | None:
    if not (cacert or cert or key):
        return tls_files(spec)
    if not (cacert and cert and key):
        raise ConfigError("give --feed-cacert, --feed-cert and --feed-key together: the CA of the feed's "
                          "cluster and a client certificate it issued, with its key", source="--feed-cert")
    return Tls(cacert, cert, key)


def _open_feed(url: str, options: dict[str, str], tls: Tls | None) -> FeedHistory:
    try:
        return open_feed(url, options, tls, click.get_current_context().find_root().params.get("token"))
    except Unauthenticated as exc:
        raise Unauthenticated(f"{exc}. If the feed is another cluster's (a restore into a new cluster), give its "
                              "CA and a client certificate it issued: --feed-cacert, --feed-cert, --feed-key") from None


def _start_hint(config: str) -> str:
    return f"start them with: raftkv node start --config {config} --node <id>"


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
