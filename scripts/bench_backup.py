"""Backup and restore throughput: full and incremental, to file:// and to S3 (moto's server), in MB/s.

A 3-node cluster is loaded with `--keys` keys (16-byte keys, 100-byte random values, put_many); then,
for each target, `backup_cluster` (what `raftkv backup create` runs) makes a full backup, `--change`
of the keys get new values, a second (incremental) backup is made, and each backup is restored into a
fresh one-node data dir (`restore`, what `raftkv backup restore` runs). MB/s is bytes moved over
seconds: for a backup, the bytes it stored (uploaded; the rest was already there), for a restore, the
bytes it read (the whole backup); "whole MB/s" is the backup's full size over the same seconds; "MB
fetched" is what a backup copied from the leaders (the checkpoint files its store lacked, and the small
files that change). Seconds are wall time, a backup's including the leaders' listings and copies.

    .venv/bin/python scripts/bench_backup.py                          # 1,000,000 keys
    .venv/bin/python scripts/bench_backup.py --keys 20000 --json-out backup.json

moto keeps objects in memory and serves them from one Python process: its figures are an upper bound
on request overhead, not a measure of S3.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT / "scripts"), str(ROOT)]
from bench_clusters import raftkv_cluster  # noqa: E402
from bench_load import VALUE_BYTES, key  # noqa: E402
from tests.s3_server import s3_server  # noqa: E402

import raftkv  # noqa: E402
from learners.backup_restore import restore  # noqa: E402
from learners.cluster_backup import backup_cluster  # noqa: E402
from raftkv.backup.store import BackupStore  # noqa: E402
from raftkv.core.partitioning import partition_for_key  # noqa: E402
from raftkv.core.spec import build_spec  # noqa: E402

BUCKET = "raftkv-bench"
CHUNK = 2000  # rows per put_many


@dataclass(frozen=True)
class Row:
    target: str  # file | s3
    kind: str  # full | incremental
    step: str  # backup | restore
    bytes: int  # stored (backup) or read (restore)
    backup_bytes: int  # the whole backup
    seconds: float
    fetched: int = 0  # a backup's: copied from the leaders

    @property
    def mb_s(self) -> float:
        return self.bytes / 1e6 / self.seconds if self.seconds else 0.0

    @property
    def whole_mb_s(self) -> float:
        return self.backup_bytes / 1e6 / self.seconds if self.seconds else 0.0


def load(kv: raftkv.Client, indices: list[int], rng: random.Random, partitions: int) -> None:
    """Put keys `indices` with new random values, put_many per partition, 8 requests at a time."""
    rows: dict[int, list[bytes]] = defaultdict(list)
    for i in indices:
        rows[partition_for_key(key(i), partitions)].append(key(i))
    chunks = [part[i:i + CHUNK] for part in rows.values() for i in range(0, len(part), CHUNK)]
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda chunk: kv.put_many(chunk, [rng.randbytes(VALUE_BYTES) for _ in chunk]), chunks))


def backup_and_restore(kv: raftkv.Client, target: str, url: str, options: dict, kind: str, work: Path,
                       partitions: int) -> list[Row]:
    store = BackupStore(url, options)
    stored: list[int] = []
    fetched: list[int] = []
    started = time.monotonic()
    with tempfile.TemporaryDirectory(dir=work) as copies:
        info = backup_cluster(kv, "raftkv", store, Path(copies), datetime.now(timezone.utc), sent=stored.append,
                              fetched=fetched.append)
    backed_up = time.monotonic() - started
    read: list[int] = []
    spec = build_spec(nodes=1, partitions=partitions, replication=1, base_port=40000,
                      data_dir=work / f"restore-{target}-{kind}")
    started = time.monotonic()
    restore(url, info.id, spec, options, received=read.append)
    restored = time.monotonic() - started
    return [Row(target, kind, "backup", sum(stored), info.total_bytes, backed_up, sum(fetched)),
            Row(target, kind, "restore", sum(read), info.total_bytes, restored)]


def run(args: argparse.Namespace, work: Path) -> list[Row]:
    os.environ.update({"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                       "AWS_DEFAULT_REGION": "us-east-1"})  # moto takes any; this process and its children only
    rng = random.Random(0)
    rows: list[Row] = []
    with raftkv_cluster(work / "cluster", args.partitions) as running, \
            s3_server(BUCKET, work / "moto.log") as endpoint, \
            raftkv.Client(list(running.endpoints), timeout=60) as kv:
        started = time.monotonic()
        load(kv, list(range(args.keys)), rng, args.partitions)
        print(f"loaded {args.keys:,} keys in {time.monotonic() - started:.1f} s", file=sys.stderr)
        targets = {"file": ((work / "backups").as_uri(), {}),
                   "s3": (f"s3://{BUCKET}/bench", {"endpoint_url": endpoint})}
        for name, (url, options) in targets.items():
            rows += backup_and_restore(kv, name, url, options, "full", work, args.partitions)
        load(kv, rng.sample(range(args.keys), max(1, int(args.keys * args.change))), rng, args.partitions)
        for name, (url, options) in targets.items():
            rows += backup_and_restore(kv, name, url, options, "incremental", work, args.partitions)
    return rows


def table(rows: list[Row], keys: int, change: float) -> Table:
    t = Table(title=f"backup and restore, {keys:,} keys (16 B keys, {VALUE_BYTES} B values), "
                    f"incremental after {change:.0%} changed")
    for column in ("target", "backup", "step", "MB moved", "MB fetched", "backup MB", "seconds", "MB/s", "whole MB/s"):
        text = column in ("target", "backup", "step")
        t.add_column(column, justify="left" if text else "right", no_wrap=text)
    for r in rows:
        t.add_row(r.target, r.kind, r.step, f"{r.bytes / 1e6:.1f}",
                  f"{r.fetched / 1e6:.2f}" if r.step == "backup" else "", f"{r.backup_bytes / 1e6:.1f}",
                  f"{r.seconds:.2f}", f"{r.mb_s:.1f}", f"{r.whole_mb_s:.1f}")
    return t


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--keys", type=int, default=1_000_000)
    p.add_argument("--partitions", type=int, default=8)
    p.add_argument("--change", type=float, default=0.01, help="the share of keys changed before the incremental")
    p.add_argument("--json-out", type=Path, help="also write every figure to this JSON file")
    p.add_argument("--data-dir", type=Path, help="where the cluster, backups and restores go (default: a temp dir)")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.data_dir:
        args.data_dir.mkdir(parents=True, exist_ok=True)
        rows = run(args, args.data_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="bench-backup-") as tmp:
            rows = run(args, Path(tmp))
    Console().print(table(rows, args.keys, args.change))
    if args.json_out:
        report = {"keys": args.keys, "partitions": args.partitions, "change": args.change,
                  "rows": [{**asdict(r), "mb_s": round(r.mb_s, 2), "whole_mb_s": round(r.whole_mb_s, 2)} for r in rows]}
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
