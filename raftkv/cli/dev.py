"""raftkv dev up: a local cluster from one command."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click
from rich.text import Text

from raftkv.cli.output import console, err_console
from raftkv.dev.local_cluster import LocalCluster
from raftkv.dev.local_feed import LocalFeed
from raftkv.cli.options import DEFAULT_CONFIG, topology_options
from raftkv.core.spec import build_spec, load_spec, save_spec
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
    `raftkv feed tail` shows every change.
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
    cluster = LocalCluster(spec, spec_path)
    feed = None
    stop = []
    previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        for n in spec.nodes:
            console.print(f"  {n.id}: api {n.api_address}  metrics http://{n.host}:{n.metrics_port}/metrics  "
                          f"log {cluster.log_path(n.id)}", soft_wrap=True)
        if learner:
            feed = _start_feed(spec)
        console.print(Text.assemble(("ready", "bold green"), f": try  raftkv put hello world --config {spec_path}   "
                                    "(Ctrl-C stops the cluster)"), soft_wrap=True)
        while not stop:
            if dead := cluster.exited():
                err_console.print(f"node(s) exited: {dead}; see their node.log; stopping")
                break
            if feed is not None and feed.learner.poll() is not None:
                err_console.print(f"the learner exited ({feed.learner.returncode}); see {feed.log_path}; stopping")
                break
            time.sleep(0.2)
    finally:
        try:
            console.print("stopping...")
        finally:  # rich exits (SystemExit) when stdout is gone: a `| tee` that Ctrl-C stopped first
            if feed is not None:
                feed.stop()
            cluster.stop_all()
            signal.signal(signal.SIGINT, previous)


def _config_flag(spec) -> str:
    """` --config PATH` unless the spec is where every command looks by default."""
    return "" if spec.path.resolve() == Path(DEFAULT_CONFIG).resolve() else f" --config {spec.path}"


def _start_feed(spec) -> LocalFeed:
    """A tansu broker on the port after the nodes' blocks, and the `feed` learner writing to it."""
    feed = LocalFeed(spec, DEMO_LEARNER, DEMO_TOPIC,
                     broker_port=max(n.meta_port(spec.partitions) for n in spec.nodes) + 1).start()
    console.print(f"  learner {DEMO_LEARNER}: kafka topic {DEMO_TOPIC} on {feed.bootstrap}  log {feed.log_path}\n"
                  f"  watch the feed:  raftkv feed tail --from-beginning{_config_flag(spec)}", soft_wrap=True)
    return feed
