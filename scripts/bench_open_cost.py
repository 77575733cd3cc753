"""What an open RocksDB database costs in memory: a node opens one per partition it hosts.

    .venv/bin/python scripts/bench_open_cost.py --databases 1024

Each variant runs in a fresh process, which opens `--databases` empty databases in a temporary folder
and reports its RSS growth per database:
- `node`: as a node opens a replica's (`RocksEngine`: the shared budgets, two column families);
- `node, one family`: the same options, without the position's family;
- `rocksdb defaults`: bare `Rdict` options, one family;
- `node, 64 table cache shards`: the node's, with RocksDB's default table cache (before 0.3.0).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

VARIANTS = ("node", "node, one family", "rocksdb defaults", "node, 64 table cache shards")


def _rss_kib() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))


def _open_all(variant: str, count: int, folder: Path) -> float:
    """KiB of RSS per database opened (run in a child: one variant per process)."""
    from rocksdict import Options, Rdict

    from raftkv.storage import rocks_memory
    from raftkv.storage.rocks_engine import RocksEngine

    if variant == "node, 64 table cache shards":
        rocks_memory.TABLE_CACHE_SHARD_BITS = 6
    before, kept = _rss_kib(), []
    for i in range(count):
        path = folder / f"p{i:04d}"
        if variant == "node, one family":
            options = rocks_memory.options()
            options.create_if_missing(True)
            kept.append(Rdict(str(path), options))
        elif variant == "rocksdb defaults":
            options = Options(raw_mode=True)
            options.create_if_missing(True)
            kept.append(Rdict(str(path), options))
        else:
            kept.append(RocksEngine(path))
    return (_rss_kib() - before) / count


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--databases", type=int, default=1024)
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)  # the child's
    args = parser.parse_args(argv)
    if args.variant:
        with tempfile.TemporaryDirectory() as tmp:
            print(_open_all(args.variant, args.databases, Path(tmp)))
        return 0
    table = Table(title=f"RSS per open database, {args.databases:,} databases in one process")
    for column in ("variant", "KiB per database", f"MiB for {args.databases:,}"):
        table.add_column(column, justify="left" if column == "variant" else "right")
    for variant in VARIANTS:
        out = subprocess.run([sys.executable, __file__, "--databases", str(args.databases), "--variant", variant],
                             check=True, capture_output=True, text=True).stdout
        kib = float(out.split()[-1])
        table.add_row(variant, f"{kib:.0f}", f"{kib * args.databases / 1024:.0f}")
    Console().print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
