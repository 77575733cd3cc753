"""What a Raft log entry costs to store: a RaftJournal per group against one NodeLog for all groups.

    .venv/bin/python scripts/bench_node_log.py                       # 8 and 256 groups
    .venv/bin/python scripts/bench_node_log.py --groups 8,64,256 --entries 100000 --dir /data/tmp

For each group count N, on the disk holding --dir (the system's temp directory by default):

- one add per entry: entries spread round-robin over the N groups, each `add` its own write
  (RaftJournal: N journal files; NodeLog: N GroupLogs of one log);
- batched turns: each loop turn adds one entry to each of the N groups. RaftJournal cannot batch
  (one write per entry still); NodeLog writes the turn with one os.write (`batch()`);
- fsync mode: the same turns, then what must be durable before anything is sent: RaftJournal syncs
  each of its N journals (N fdatasyncs per turn), NodeLog syncs once.

It prints entries/s and µs per entry for each (the best of --repeat runs, each on fresh files),
the writes and fdatasyncs per entry it counted (os.write and os.fdatasync are wrapped to count
them), and the speed-up. Benchmarks report; they never assert timings.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from raftkv.raft.journal import RaftJournal  # noqa: E402
from raftkv.raft.node_log import NodeLog  # noqa: E402


class Calls:
    """Counts os.write and os.fdatasync calls while it is entered."""

    def __init__(self) -> None:
        self.writes = self.fsyncs = 0

    def __enter__(self) -> Calls:
        self._write, self._fdatasync = os.write, os.fdatasync

        def write(fd: int, data: bytes) -> int:
            self.writes += 1
            return self._write(fd, data)

        def fdatasync(fd: int) -> None:
            self.fsyncs += 1
            self._fdatasync(fd)

        os.write, os.fdatasync = write, fdatasync
        return self

    def __exit__(self, *exc_info: object) -> None:
        os.write, os.fdatasync = self._write, self._fdatasync


@dataclass(frozen=True)
class Figure:
    entries: int
    seconds: float
    writes: int
    fsyncs: int

    @property
    def per_second(self) -> float:
        return self.entries / self.seconds

    @property
    def us_per_entry(self) -> float:
        return self.seconds * 1e6 / self.entries


def measure(entries: int, run: Callable[[], None]) -> Figure:
    with Calls() as calls:
        started = time.perf_counter()
        run()
        seconds = time.perf_counter() - started
    return Figure(entries, seconds, calls.writes, calls.fsyncs)


def journals(work: Path, groups: int, fsync: bool) -> list[RaftJournal]:
    return [RaftJournal(work / f"p{g}", fsync=fsync) for g in range(groups)]


def bench(work: Path, groups: int, entries: int, turns: int, payload: bytes) -> dict[str, tuple[Figure, Figure]]:
    """name -> (RaftJournal's figure, NodeLog's), each on fresh files."""
    results = {}
    rounds = entries // groups

    def journal_adds(logs: list) -> Callable[[], None]:
        def run() -> None:
            for idx in range(1, rounds + 1):
                for log in logs:
                    log.add(payload, idx, 1)
        return run

    def node_turns(log: NodeLog, views: list, count: int, sync: bool) -> Callable[[], None]:
        def run() -> None:
            for idx in range(1, count + 1):
                with log.batch():
                    for view in views:
                        view.add(payload, idx, 1)
                if sync:
                    log.sync()
        return run

    def journal_turns(logs: list[RaftJournal], count: int) -> Callable[[], None]:
        def run() -> None:
            for idx in range(1, count + 1):
                for log in logs:
                    log.add(payload, idx, 1)
                for log in logs:
                    if log.dirty:
                        log.sync()
        return run

    for name, fsync in (("one add per entry", False), ("batched turns", False), ("fsync mode turns", True)):
        folder = work / name.replace(" ", "-")
        logs = journals(folder / "journals", groups, fsync)
        node = NodeLog(folder / "node", fsync=fsync)
        views = [node.group(g) for g in range(groups)]
        node.sync()
        if name == "one add per entry":
            pair = (measure(rounds * groups, journal_adds(logs)), measure(rounds * groups, journal_adds(views)))
        elif name == "batched turns":
            pair = (measure(rounds * groups, journal_adds(logs)),  # it has no batch: a write per entry
                    measure(rounds * groups, node_turns(node, views, rounds, sync=False)))
        else:
            pair = (measure(turns * groups, journal_turns(logs, turns)),
                    measure(turns * groups, node_turns(node, views, turns, sync=True)))
        results[name] = pair
        for log in logs:
            log._destroy()
        node.close()
        shutil.rmtree(folder)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--groups", default="8,256", help="comma-separated group counts")
    parser.add_argument("--entries", type=int, default=100_000, help="entries per measurement without fsync")
    parser.add_argument("--fsync-entries", type=int, default=4096, help="entries per fsync-mode measurement")
    parser.add_argument("--payload", type=int, default=100, help="bytes per entry")
    parser.add_argument("--repeat", type=int, default=3, help="runs of each measurement; the fastest counts")
    parser.add_argument("--dir", type=Path, default=None, help="where the files go (its disk is measured)")
    args = parser.parse_args(argv)
    console = Console(width=max(Console().width, 150))
    payload = os.urandom(args.payload)
    table = Table(title=f"per Raft entry of {args.payload} bytes: a RaftJournal per group vs one NodeLog")
    for column in ("groups", "case", "RaftJournal entries/s", "NodeLog entries/s", "µs/entry (J / N)",
                   "writes/entry (J / N)", "fsyncs/entry (J / N)", "speed-up"):
        table.add_column(column, justify="left" if column == "case" else "right")
    with tempfile.TemporaryDirectory(prefix="raftkv-bench-node-log-", dir=args.dir) as tmp:
        for groups in sorted({int(g) for g in args.groups.split(",")}):
            turns = max(4, args.fsync_entries // groups)
            runs = [bench(Path(tmp), groups, args.entries, turns, payload) for _ in range(args.repeat)]
            for name in runs[0]:
                journal = min((run[name][0] for run in runs), key=lambda figure: figure.seconds)
                node = min((run[name][1] for run in runs), key=lambda figure: figure.seconds)
                table.add_row(
                    str(groups), name, f"{journal.per_second:,.0f}", f"{node.per_second:,.0f}",
                    f"{journal.us_per_entry:.1f} / {node.us_per_entry:.1f}",
                    f"{journal.writes / journal.entries:.3f} / {node.writes / node.entries:.3f}",
                    f"{journal.fsyncs / journal.entries:.3f} / {node.fsyncs / node.entries:.4f}",
                    f"{node.per_second / journal.per_second:.1f}x",
                )
    console.print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
