"""bench_learner.py, part 2: the change feed's lag behind paced writes (raftkv), and an etcd watch's
behind the same writes (etcd 3.4): the same paced writer, a reader of each system's own feed."""

from __future__ import annotations

import asyncio
import contextlib
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
from bench_clusters import Running, etcd_cluster  # noqa: E402
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
    put_ms: list[float]  # each acknowledged put's latency
    cpu_seconds: float  # the writer processes, over their whole run


def _merged(writes: list[Writes]) -> Writes:
    return Writes(sum(w.sent for w in writes), sum(w.acked for w in writes), sum(w.skipped for w in writes),
                  sum(w.errors for w in writes), next((w.first_error for w in writes if w.first_error), ""),
                  sorted(x for w in writes for x in w.put_ms), sum(w.cpu_seconds for w in writes))


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
    writers: int = 1  # writer processes, each pacing rate / writers


def _writer_child(system, endpoints, rate, writer, writers, warmup, duration, prefix, inbox, results) -> None:
    try:
        results.put(asyncio.run(_paced_puts(system, endpoints, rate, writer, writers, warmup, duration, prefix, inbox,
                                            results)))
    except BaseException:
        results.put(traceback.format_exc())


@contextlib.asynccontextmanager
async def _putter(system: str, endpoints: tuple[str, ...]):
    """`put(key, value)` on `system`: raftkv's client, or etcd3aio round-robin over the members."""
    if system == "raftkv":
        async with raftkv.AsyncClient(list(endpoints), timeout=REQUEST_TIMEOUT) as kv:
            await kv.partitions()
            yield kv.put
    else:
        from etcd3aio import Etcd3Client

        async with Etcd3Client(list(endpoints)) as client:
            yield lambda key, value: client.kv.put(key, value, timeout=REQUEST_TIMEOUT)


async def _paced_puts(system: str, endpoints, rate: float, writer: int, writers: int, warmup: float, duration: float,
                      prefix: bytes, inbox, results) -> Writes:
    """Send `rate` puts a second from `start_at` (from the inbox), each on its own, many in flight: writer
    `writer` of `writers`, whose keys are the i-th of every `writers`."""
    pad = b"x" * (VALUE_BYTES - 20)
    latencies = array("d")
    counts = {"sent": 0, "acked": 0, "skipped": 0, "errors": 0}
    first_error = ""
    async with _putter(system, endpoints) as send:
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
                await send(prefix + b"%011d" % (i * writers + writer), b"%020d" % sent + pad)
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
    return Writes(counts["sent"], counts["acked"], counts["skipped"], counts["errors"], first_error, list(latencies),
                  cpu)


class _Reader(threading.Thread):
    """Keeps, for changes whose key starts with `prefix` and whose send time (the value's first 20
    digits) is in `window` (ns), the time it got them minus that send time."""

    def __init__(self, prefix: bytes):
        super().__init__(name="feed-reader", daemon=True)
        self._prefix = prefix
        self.window = (0, 0)
        self.lags_ns = array("q")
        self.errors, self.first_error = 0, ""

    def ready(self, timeout: float) -> bool:
        """Whether it reads by now (waiting up to `timeout` s): writes before that would go unseen."""
        return True

    def _got(self, key: bytes, value: bytes, at: int) -> None:
        if key.startswith(self._prefix):
            sent = int(value[:20])
            w0, w1 = self.window
            if w0 <= sent < w1:
                self.lags_ns.append(at - sent)


class FeedReader(_Reader):
    """Follows the changelog (`ChangeLog.Follow`: pushed after each synced flush of the learner's sink)."""

    def __init__(self, address: str, prefix: bytes):
        super().__init__(prefix)
        self._log = ChangeLogClient(address)

    def stop(self) -> None:
        self._log.close()  # ends the Follow call
        if self.is_alive():
            self.join(10)

    def run(self) -> None:
        try:
            for chunk in self._log.follow():
                got = time.time_ns()
                for change in chunk.changes:
                    if change.HasField("after"):
                        self._got(change.key, change.after, got)
        except Unavailable as exc:
            self.errors += 1
            self.first_error = str(exc)


class EtcdWatchReader(_Reader):
    """An etcd watch on the prefix (etcd3aio, on a loop of its own), at one member."""

    def __init__(self, endpoint: str, prefix: bytes):
        super().__init__(prefix)
        self._endpoint = endpoint
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._watching = threading.Event()

    def ready(self, timeout: float) -> bool:
        return self._watching.wait(timeout)

    def stop(self) -> None:
        if self._loop is not None and self._task is not None:
            self._loop.call_soon_threadsafe(self._task.cancel)
        if self.is_alive():
            self.join(10)

    def run(self) -> None:
        asyncio.run(self._follow())

    async def _follow(self) -> None:
        from etcd3aio import Etcd3Client
        from etcd3aio.kv import prefix_range_end

        self._loop, self._task = asyncio.get_running_loop(), asyncio.current_task()
        try:
            async with Etcd3Client([self._endpoint]) as client:
                async for response in client.watch.watch(self._prefix, prefix_range_end(self._prefix)):
                    got = time.time_ns()
                    self._watching.set()  # the first response confirms the watch's creation
                    for event in response.events:
                        self._got(event.kv.key, event.kv.value, got)
        except asyncio.CancelledError:
            pass
        except Exception as exc:  # counted and reported: a benchmark reports what it saw
            self.errors += 1
            self.first_error = f"{type(exc).__name__}: {exc}"
            self._watching.set()


def feed_lag(cluster: Running, learner_pid: int, address: str, rate: int, run: int, config: Config,
             console: Console) -> Lag:
    """One paced run at `rate` writes/s on raftkv, read from the learner's changelog."""
    prefix = b"lag%d/" % run
    return _paced_run("raftkv", cluster, learner_pid, FeedReader(address, prefix), prefix, rate, config,
                      console, "feed lag")


def etcd_watch_lags(binary: str, data_dir: Path, config: Config, console: Console) -> list[Lag]:
    """The same paced runs on a 3-member etcd cluster of its own, read by a watch on the prefix."""
    with etcd_cluster(binary, data_dir) as etcd:
        lags = []
        for run, rate in enumerate(config.rate_list):
            prefix = b"lag%d/" % run
            reader = EtcdWatchReader(etcd.endpoints[0], prefix)
            lags.append(_paced_run("etcd", etcd, None, reader, prefix, rate, config, console, "etcd watch lag"))
        return lags


def _paced_run(system: str, cluster: Running, learner_pid: int | None, reader: _Reader, prefix: bytes, rate: int,
               config: Config, console: Console, name: str) -> Lag:
    """Keys `prefix` + 11 digits (16 bytes), each written once, at `rate` writes/s; lag as `reader` sees it.

    The writes come from one process per `config.writer_rate` writes/s (one etcd3aio process saturates its
    core near 4,000 puts/s, and then its own queue is what a put waits for), each with a client of its own."""
    ctx = multiprocessing.get_context("spawn")
    count = max(1, math.ceil(rate / config.writer_rate))
    queues = [(ctx.Queue(), ctx.Queue()) for _ in range(count)]
    writers = [ctx.Process(target=_writer_child, daemon=True, args=(
        system, tuple(cluster.endpoints), rate / count, w, count, config.warmup, config.duration, prefix, inbox,
        results)) for w, (inbox, results) in enumerate(queues)]
    try:
        for writer in writers:
            writer.start()
        for writer, (_, results) in zip(writers, queues):
            if (ready := _reply(writer, results, 60)) != "ready":
                raise RuntimeError(f"a paced writer failed to start:\n{ready}")
        start_at = time.time() + 0.2
        w0 = start_at + config.warmup
        reader.window = (int(w0 * 1e9), int((w0 + config.duration) * 1e9))
        reader.start()
        if not reader.ready(10.0):
            raise RuntimeError(f"the {system} reader did not start within 10 s")
        for inbox, _ in queues:
            inbox.put(start_at)
        time.sleep(max(0.0, w0 - time.time()))
        meter = Meter(cluster.pids, learner_pid)
        time.sleep(max(0.0, w0 + config.duration - time.time()))
        cores = meter.read()
        replies = [_reply(writer, results, REQUEST_TIMEOUT + 30) for writer, (_, results) in zip(writers, queues)]
        if failed := [reply for reply in replies if isinstance(reply, str)]:
            raise RuntimeError(f"a paced writer failed:\n{failed[0]}")
        writes = _merged(replies)
        writer_cores = writes.cpu_seconds / (config.warmup + config.duration)  # their average over the run
        cores = replace(cores, bench=cores.bench + writer_cores, other=max(0.0, cores.other - writer_cores))
        deadline = time.monotonic() + 10.0  # let the feed deliver what was acknowledged
        while len(reader.lags_ns) < writes.acked and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        reader.stop()
        for writer in writers:
            if writer.is_alive():
                writer.terminate()
            writer.join()
    lags = sorted(x / 1e6 for x in reader.lags_ns)
    result = Lag(rate, writes.acked / config.duration, len(lags), max(0, writes.acked - len(lags)),
                 percentile(lags, 0.5), percentile(lags, 0.99), lags[-1] if lags else math.nan,
                 percentile(writes.put_ms, 0.5), percentile(writes.put_ms, 0.99), writes.skipped,
                 writes.errors + reader.errors, writes.first_error or reader.first_error, cores, count)
    console.print(
        f"[dim]{name} {rate:>6,} writes/s: achieved {result.achieved:,.0f}/s, lag p50 {result.p50_ms:.1f} "
        f"p99 {result.p99_ms:.1f} max {result.max_ms:.1f} ms over {result.events:,} events "
        f"({result.missing} missing, {result.skipped} skipped, {result.errors} errors; {count} writer processes); "
        f"put ack p50 {result.put_p50_ms:.1f} p99 {result.put_p99_ms:.1f} ms; cores: {_cores_text(cores)}[/dim]"
    )
    return result
