"""raftkv dev up: a local cluster from one command."""

from __future__ import annotations

import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click

from learners.learner_process import learner_folder
from raftkv.cli.output import console, err_console
from raftkv.client import Client
from raftkv.dev_broker import TansuBroker
from raftkv.local_cluster import LocalCluster
from raftkv.cli.options import topology_options
from raftkv.spec import build_spec, load_spec, save_spec


def register(cli: click.Group) -> None:
    cli.add_command(dev)


@click.group()
def dev() -> None:
    """Local development clusters."""


DEMO_LEARNER = "feed"
DEMO_TOPIC = "raftkv-feed"


@dev.command()
@topology_options
@click.option("--learner/--no-learner", default=True, show_default=True,
              help="Also run an embedded Kafka-protocol broker (tansu) and a learner feeding it.")
def up(nodes, partitions, replication, base_port, data_dir, durability, learner) -> None:
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
        save_spec(spec, spec_path)
        console.print(f"wrote {spec_path}")
    cluster = LocalCluster(spec, spec_path)
    broker = feed = None
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
            broker, feed = _start_feed(spec, spec_path)
        console.print(f"[bold green]ready[/]: try  raftkv put hello world --config {spec_path}   "
                      "(Ctrl-C stops the cluster)", soft_wrap=True)
        while not stop:
            if dead := cluster.exited():
                err_console.print(f"node(s) exited: {dead}; see their node.log; stopping")
                break
            if feed is not None and feed.poll() is not None:
                err_console.print(f"the learner exited ({feed.returncode}); see {_learner_log(spec)}; stopping")
                break
            time.sleep(0.2)
    finally:
        console.print("stopping...")
        if feed is not None and feed.poll() is None:
            feed.terminate()
            feed.wait(15)
        if broker is not None:
            broker.stop()
        cluster.stop_all()
        signal.signal(signal.SIGINT, previous)


def _learner_log(spec) -> Path:
    return learner_folder(spec, DEMO_LEARNER).parent / f"{DEMO_LEARNER}.log"


def _start_feed(spec, spec_path: Path) -> tuple[TansuBroker, subprocess.Popen]:
    """A tansu broker on the port after the nodes' blocks, and the `feed` learner writing to it."""
    broker = TansuBroker(port=max(n.raft_port_base + spec.partitions for n in spec.nodes)).start()
    # tansu keeps topics in memory: start the learner afresh so the new broker gets the whole feed
    shutil.rmtree(learner_folder(spec, DEMO_LEARNER), ignore_errors=True)
    with Client([n.api_address for n in spec.nodes]) as kv:
        kv.register_learner(DEMO_LEARNER, "kafka", {"bootstrap.servers": broker.bootstrap, "topic": DEMO_TOPIC})
    log = _learner_log(spec)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "ab") as out:
        feed = subprocess.Popen([sys.executable, "-m", "raftkv", "learner", "start", "--name", DEMO_LEARNER,
                                 "--config", str(spec_path)], stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    console.print(f"  learner {DEMO_LEARNER}: kafka topic {DEMO_TOPIC} on {broker.bootstrap}  log {log}\n"
                  f"  watch the feed:  raftkv feed tail --bootstrap {broker.bootstrap} --topic {DEMO_TOPIC} "
                  "--from-beginning", soft_wrap=True)
    return broker, feed
