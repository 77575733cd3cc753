"""Microbenchmark of gRPC front ends: raftkv's Execute method served by several servers, one load.

    .venv/bin/python scripts/bench_grpc_frontends.py                # every row, about 3.5 minutes on 2 cores
    .venv/bin/python scripts/bench_grpc_frontends.py --quick        # about 1 minute
    .venv/bin/python scripts/bench_grpc_frontends.py --only aio,aio-uvloop,grpclib --json-out fe.json

Question (issue 16): what does the server side of one gRPC call cost, and does another
front end serve raftkv's public gRPC API for less? A trivial call to a node costs about
a third of a sequential put.

Each front end serves the real method `/raftkv.v1.KV/Execute` (the generated
raftkv/api/kv_pb2*.py) in processes of its own on a free loopback port. The handler
does no work: it parses the ExecuteRequest and returns a fixed ExecuteResponse with
one Result (found, a 100-byte value) per op. No storage, no Raft. The front ends:

- `aio`, `aio-uvloop`: a `grpc.aio` server on asyncio's loop, and on uvloop's (a
  node runs on uvloop);
- `node`: the node's own API server (`raftkv.node.process.api_server`: its options
  and the `RejectMalformed` interceptor) on uvloop;
- `aio-latency`, `aio-throughput`: `grpc.aio` on uvloop with the channel argument
  `grpc.optimization_target`;
- `aio-uvloop-x2`: two `grpc.aio` processes on uvloop sharing the port through
  SO_REUSEPORT (gRPC's default on Linux); the kernel spreads the client connections;
- `threads-1`, `threads-4`, `threads-16`: grpcio's classic server,
  `grpc.server(ThreadPoolExecutor(n))`, with a plain (not async) handler;
- `grpclib`, `grpclib-uvloop`: grpclib, pure-Python HTTP/2 (h2) on asyncio, serving
  the same protobuf messages through a handler mapping (no grpclib codegen);
- `connect-hypercorn`: connect-python (`connectrpc`), which also speaks the gRPC
  protocol, as an ASGI app on hypercorn (pure-Python HTTP/2 with ASGI trailers) on uvloop.

grpclib, connectrpc and hypercorn are not raftkv dependencies. A row whose package
is missing is skipped with a line saying what to install (`pip install grpclib`;
`pip install connectrpc hypercorn`), for example into a throwaway directory:
`pip install --target /tmp/fe grpclib connectrpc hypercorn` and `PYTHONPATH=/tmp/fe`.
Not rows, and why: granian (Rust HTTP/2) offers ASGI and RSGI apps no HTTP trailers,
and gRPC ends every call with trailers (connectrpc refuses the gRPC protocol without
them); compression is already off (neither side sets grpc-encoding); grpc.experimental
has nothing for a server (its one channel option is for a sync client's unary-stream calls).

The client is the same for every row and is not what is compared: scripts/bench_load.py
with its `execute` driver, a grpc.aio stub with raftkv's client channel options on
asyncio's loop, one get (LEADER consistency) per Execute call, no coalescing.
Two loads per front end, back to back:

1. sequential: 1 process, 1 call in flight: p50 and p99 round trip;
2. concurrent: P processes x M calls in flight: calls/s and p99.

With each, the server processes' CPU (from /proc/PID/stat) in cores and in µs per
call, the client processes' cores, and the rest of the machine's (noise; figures
taken while it used more than NOISY_CORES are marked *). Clients and servers share
this machine's cores, so on 2 cores the concurrent calls/s is bounded by client
and server together: server µs per call is the figure to compare. Ratios are to
the first row measured (`aio` unless --only leaves it out). Benchmarks report;
they never assert timings.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import importlib.util
import json
import multiprocessing
import platform
import signal
import socket
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Awaitable, Callable, Iterator, NamedTuple

import grpc
import uvloop
from rich.console import Console
from rich.table import Table

from bench import NOISY_CORES
from bench_host import git_rev, machine, package_version
from bench_load import START_TIMEOUT, VALUE_BYTES, Figures, Load, run_load
from bench_run import config_arguments, configured
from raftkv.api import kv_pb2 as pb
from raftkv.api import kv_pb2_grpc
from raftkv.dev.local_cluster import free_port_block

HOST = "127.0.0.1"
EXECUTE = "/raftkv.v1.KV/Execute"
RESULT = pb.Result(found=True, value=bytes(VALUE_BYTES), applied_index=1)
LOADS = ("sequential", "concurrent")  # 1 call in flight; Config.processes x Config.in_flight


@dataclass(frozen=True)
class Config:
    processes: int = 4
    in_flight: int = 64
    duration: float = 5.0  # measured seconds per load
    warmup: float = 1.0


QUICK = Config(duration=1.5, warmup=0.5)


@dataclass(frozen=True)
class FrontEnd:
    key: str  # what --only takes
    label: str
    server: str  # a key of STARTERS, or "threads"
    loop: str = "uvloop"  # of an asyncio server: "asyncio" or "uvloop"
    options: tuple[tuple[str, object], ...] = ()  # gRPC channel arguments of a grpcio server
    workers: int = 0  # "threads": the pool's size
    processes: int = 1  # > 1: that many grpc.aio servers on the port (gRPC sets SO_REUSEPORT by default)
    requires: tuple[str, ...] = ()  # packages beyond raftkv's own


FRONT_ENDS = (
    FrontEnd("aio", "grpc.aio, asyncio", "aio", loop="asyncio"),
    FrontEnd("aio-uvloop", "grpc.aio, uvloop", "aio"),
    FrontEnd("node", "the node's grpc.aio server, uvloop", "node"),
    FrontEnd("aio-latency", "grpc.aio, uvloop, latency target", "aio",
             options=(("grpc.optimization_target", "latency"),)),
    FrontEnd("aio-throughput", "grpc.aio, uvloop, throughput target", "aio",
             options=(("grpc.optimization_target", "throughput"),)),
    FrontEnd("aio-uvloop-x2", "2 grpc.aio, uvloop, SO_REUSEPORT", "aio", processes=2),
    *(FrontEnd(f"threads-{n}", f"grpc.server, {n} thread{'s' * (n > 1)}", "threads", workers=n) for n in (1, 4, 16)),
    FrontEnd("grpclib", "grpclib, asyncio", "grpclib", loop="asyncio", requires=("grpclib",)),
    FrontEnd("grpclib-uvloop", "grpclib, uvloop", "grpclib", requires=("grpclib",)),
    FrontEnd("connect-hypercorn", "connectrpc/hypercorn, uvloop", "connect", requires=("connectrpc", "hypercorn")),
)


# -- the servers: each process serves until the parent terminates it ---------------------


@functools.cache
def reply(ops: int) -> pb.ExecuteResponse:
    """What every handler answers: RESULT for each op, no work done."""
    return pb.ExecuteResponse(results=[RESULT] * ops)


class FixedKV(kv_pb2_grpc.KVServicer):
    """Execute for grpcio's threaded server; the other methods are unimplemented."""

    def Execute(self, request: pb.ExecuteRequest, context) -> pb.ExecuteResponse:
        return reply(len(request.ops))


class AsyncFixedKV(kv_pb2_grpc.KVServicer):
    """The same for grpc.aio."""

    async def Execute(self, request: pb.ExecuteRequest, context) -> pb.ExecuteResponse:
        return reply(len(request.ops))


async def start_aio(front_end: FrontEnd, port: int) -> Awaitable:
    if front_end.server == "node":
        from raftkv.node.service import api_server

        server = api_server()
    else:
        server = grpc.aio.server(options=front_end.options)
    kv_pb2_grpc.add_KVServicer_to_server(AsyncFixedKV(), server)
    server.add_insecure_port(f"{HOST}:{port}")
    await server.start()
    return server.wait_for_termination()


async def start_grpclib(front_end: FrontEnd, port: int) -> Awaitable:
    from grpclib.const import Cardinality, Handler
    from grpclib.server import Server

    async def execute(stream) -> None:
        request = await stream.recv_message()
        await stream.send_message(reply(len(request.ops)))

    class Service:
        def __mapping__(self):
            return {EXECUTE: Handler(execute, Cardinality.UNARY_UNARY, pb.ExecuteRequest, pb.ExecuteResponse)}

    server = Server([Service()])
    await server.start(HOST, port)
    return server.wait_closed()


async def start_connect(front_end: FrontEnd, port: int) -> Awaitable:
    """The gRPC protocol of connectrpc's ASGI app (chosen by the request's content-type), on hypercorn.

    The listening socket is made here and handed to hypercorn (`fd://`), so it accepts before this returns.
    """
    from connectrpc.compat import google_protobuf_binary_codec
    from connectrpc.method import IdempotencyLevel, MethodInfo, StreamType
    from connectrpc.server import ConnectASGIApplication, Endpoint
    from hypercorn.asyncio import serve
    from hypercorn.config import Config as HypercornConfig

    method = MethodInfo(name="Execute", service_name="raftkv.v1.KV", input=pb.ExecuteRequest,
                        output=pb.ExecuteResponse, idempotency_level=IdempotencyLevel.UNKNOWN,
                        stream_type=StreamType.UNARY)

    async def execute(request: pb.ExecuteRequest, context) -> pb.ExecuteResponse:
        return reply(len(request.ops))

    class App(ConnectASGIApplication):
        path = "/raftkv.v1.KV"

    app = App(service=None, endpoints=lambda _: {EXECUTE: Endpoint.unary(method, execute)},
              codecs=[google_protobuf_binary_codec()], compressions=())
    config = HypercornConfig()
    config.bind = [f"fd://{socket.create_server((HOST, port)).detach()}"]
    config.accesslog = config.errorlog = None
    config.keep_alive_max_requests = sys.maxsize  # its default, 1000, ends a connection (GOAWAY) after that many
    return serve(app, config, shutdown_trigger=asyncio.get_running_loop().create_future)


STARTERS = {"aio": start_aio, "node": start_aio, "grpclib": start_grpclib, "connect": start_connect}


def serve(front_end: FrontEnd, port: int, ready) -> None:
    """One server process: listens on `port`, sets `ready`, serves until terminated."""
    if front_end.server == "threads":
        server = grpc.server(ThreadPoolExecutor(front_end.workers), options=front_end.options)
        kv_pb2_grpc.add_KVServicer_to_server(FixedKV(), server)
        server.add_insecure_port(f"{HOST}:{port}")
        server.start()
        ready.set()
        server.wait_for_termination()
    else:
        run = uvloop.run if front_end.loop == "uvloop" else asyncio.run
        run(_serve_async(front_end, port, ready))


async def _serve_async(front_end: FrontEnd, port: int, ready) -> None:
    running = await STARTERS[front_end.server](front_end, port)
    ready.set()
    await running


@contextmanager
def serving(front_end: FrontEnd) -> Iterator[tuple[str, tuple[int, ...]]]:
    """(address, server PIDs) of the front end's processes, listening; they are stopped on the way out."""
    port = free_port_block(1)
    ctx = multiprocessing.get_context("spawn")
    procs = []
    try:
        for _ in range(front_end.processes):
            ready = ctx.Event()
            proc = ctx.Process(target=serve, args=(front_end, port, ready), daemon=True)
            proc.start()
            procs.append(proc)
            deadline = time.monotonic() + START_TIMEOUT
            while not ready.wait(0.1):
                if not proc.is_alive() or time.monotonic() > deadline:
                    raise RuntimeError(f"{front_end.key}: the server did not start (exit code {proc.exitcode}; "
                                       "traceback above)")
        yield f"{HOST}:{port}", tuple(p.pid for p in procs)
    finally:
        for proc in procs:
            proc.terminate()
            proc.join()


# -- measuring ------------------------------------------------------------------------


def measure(front_end: FrontEnd, config: Config, console: Console) -> dict[str, Figures]:
    """{"sequential": ..., "concurrent": ...}: the two loads against the front end, back to back."""
    shapes = dict(zip(LOADS, ((1, 1), (config.processes, config.in_flight))))
    figures = {}
    with serving(front_end) as (address, pids):
        for name, (processes, in_flight) in shapes.items():
            load = Load("execute", (address,), "get", consistency="leader", processes=processes,
                        in_flight=in_flight, duration=config.duration, warmup=config.warmup)
            f = figures[name] = run_load(load, pids)
            console.print(
                f"[dim]{front_end.key:>18} {name:<10} {f.ops_per_s:>8,.0f} calls/s  p50 {f.p50_ms * 1e3:6.0f}  "
                f"p99 {f.p99_ms * 1e3:7.0f} µs  server {per_call(f.server_cpu, f):5.0f} µs/call  cores: "
                f"server {f.server_cpu:.2f}, client {f.client_cpu:.2f}, other {f.other_cpu:.2f}  errors {f.errors}"
                f"{' (first: ' + ' '.join(f.first_error.split()) + ')' if f.errors else ''}[/dim]"
            )
    return figures


def per_call(cores: float, f: Figures) -> float:
    """µs of CPU per call, from cores used and the call rate."""
    return cores / f.ops_per_s * 1e6 if f.ops_per_s else float("nan")


def missing(front_end: FrontEnd) -> list[str]:
    return [name for name in front_end.requires if importlib.util.find_spec(name) is None]


# -- the table ------------------------------------------------------------------------


class Column(NamedTuple):
    header: str
    load: str  # "sequential" or "concurrent"
    value: Callable[[Figures], float]
    ratio: bool = False  # with its ratio to the first row


COLUMNS = (
    Column("1 in flight: p50 µs", "sequential", lambda f: f.p50_ms * 1e3, ratio=True),
    Column("p99 µs", "sequential", lambda f: f.p99_ms * 1e3),
    Column("server µs/call", "sequential", lambda f: per_call(f.server_cpu, f), ratio=True),
    Column("{shape}: calls/s", "concurrent", lambda f: f.ops_per_s, ratio=True),
    Column("p99 µs", "concurrent", lambda f: f.p99_ms * 1e3),
    Column("server cores", "concurrent", lambda f: f.server_cpu),
    Column("server µs/call", "concurrent", lambda f: per_call(f.server_cpu, f), ratio=True),
    Column("client cores", "concurrent", lambda f: f.client_cpu),
)


def table(results: dict[FrontEnd, dict[str, Figures]], config: Config) -> Table:
    shape = f"{config.processes} x {config.in_flight} in flight"
    t = Table(title=f"gRPC front ends serving raftkv.KV/Execute (1 get per call, fixed reply), grpc.aio client; "
              f"{config.duration:g} s windows", title_justify="left", caption_justify="left",
              caption=f"(×) = ratio to the first row. errors: 1 in flight / {shape}. * = other processes used "
              f"more than {NOISY_CORES} cores meanwhile. Clients and servers share the machine's cores.")
    t.add_column("front end")
    for column in COLUMNS:
        t.add_column(column.header.format(shape=shape), justify="right")
    t.add_column("errors", justify="right")
    base = next(iter(results.values()), {})
    for front_end, figures in results.items():
        errors = " / ".join(str(figures[load].errors) for load in LOADS)
        t.add_row(front_end.label, *(_cell(column, figures, base) for column in COLUMNS),
                  f"[red]{errors}[/red]" if any(f.errors for f in figures.values()) else errors)
    return t


def _cell(column: Column, figures: dict[str, Figures], base: dict[str, Figures]) -> str:
    f = figures[column.load]
    value, first = column.value(f), column.value(base[column.load])
    text = f"{value:,.0f}" if value >= 10 else f"{value:.2f}"
    if column.ratio:
        text += f" ({value / first:.2f}×)" if first else " (n/a)"
    return text + (" *" if f.other_cpu > NOISY_CORES else "  ")


def as_json(results: dict[FrontEnd, dict[str, Figures]]) -> list[dict]:
    return [{**asdict(front_end), **{load: {**asdict(f), "server_us_per_call": per_call(f.server_cpu, f),
                                            "client_us_per_call": per_call(f.client_cpu, f)}
                                     for load, f in figures.items()}}
            for front_end, figures in results.items()]


# -- main -----------------------------------------------------------------------------


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    config_arguments(p, Config(), QUICK, "short windows")
    p.add_argument("--only", type=front_ends, default=FRONT_ENDS, help="comma-separated front ends (run in "
                   "the table's order): " + ", ".join(f.key for f in FRONT_ENDS))
    p.add_argument("--json-out", type=Path, help="also write every figure to this JSON file")
    return p.parse_args(argv)


def front_ends(text: str) -> tuple[FrontEnd, ...]:
    keys = text.split(",")
    if unknown := set(keys) - {f.key for f in FRONT_ENDS}:
        raise argparse.ArgumentTypeError(f"unknown front ends: {', '.join(sorted(unknown))}")
    return tuple(f for f in FRONT_ENDS if f.key in keys)


def versions() -> dict[str, str]:
    names = ("grpcio", "protobuf", "uvloop", "grpclib", "h2", "connectrpc", "hypercorn")
    return {"python": platform.python_version(), "raftkv": git_rev(), **{n: package_version(n) for n in names}}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = configured(args, Config(), QUICK)
    signal.signal(signal.SIGTERM, signal.default_int_handler)  # every started process is stopped on the way out
    console = Console() if sys.stdout.isatty() else Console(width=190)
    host, vers = machine(Path(tempfile.gettempdir())), versions()
    console.print(f"[bold]machine[/bold]  {host['nproc']} cores, {host['cpu']}, kernel {host['kernel']}, "
                  f"load average before the run {host['load_average']}")
    console.print("[bold]versions[/bold] " + ", ".join(f"{k} {v}" for k, v in vers.items()))
    console.print("[bold]config[/bold]   " + ", ".join(f"{k}={v}" for k, v in asdict(config).items()))
    started = time.monotonic()
    results, skipped = {}, {}
    try:
        for front_end in args.only:
            if absent := missing(front_end):
                skipped[front_end.key] = f"pip install {' '.join(absent)}"
                console.print(f"[yellow]{front_end.key}: skipped, {', '.join(absent)} not installed "
                              f"({skipped[front_end.key]})[/yellow]")
                continue
            results[front_end] = measure(front_end, config, console)
    except KeyboardInterrupt:
        console.print("[red]interrupted; every started process has been stopped[/red]")
        return 130
    console.print(table(results, config))
    elapsed = time.monotonic() - started
    console.print(f"Total time {elapsed:.0f} s.")
    if args.json_out:
        report = {"machine": host, "versions": vers, "config": asdict(config), "elapsed_s": elapsed,
                  "rows": as_json(results), "skipped": skipped}
        args.json_out.write_text(json.dumps(report, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
