"""raftkv dev up: a local cluster from one command."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click
from rich.text import Text

from raftkv.cli.output import console, err_console
from raftkv.client.sync_client import Client
from raftkv.dev.local_cluster import LocalCluster, port_free
from raftkv.dev.local_feed import LocalFeed
from raftkv.dev.supervision import RESTART_LIMIT, RESTART_WINDOW, Verdict, after_exit, demo_ports
from raftkv.cli.options import DEFAULT_CONFIG, topology_options
from raftkv.core.errors import ConfigError, RaftKVError
from raftkv.core.spec import build_spec
from raftkv.core.spec_toml import load_spec, save_spec
from raftkv.meta.records import NodeState
from raftkv.security.certs import with_certificates


@click.group()
def dev() -> None:
    """Local development clusters."""


DEMO_LEARNER = "feed"
DEMO_TOPIC = "raftkv-feed"


@dev.command()
@topology_options
@click.option("--learner/--no-learner", default=True, show_default=True,
              help="Also run an embedded Kafka-protocol broker (tansu) and a learner feeding it.")
def up(nodes, partitions, replication, base_port, data_dir, durability, tls, learner) -> None:
    """Start a local N-node cluster (data in --data-dir) until Ctrl-C.

    An existing DATA_DIR/cluster.toml is reused, so data survives restarts. With
    --learner (the default) a tansu broker and a Kafka learner run beside it:
    `raftkv feed tail` shows every change. A node that exits is started again,
    unless it was decommissioned; everything started here stops with it, also
    when its terminal closes or it is killed.
    """
    spec_path = Path(data_dir) / "cluster.toml"
    if spec_path.exists():
        spec = load_spec(spec_path)
        console.print(f"reusing {spec_path} ({len(spec.nodes)} nodes, {spec.partitions} partitions)")
    else:
        spec = build_spec(nodes=nodes, partitions=partitions, replication=replication, base_port=base_port,
                          data_dir=data_dir, durability=durability)
        if tls:
            spec = with_certificates(spec, spec_path.parent.resolve())
        spec = load_spec(save_spec(spec, spec_path))  # with its path: the learner finds its folder beside it
        console.print(f"wrote {spec_path}")
    broker_port = _broker_port(spec) if learner else None
    for port, whose in demo_ports(spec, broker_port):
        if not port_free(port):
            raise ConfigError(f"port {port} ({whose}) is in use: is another `raftkv dev up` running? Stop it, or "
                              "give this one another --data-dir and --base-port", source="dev up")
    cluster = LocalCluster(spec, spec_path, die_with_parent=True)
    feed = None
    stop = []
    # a closed terminal sends SIGHUP: everything started here is stopped as on Ctrl-C
    previous = {sig: signal.signal(sig, lambda *_: stop.append(True))
                for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)}
    keeper = _NodeKeeper(cluster)

    def tend_or_stop() -> None:  # while it starts: Ctrl-C (or SIGTERM, SIGHUP) is heard at once
        if stop:
            raise click.exceptions.Abort()
        keeper.tend()

    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60, tend=tend_or_stop)
        scheme = "https" if spec.tls is not None and spec.tls.metrics else "http"
        for n in spec.nodes:
            if n.id in cluster.procs:
                console.print(f"  {n.id}: api {n.api_address}  console {scheme}://{n.host}:{n.metrics_port}/  "
                              f"metrics .../metrics  log {cluster.log_path(n.id)}", soft_wrap=True)
        if learner:
            feed = _start_feed(spec, broker_port)
        keeper.tend()  # a node that exited while the feed started is dealt with before `ready`
        console.print(Text.assemble(("ready", "bold green"), f": try  raftkv put hello world --config {spec_path}   "
                                    "(Ctrl-C stops the cluster)"), soft_wrap=True)
        while not stop:
            keeper.tend()
            if feed is not None and feed.learner.poll() is not None:
                err_console.print(f"the learner exited ({feed.learner.returncode}); see {feed.log_path}; stopping")
                break
            if feed is not None and feed.broker.proc.poll() is not None:
                err_console.print(f"the Kafka broker exited ({feed.broker.proc.returncode}); see "
                                  f"{feed.broker.log_path}; stopping")
                break
            time.sleep(0.2)
    finally:
        try:
            console.print("stopping...")
        finally:  # rich exits (SystemExit) when stdout is gone: a `| tee` that Ctrl-C stopped first
            if feed is not None:
                feed.stop()
            cluster.stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)


class _NodeKeeper:
    """Acts on dev up's nodes that exited: a decommissioned one leaves the demo, a crashed one is started
    again (supervision.after_exit decides)."""

    def __init__(self, cluster: LocalCluster):
        self.cluster = cluster
        self.restarts: dict[str, list[float]] = {}

    def tend(self) -> None:
        for node_id, code in self.cluster.exited().items():
            verdict = after_exit(_recorded_state(self.cluster, node_id), self.restarts.get(node_id, ()),
                                 time.monotonic())
            log = self.cluster.log_path(node_id)
            if verdict is Verdict.LEFT:
                self.cluster.forget(node_id)
                console.print(f"{node_id} was decommissioned: it is out of the demo (its data stays in "
                              f"{self.cluster.spec.node(node_id).data_dir})", soft_wrap=True)
            elif verdict is Verdict.RESTART:
                err_console.print(f"{node_id} exited ({code}) and is still a member of the cluster: restarting it; "
                                  f"see {log}", soft_wrap=True)
                self.restarts.setdefault(node_id, []).append(time.monotonic())
                self.cluster.start(node_id)
            else:
                self.cluster.forget(node_id)
                err_console.print(f"{node_id} exited ({code}) {RESTART_LIMIT} times within {RESTART_WINDOW:.0f}s: "
                                  f"left down; see {log}", soft_wrap=True)


def _recorded_state(cluster: LocalCluster, node_id: str, timeout: float = 10.0) -> NodeState | None:
    """`node_id`'s state in the cluster's metadata, as the other nodes tell it (they may be starting up
    too); None if none of them answers in time. A decommissioned node exits once its removal is
    committed, so a node that says `draining` still is asked again until the deadline."""
    others = [n.api_address for n in cluster.spec.nodes if n.id != node_id and n.id in cluster.procs]
    deadline = time.monotonic() + timeout
    state = None
    with Client(others or cluster.endpoints, timeout=2.0, tls=cluster.tls) as kv:
        while time.monotonic() < deadline:
            try:
                meta = kv.topology().meta
            except RaftKVError:
                time.sleep(0.2)
                continue
            state = meta.node(node_id).state if meta.has_node(node_id) else None
            if state != NodeState.DRAINING:
                return state
            time.sleep(0.2)
    return state


def _broker_port(spec) -> int:
    """The port after the nodes' blocks."""
    return max(n.meta_port(spec.partitions) for n in spec.nodes) + 1


def _config_flag(spec) -> str:
    """` --config PATH` unless the spec is where every command looks by default."""
    return "" if spec.path.resolve() == Path(DEFAULT_CONFIG).resolve() else f" --config {spec.path}"


def _start_feed(spec, broker_port: int) -> LocalFeed:
    """A tansu broker and the `feed` learner writing to it."""
    feed = LocalFeed(spec, DEMO_LEARNER, DEMO_TOPIC, broker_port=broker_port, die_with_parent=True).start()
    console.print(f"  learner {DEMO_LEARNER}: kafka topic {DEMO_TOPIC} on {feed.bootstrap}  log {feed.log_path}\n"
                  f"  watch the feed:  raftkv feed tail --from-beginning{_config_flag(spec)}", soft_wrap=True)
    return feed
