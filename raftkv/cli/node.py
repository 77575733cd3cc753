"""raftkv node start | list | decommission."""

from __future__ import annotations

import faulthandler
import json
import logging
import signal
from pathlib import Path

import click
from rich.table import Table

from raftkv import failpoints
from raftkv.cli.options import config_option, endpoints_option, json_option, open_client, tls_files
from raftkv.cli.output import console, err_console, progress_bars
from raftkv.cli.replica import wait_for
from raftkv.core import event_loop
from raftkv.core.errors import ConfigError
from raftkv.core.spec_toml import load_spec
from raftkv.node import process as node_process
from raftkv.meta.records import group_name
from raftkv.node.join import current_topology, join, joined_before
from raftkv.security.tls import node_tls


@click.group()
def node() -> None:
    """Run node processes and list the cluster's nodes."""


@node.command()
@click.option("--config", "-c", "config", type=click.Path(dir_okay=False), default=None,
              help="Cluster spec (TOML); default raftkv-data/cluster.toml, or the one in --data-dir of a node "
                   "that joined.")
@click.option("--node", "node_id", required=True, help="This node's id (e.g. n1); a new id with --join.")
@click.option("--join", "seed", default=None, metavar="HOST:PORT",
              help="Join a running cluster through any of its nodes (needs --base-port and --data-dir; with TLS, "
                   "this node's certificate as `raftkv --cacert --cert --key node start ...`, or the same files "
                   "the cluster's spec names). With --config, for a node of the spec whose data is gone: the "
                   "member it learns the cluster's current members from.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --join: the address others reach it at.")
@click.option("--base-port", type=click.IntRange(1024, 65000), default=None,
              help="With --join: API port; metrics, then one Raft port per partition and the metadata's follow.")
@click.option("--data-dir", type=click.Path(file_okay=False), default=None, help="With --join: where its data goes.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True)
def start(config: str | None, node_id: str, seed: str | None, host: str, base_port: int | None,
          data_dir: str | None, log_level: str) -> None:
    """Run one node until SIGTERM or Ctrl-C (or until it is decommissioned)."""
    initial = None
    joined = joined_before(Path(data_dir)) if data_dir else None
    if joined is not None:  # a node that joined earlier restarts from what it was told
        spec, initial = joined
    elif seed is not None and config is None:  # a new node
        if base_port is None or data_dir is None:
            raise ConfigError("--join needs --base-port and --data-dir", source="node start")
        spec, initial = join(seed, node_id, host, base_port, Path(data_dir), tls_files(None))
        console.print(f"joined the cluster as {node_id}; restart it with: raftkv node start --node {node_id} "
                      f"--data-dir {data_dir}")
    else:
        spec = load_spec(config or "raftkv-data/cluster.toml")
        if seed is not None:  # its data is gone, and the members the spec names may be too
            initial = current_topology(seed, node_id, node_tls(spec, node_id))
    spec.node(node_id)
    logging.basicConfig(level=log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    failpoints.arm_from_environment()
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 PID`: every thread's stack, on stderr
    event_loop.run(node_process.serve(spec, node_id, initial))


@node.command()
@config_option
@endpoints_option
@click.argument("node_id")
@click.option("--force", is_flag=True, help="Even if fewer nodes than the replication factor would remain.")
@click.option("--wait/--no-wait", default=True, show_default=True, help="Wait until the node is removed.")
@click.option("--timeout", type=click.FloatRange(min=1), default=1800, show_default=True)
def decommission(config: str, endpoints: str | None, node_id: str, force: bool, wait: bool, timeout: float) -> None:
    """Move every replica and leadership off NODE_ID, then remove it; its process exits."""
    with open_client(config, endpoints, timeout=15.0) as kv:
        if force:
            err_console.print(f"warning: --force: partitions may be left with fewer replicas than the "
                              f"replication factor once {node_id!r} is gone", soft_wrap=True)
        replicas = len(kv.decommission(node_id, force).meta.voter_partitions(node_id))
        console.print(f"{node_id} is draining: {replicas} replicas to move")
        if wait:
            with progress_bars(None, counts=True) as bars:
                bar = bars.add(f"{node_id}: replicas moved", total=replicas)

                def left(meta) -> str:
                    bar.at(replicas - len(meta.voter_partitions(node_id)))
                    return f"{node_id}: {len(meta.voter_partitions(node_id))} replicas left to move"

                wait_for(kv, lambda meta: meta.node(node_id).state.value == "removed", timeout, left, quiet=True)
    console.print(f"{node_id} is removed from the cluster")


@node.command("list")
@config_option
@endpoints_option
@json_option
def list_nodes(config: str, endpoints: str | None, as_json: bool) -> None:
    """The cluster's nodes as its metadata records them: state, replicas, and the moves under way."""
    with open_client(config, endpoints, timeout=10.0) as kv:
        topology = kv.topology()
    meta = topology.meta
    rows = [{"id": n.id, "api_address": n.api_address, "state": n.state.value, "replicas": len(meta.voter_partitions(n.id)),
             "meta_voter": n.id in meta.meta_voters, "meta_leader": n.id == topology.meta_leader} for n in meta.nodes]
    moves = [{"group": m.group, "from": m.source, "to": m.target, "step": m.step.value} for m in meta.moves]
    if as_json:
        console.print_json(json.dumps({"epoch": meta.epoch, "nodes": rows, "moves": moves}))
        return
    table = Table(title=f"raftkv nodes (metadata epoch {meta.epoch})")
    for column in ("node", "address", "state", "replicas", ""):
        table.add_column(column, justify="right" if column == "replicas" else "left")
    for r in rows:
        table.add_row(r["id"], r["api_address"], r["state"], str(r["replicas"]),
                      "metadata leader" if r["meta_leader"] else "metadata voter" if r["meta_voter"] else "")
    console.print(table)
    for m in moves:
        console.print(f"moving {group_name(m['group'])}: {m['from'] or '-'} -> {m['to'] or '-'} ({m['step']})")
