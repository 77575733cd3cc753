"""raftkv dev up: a local cluster from one command."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click

from raftkv.cli.output import console, err_console
from raftkv.local_cluster import LocalCluster
from raftkv.cli.options import topology_options
from raftkv.spec import build_spec, load_spec, save_spec


def register(cli: click.Group) -> None:
    cli.add_command(dev)


@click.group()
def dev() -> None:
    """Local development clusters."""


@dev.command()
@topology_options
def up(nodes, partitions, replication, base_port, data_dir, durability) -> None:
    """Start a local N-node cluster (data in --data-dir) until Ctrl-C.

    An existing DATA_DIR/cluster.toml is reused, so data survives restarts.
    """
    spec_path = Path(data_dir) / "cluster.toml"
    if spec_path.exists():
        spec = load_spec(spec_path)
        console.print(f"reusing {spec_path} ({len(spec.nodes)} nodes, {spec.partitions} partitions)")
    else:
        spec = build_spec(nodes=nodes, partitions=partitions, replication=replication, base_port=base_port,
                          data_dir=data_dir, durability=durability)
        save_spec(spec, spec_path)
        console.print(f"wrote {spec_path}")
    cluster = LocalCluster(spec, spec_path)
    stop = []
    previous = signal.signal(signal.SIGINT, lambda *_: stop.append(True))
    signal.signal(signal.SIGTERM, lambda *_: stop.append(True))
    try:
        cluster.start_all()
        cluster.wait_ready(timeout=60)
        for n in spec.nodes:
            console.print(f"  {n.id}: api {n.api_address}  metrics http://{n.host}:{n.metrics_port}/metrics  "
                          f"log {cluster.log_path(n.id)}", soft_wrap=True)
        console.print(f"[bold green]ready[/]: try  raftkv put hello world --config {spec_path}   "
                      "(Ctrl-C stops the cluster)", soft_wrap=True)
        while not stop:
            if dead := cluster.exited():
                err_console.print(f"node(s) exited: {dead}; see their node.log; stopping")
                break
            time.sleep(0.2)
    finally:
        console.print("stopping nodes...")
        cluster.stop_all()
        signal.signal(signal.SIGINT, previous)
