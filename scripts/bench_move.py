"""Move a replica of a loaded partition while writes go on (raftkv), beside an etcd learner added and promoted.

raftkv: 3 nodes, one partition (RF 3) loaded with `--keys` keys of 100-byte values;
a 4th node joins (`raftkv node start --join`); a paced writer puts `--rate` writes/s
in a child process; after `--before` seconds a follower's replica moves to the new
node (`Client.move_replica`: learner catch-up, add, voter, remove). Reported: the
move's time, the partition's bytes on disk over that time (MB/s), and the put
latency p99 before and during the move; with `--json-out`, also what the move sent
(checkpoint and snapshot bytes, from the nodes' metrics), what the new node wrote to
its disk meanwhile (/proc/PID/io), the source's files by kind, and the slow writes
(over SLOW_MS) and how many of them were sent within 100 ms of a checkpoint the
leader's replica took (its log compactions, from RocksDB's LOG); `--samples-out`
writes every write's send time and latency, and the leader's checkpoint times.

etcd 3.4: 3 members loaded with the same keys; a learner member is added
(`MemberAdd(isLearner)`), started, and promoted once etcd allows it
(`MemberPromote` succeeds only when the learner is in sync). Reported: time to
promoted, and the database size over that time.

    python scripts/bench_move.py                  # 1,000,000 keys, 5,000 writes/s
    python scripts/bench_move.py --quick          # 20,000 keys, a smoke run
    python scripts/bench_move.py --json-out move.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import sys
import tempfile
import time
import traceback
from array import array
from dataclasses import dataclass, replace
from pathlib import Path

import grpc
from rich.console import Console
from rich.table import Table

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clusters import (  # noqa: E402
    ensure_etcd, etcd_cluster, etcd_join_command, etcd_rpc, etcd_version, raftkv_cluster, started,
)
from bench_learner_config import Config, FAST_RECONNECT  # noqa: E402
from bench_load import VALUE_BYTES, percentile  # noqa: E402
from learner_catchup import _etcd_add_learner, _reply, load  # noqa: E402

import raftkv  # noqa: E402
from raftkv.core.spec import Tuning, ports_per_node  # noqa: E402
from raftkv.dev.local_cluster import free_port_block  # noqa: E402
from raftkv.dev.metrics_scrape import samples  # noqa: E402

TARGET_MB_S = 100.0  # the target for raftkv; CockroachDB's default snapshot rate is 32 MiB/s
NEW_NODE = "n4"
SLOW_MS = 25.0  # a write this slow is a stall (the quiet p99 is 4-8 ms)
NEAR_S = 0.1  # a slow write sent this close to a checkpoint of the leader's counts as that checkpoint's


@dataclass(frozen=True)
class Moved:
    system: str
    keys: int
    load_s: float
    size_mb: float  # the partition's (or etcd's database's) bytes on disk
    move_s: float  # raftkv: BeginMove to EndMove; etcd: MemberAdd to MemberPromote
    p99_before_ms: float = 0.0
    p99_during_ms: float = 0.0
    writes: int = 0  # acknowledged during the run
    errors: int = 0
    sent_mb: float = 0.0  # raftkv: checkpoint and snapshot bytes the group's nodes sent during the move
    target_written_mb: float = 0.0  # raftkv: bytes the new node's process wrote to its disk during the move
    files_mb: dict[str, float] | None = None  # raftkv: the source replica's files by kind (sst, wal, other)
    slow: dict[str, int] | None = None  # raftkv: slow writes before and during the move, and at the leader's checkpoints
    samples: dict | None = None  # raftkv: what --samples-out writes

    @property
    def mb_s(self) -> float:
        return self.size_mb / self.move_s if self.move_s else 0.0


# -- the paced writer (a child process, so its work does not share this process's GIL) ---------


def _writer_child(endpoints, rate: int, stop, results) -> None:
    try:
        results.put(asyncio.run(_paced(endpoints, rate, stop, results)))
    except BaseException:
        results.put(traceback.format_exc())


async def _paced(endpoints, rate: int, stop, results):
    """`rate` puts a second until `stop` is set: (send times in s since the epoch, latencies in ms, errors)."""
    sent_at, latency, errors = array("d"), array("d"), 0
    value = b"y" * VALUE_BYTES
    async with raftkv.AsyncClient(list(endpoints), timeout=10.0) as kv:
        await kv.partitions()
        results.put("ready")

        async def put(i: int) -> None:
            nonlocal errors
            t0 = time.time()
            try:
                await kv.put(b"live/%010d" % i, value)
            except raftkv.RaftKVError:
                errors += 1
                return
            sent_at.append(t0)
            latency.append((time.time() - t0) * 1000)

        begin, issued, outstanding = time.monotonic(), 0, set()
        while not stop.is_set():
            now = time.monotonic()
            while issued < int((now - begin) * rate):
                issued += 1
                task = asyncio.create_task(put(issued))
                outstanding.add(task)
                task.add_done_callback(outstanding.discard)
            await asyncio.sleep(0.001)
        if outstanding:
            await asyncio.wait(outstanding, timeout=15)
    return list(sent_at), list(latency), errors


def _p99(sent_at: list[float], latency: list[float], start: float, end: float) -> float:
    return percentile(sorted(ms for t, ms in zip(sent_at, latency) if start <= t < end), 0.99)


# -- raftkv ------------------------------------------------------------------------------------


def raftkv_move(data_dir: Path, config: Config, rate: int, before: float, console: Console) -> Moved:
    tuning = Tuning(rebalance_interval=0)  # this benchmark moves the replica itself
    with raftkv_cluster(data_dir / "raftkv", partitions=1, tuning=tuning) as cluster:
        load_s = load("raftkv", cluster.endpoints, replace(config, partitions=1))
        base = free_port_block(ports_per_node(1))
        join = [sys.executable, "-m", "raftkv", "node", "start", "--join", cluster.endpoints[0], "--node", NEW_NODE,
                "--base-port", str(base), "--data-dir", str(data_dir / "raftkv" / NEW_NODE)]
        with started(join, data_dir / "raftkv" / f"{NEW_NODE}.log") as new_node, \
                raftkv.Client(list(cluster.endpoints)) as kv:
            until(lambda: kv.topology().meta.node(NEW_NODE).state.value == "up", 60, f"{NEW_NODE} to be up")
            leader = next(s.node_id for s in kv.status() for ps in s.partitions if ps.role == "leader")
            source = next(n for n in kv.topology().meta.placement[0] if n != leader)
            files_mb = _files_mb(data_dir / "raftkv" / source / "p0000" / "db")
            size_mb = sum(files_mb.values())
            writer, stop, results = _start_writer(cluster.endpoints, rate)
            try:
                writes_from = time.time()
                time.sleep(before)
                sent_before, written_before = _sent_bytes(cluster.metrics), _written_bytes(new_node.pid)
                started_at = time.time()
                kv.move_replica(0, source, NEW_NODE)
                until(lambda: not kv.topology().meta.moves, 600, "the move to finish", poll=0.05)
                ended_at = time.time()
                sent_mb = (_sent_bytes(cluster.metrics) - sent_before) / 1e6
                written_mb = (_written_bytes(new_node.pid) - written_before) / 1e6
                stop.set()
                reply = _reply(writer, results, 60)
            finally:
                stop.set()
                writer.join(timeout=30)
                if writer.is_alive():
                    writer.terminate()
            if isinstance(reply, str):
                raise RuntimeError(f"the writer failed: {reply}")
    sent_at, latency, errors = reply
    checkpoints = _checkpoint_times(data_dir / "raftkv" / leader / "p0000" / "db" / "LOG")
    warm = writes_from + before / 2
    console.print(f"[dim]raftkv: moved {size_mb:.1f} MB of partition 0 from {source} to {NEW_NODE} in "
                  f"{ended_at - started_at:.2f} s[/dim]")
    return Moved("raftkv", config.keys, load_s, size_mb, ended_at - started_at,
                 p99_before_ms=_p99(sent_at, latency, warm, started_at),  # after a warm-up
                 p99_during_ms=_p99(sent_at, latency, started_at, ended_at), writes=len(latency), errors=errors,
                 sent_mb=sent_mb, target_written_mb=written_mb, files_mb=files_mb,
                 slow=_slow_writes(sent_at, latency, checkpoints, warm, started_at, ended_at),
                 samples={"move_started": started_at, "move_ended": ended_at, "leader": leader,
                          "leader_checkpoints": checkpoints, "writes": [[t, ms] for t, ms in zip(sent_at, latency)]})


def _checkpoint_times(log: Path) -> list[float]:
    """When RocksDB began each checkpoint of a database, in seconds since the epoch (its LOG's local times)."""
    times = []
    for line in log.read_text(errors="replace").splitlines():
        if "Started the snapshot process" in line:
            times.append(time.mktime(time.strptime(line[:19], "%Y/%m/%d-%H:%M:%S")) + float("0" + line[19:26]))
    return times


def _slow_writes(sent_at, latency, checkpoints: list[float], warm: float, started: float, ended: float) -> dict:
    """Writes over SLOW_MS sent before the move (after the warm-up) and during it, and how many of those
    were sent within NEAR_S of a checkpoint the leader took."""
    slow = [t for t, ms in zip(sent_at, latency) if ms > SLOW_MS and warm <= t < ended]
    return {"before": sum(t < started for t in slow), "during": sum(t >= started for t in slow),
            "at_leader_checkpoints": sum(any(abs(t - c) <= NEAR_S for c in checkpoints) for t in slow),
            "leader_checkpoints": sum(warm <= c < ended for c in checkpoints)}


def _start_writer(endpoints, rate: int):
    ctx = multiprocessing.get_context("spawn")
    results, stop = ctx.Queue(), ctx.Event()
    proc = ctx.Process(target=_writer_child, args=(tuple(endpoints), rate, stop, results))
    proc.start()
    if (ready := _reply(proc, results, 60)) != "ready":
        raise RuntimeError(f"the writer did not start: {ready}")
    return proc, stop, results


def _files_mb(db: Path) -> dict[str, float]:
    """A RocksDB folder's bytes by kind of file: table files, write-ahead logs, the rest."""
    kinds = {"sst": 0, "wal": 0, "other": 0}
    for path in (p for p in db.rglob("*") if p.is_file()):
        kinds[{".sst": "sst", ".log": "wal"}.get(path.suffix, "other")] += path.stat().st_size
    return {kind: size / 1e6 for kind, size in kinds.items()}


def _sent_bytes(metrics: tuple[str, ...]) -> float:
    """Checkpoint files streamed and Raft snapshot chunks sent, summed over the nodes."""
    return sum(s.value for address in metrics for s in samples(address)
               if s.name == "raftkv_checkpoint_bytes_sent_total"
               or s.name == "raftkv_raft_bytes_sent_total" and s.labels.get("kind") == "snapshot")


def _written_bytes(pid: int) -> int:
    """The bytes process `pid` caused to be written to storage so far (Linux's /proc/PID/io)."""
    for line in Path(f"/proc/{pid}/io").read_text().splitlines():
        if line.startswith("write_bytes:"):
            return int(line.split()[1])
    return 0


def until(predicate, timeout: float, what: str, poll: float = 0.2) -> None:
    """Until `predicate()` holds (a RaftKVError counts as not yet), or TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if predicate():
                return
        except raftkv.RaftKVError:
            pass
        time.sleep(poll)
    raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")


# -- etcd --------------------------------------------------------------------------------------


def etcd_learner(binary: str, data_dir: Path, config: Config) -> Moved:
    rpc, stubs = etcd_rpc()
    with etcd_cluster(binary, data_dir / "etcd") as etcd:
        load_s = load("etcd", etcd.endpoints, config)
        with grpc.insecure_channel(etcd.endpoints[0]) as channel:
            size_mb = stubs.MaintenanceStub(channel).Status(rpc.StatusRequest(), timeout=5).dbSize / 1e6
        base = free_port_block(2)
        client_url, peer_url = f"http://127.0.0.1:{base}", f"http://127.0.0.1:{base + 1}"
        started_at = time.monotonic()
        added = _etcd_add_learner(stubs, rpc, etcd.endpoints[0], peer_url)
        initial = ",".join(f"{m.name or 'learner'}={m.peerURLs[0]}" for m in added.members)
        command = etcd_join_command(binary, "learner", data_dir / "etcd" / "learner" / "data", client_url, peer_url,
                                    initial)
        with started(command, data_dir / "etcd" / "learner" / "etcd.log"), \
                grpc.insecure_channel(etcd.endpoints[0], options=FAST_RECONNECT) as channel:
            cluster_stub = stubs.ClusterStub(channel)
            promote = rpc.MemberPromoteRequest(ID=added.member.ID)

            def promoted() -> bool:
                try:
                    cluster_stub.MemberPromote(promote, timeout=5)
                    return True
                except grpc.RpcError as exc:  # "can only promote a learner member which is in sync with leader"
                    if "in sync" not in (exc.details() or ""):
                        raise
                    return False

            until(promoted, config.timeout, "etcd's learner to be promoted", poll=0.05)
            move_s = time.monotonic() - started_at
    return Moved("etcd", config.keys, load_s, size_mb, move_s)


# -- the table --------------------------------------------------------------------------------


def print_table(console: Console, results: list[Moved], rate: int, version: str) -> None:
    table = Table(title=f"moving a replica of {results[0].keys:,} keys ({VALUE_BYTES}-byte values) "
                        f"under {rate:,} writes/s (raftkv) | {version}")
    for column in ("system", "data (MB)", "time (s)", "MB/s", "put p99 before (ms)", "put p99 during (ms)",
                   "writes / errors"):
        table.add_column(column, justify="left" if column == "system" else "right")
    for r in results:
        table.add_row(r.system, f"{r.size_mb:,.1f}", f"{r.move_s:.2f}", f"{r.mb_s:,.1f}",
                      f"{r.p99_before_ms:.1f}" if r.writes else "-", f"{r.p99_during_ms:.1f}" if r.writes else "-",
                      f"{r.writes:,} / {r.errors}" if r.writes else "-")
    console.print(table)
    raftkv_row, etcd_row = results
    console.print(f"raftkv/etcd time ratio {raftkv_row.move_s / etcd_row.move_s:.2f}x; raftkv {raftkv_row.mb_s:.1f} "
                  f"MB/s (target >= {TARGET_MB_S:.0f} MB/s: {'met' if raftkv_row.mb_s >= TARGET_MB_S else 'not met'})")
    if (slow := raftkv_row.slow) is not None:
        console.print(f"raftkv writes over {SLOW_MS:.0f} ms: {slow['before']} before the move, {slow['during']} during; "
                      f"{slow['at_leader_checkpoints']} of them sent within {NEAR_S * 1000:.0f} ms of one of the "
                      f"{slow['leader_checkpoints']} checkpoints the leader took (its log compactions)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--keys", type=int, default=1_000_000)
    parser.add_argument("--rate", type=int, default=5000, help="writes/s during the raftkv move")
    parser.add_argument("--before", type=float, default=10.0, help="seconds of writes before the move")
    parser.add_argument("--quick", action="store_true", help="20,000 keys, 1,000 writes/s: a smoke run")
    parser.add_argument("--data-dir", type=Path, default=None)
    parser.add_argument("--json-out", type=Path, help="also write the figures to this JSON file")
    parser.add_argument("--samples-out", type=Path, help="write every write's send time and latency here")
    args = parser.parse_args()
    keys, rate, before = (20_000, 1000, 2.0) if args.quick else (args.keys, args.rate, args.before)
    config = Config(keys=keys)
    console = Console()
    binary = ensure_etcd()
    with tempfile.TemporaryDirectory(prefix="raftkv-bench-move-", dir=args.data_dir) as tmp:
        data_dir = Path(tmp)
        moved = raftkv_move(data_dir, config, rate, before, console)
        etcd = etcd_learner(binary, data_dir, config)
    print_table(console, [moved, etcd], rate, etcd_version(binary))
    if args.json_out:
        args.json_out.write_text(json.dumps(report(moved, etcd, rate), indent=2) + "\n")
    if args.samples_out:
        args.samples_out.write_text(json.dumps(moved.samples) + "\n")


def report(moved: Moved, etcd: Moved, rate: int) -> dict:
    """The figures of one run, for --json-out."""
    return {
        "keys": moved.keys, "rate": rate, "load_average": list(os.getloadavg()),
        "move_mb_per_s": round(moved.mb_s, 1), "move_seconds": round(moved.move_s, 3),
        "etcd_seconds": round(etcd.move_s, 3), "etcd_mb_per_s": round(etcd.mb_s, 1),
        "ratio_to_etcd": round(moved.move_s / etcd.move_s, 3) if etcd.move_s else None,
        "write_p99_ms_before": round(moved.p99_before_ms, 1), "write_p99_ms_during": round(moved.p99_during_ms, 1),
        "writes": moved.writes, "errors": moved.errors,
        "partition_mb": round(moved.size_mb, 1),
        "partition_files_mb": {k: round(v, 1) for k, v in moved.files_mb.items()},
        "sent_mb": round(moved.sent_mb, 1), "target_written_mb": round(moved.target_written_mb, 1),
        "etcd_db_mb": round(etcd.size_mb, 1),
        "slow_writes": moved.slow,
    }


if __name__ == "__main__":
    main()
