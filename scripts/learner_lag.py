"""bench_learner.py, part 2: the change feed's lag behind paced writes (raftkv)."""

from __future__ import annotations

import asyncio
import math
import multiprocessing
import sys
import threading
import time
import traceback
from array import array
from dataclasses import dataclass, replace
from pathlib import Path

from rich.console import Console

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_clusters import Running  # noqa: E402
from bench_load import VALUE_BYTES, percentile  # noqa: E402

import raftkv  # noqa: E402
from learners.changelog_client import ChangeLogClient  # noqa: E402
from raftkv.core.errors import Unavailable  # noqa: E402
from bench_learner_config import Config, MAX_PENDING, REQUEST_TIMEOUT  # noqa: E402
from learner_catchup import Cores, Meter, _cores_text, _reply  # noqa: E402

# -- change-feed lag ------------------------------------------------------------------


@dataclass(frozen=True)
class Writes:
    """The paced writer's measured window (puts whose send time falls in it)."""

    sent: int
    acked: int
    skipped: int  # sends left out because MAX_PENDING puts were outstanding
    errors: int
    first_error: str
    put_p50_ms: float
    put_p99_ms: float
    cpu_seconds: float  # the writer process, over its whole run


@dataclass(frozen=True)
class Lag:
    rate: int  # target writes/s
    achieved: float  # acknowledged writes/s in the window
    events: int  # window events the reader got
    missing: int  # acknowledged window writes the reader never got
    p50_ms: float
    p99_ms: float
    max_ms: float
    put_p50_ms: float
    put_p99_ms: float
    skipped: int
    errors: int
    first_error: str
    cores: Cores


def _writer_child(endpoints, rate, warmup, duration, prefix, inbox, results) -> None:
    try:
        results.put(asyncio.run(_paced_puts(endpoints, rate, warmup, duration, prefix, inbox, results)))
    except BaseException:
        results.put(traceback.format_exc())


async def _paced_puts(endpoints, rate: int, warmup: float, duration: float, prefix: bytes, inbox, results) -> Writes:
    """Send `rate` puts a second from `start_at` (from the inbox), each on its own, many in flight."""
    pad = b"x" * (VALUE_BYTES - 20)
    latencies = array("d")
    counts = {"sent": 0, "acked": 0, "skipped": 0, "errors": 0}
    first_error = ""
    async with raftkv.AsyncClient(list(endpoints), timeout=REQUEST_TIMEOUT) as kv:
        await kv.partitions()
        results.put("ready")
        start_at = await asyncio.to_thread(inbox.get, True, 60)
        w0 = int((start_at + warmup) * 1e9)
        w1 = w0 + int(duration * 1e9)

        async def put(i: int) -> None:
            nonlocal first_error
            sent = time.time_ns()
            measured = w0 <= sent < w1
            counts["sent"] += measured
            try:
                await kv.put(prefix + b"%011d" % i, b"%020d" % sent + pad)
            except Exception as exc:  # counted and reported: a benchmark reports what it saw
                counts["errors"] += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
                return
            if measured:
                counts["acked"] += 1
                latencies.append((time.time_ns() - sent) / 1e6)

        begin = time.monotonic() + (start_at - time.time())
        end = begin + warmup + duration
        await asyncio.sleep(max(0.0, begin - time.monotonic()))
        cpu0, outstanding, issued = time.process_time(), set(), 0
        while (now := time.monotonic()) < end:
            while issued < int((now - begin) * rate):
                issued += 1
                if len(outstanding) >= MAX_PENDING:
                    counts["skipped"] += w0 <= time.time_ns() < w1
                    continue
                task = asyncio.create_task(put(issued))
                outstanding.add(task)
                task.add_done_callback(outstanding.discard)
            await asyncio.sleep(0.001)
        if outstanding:
            await asyncio.wait(outstanding, timeout=REQUEST_TIMEOUT + 5)
        cpu = time.process_time() - cpu0
    ordered = sorted(latencies)
    return Writes(counts["sent"], counts["acked"], counts["skipped"], counts["errors"], first_error,
                  percentile(ordered, 0.5), percentile(ordered, 0.99), cpu)


class FeedReader(threading.Thread):
    """Follows the changelog (`ChangeLog.Follow`: pushed after each synced flush of the learner's sink).

    Keeps, for events whose key starts with `prefix` and whose send time is in
    `window` (ns), the time it got them minus that send time.
    """

    def __init__(self, address: str, prefix: bytes):
        super().__init__(name="feed-reader", daemon=True)
        self._log = ChangeLogClient(address)
        self._prefix = prefix
        self.window = (0, 0)
        self.lags_ns = array("q")
        self.errors, self.first_error = 0, ""

    def stop(self) -> None:
        self._log.close()  # ends the Follow call
        if self.is_alive():
            self.join(10)

    def run(self) -> None:
        try:
            for chunk in self._log.follow():
                got = time.time_ns()
                w0, w1 = self.window
                for change in chunk.changes:
                    if change.key.startswith(self._prefix) and change.HasField("after"):
                        sent = int(change.after[:20])
                        if w0 <= sent < w1:
                            self.lags_ns.append(got - sent)
        except Unavailable as exc:
            self.errors += 1
            self.first_error = str(exc)


def feed_lag(cluster: Running, learner_pid: int, address: str, rate: int, run: int, config: Config,
             console: Console) -> Lag:
    """One paced run at `rate` writes/s; keys `lag<run>/` + 11 digits (16 bytes), each written once."""
    prefix = b"lag%d/" % run
    ctx = multiprocessing.get_context("spawn")
    inbox, results = ctx.Queue(), ctx.Queue()
    writer = ctx.Process(target=_writer_child, daemon=True,
                         args=(tuple(cluster.endpoints), rate, config.warmup, config.duration, prefix, inbox, results))
    reader = FeedReader(address, prefix)
    try:
        writer.start()
        if (ready := _reply(writer, results, 60)) != "ready":
            raise RuntimeError(f"the paced writer failed to start:\n{ready}")
        start_at = time.time() + 0.2
        w0 = start_at + config.warmup
        reader.window = (int(w0 * 1e9), int((w0 + config.duration) * 1e9))
        reader.start()
        inbox.put(start_at)
        time.sleep(max(0.0, w0 - time.time()))
        meter = Meter(cluster.pids, learner_pid)
        time.sleep(max(0.0, w0 + config.duration - time.time()))
        cores = meter.read()
        writes = _reply(writer, results, REQUEST_TIMEOUT + 30)
        if isinstance(writes, str):
            raise RuntimeError(f"the paced writer failed:\n{writes}")
        writer_cores = writes.cpu_seconds / (config.warmup + config.duration)  # its average over the run
        cores = replace(cores, bench=cores.bench + writer_cores, other=max(0.0, cores.other - writer_cores))
        deadline = time.monotonic() + 10.0  # let the feed deliver what was acknowledged
        while len(reader.lags_ns) < writes.acked and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        reader.stop()
        if writer.is_alive():
            writer.terminate()
        writer.join()
    lags = sorted(x / 1e6 for x in reader.lags_ns)
    result = Lag(rate, writes.acked / config.duration, len(lags), max(0, writes.acked - len(lags)),
                 percentile(lags, 0.5), percentile(lags, 0.99), lags[-1] if lags else math.nan,
                 writes.put_p50_ms, writes.put_p99_ms, writes.skipped, writes.errors + reader.errors,
                 writes.first_error or reader.first_error, cores)
    console.print(
        f"[dim]feed lag {rate:>6,} writes/s: achieved {result.achieved:,.0f}/s, lag p50 {result.p50_ms:.1f} "
        f"p99 {result.p99_ms:.1f} max {result.max_ms:.1f} ms over {result.events:,} events "
        f"({result.missing} missing, {result.skipped} skipped, {result.errors} errors); put ack p50 "
        f"{result.put_p50_ms:.1f} p99 {result.put_p99_ms:.1f} ms; cores: {_cores_text(cores)}[/dim]"
    )
    return result
