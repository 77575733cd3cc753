"""raftkv status."""

from __future__ import annotations

import json

import click
from rich.table import Table
from rich.text import Text

from raftkv.cli.options import config_option, endpoints_option, json_option, open_client
from raftkv.cli.output import console
from raftkv.client.sync_client import NodeStatus


def status_rows(statuses: list[NodeStatus]) -> list[dict]:
    rows = []
    for s in statuses:
        for ps in s.partitions:
            rows.append({
                "partition": ps.partition, "node": s.node_id, "role": ps.role, "leader": ps.leader or None,
                "term": ps.term, "commit_index": ps.commit_index, "applied_index": ps.applied_index,
                "last_log_index": ps.last_log_index, "replicas": list(ps.replicas), "members": list(ps.members),
                "has_quorum": ps.has_quorum,
            })
    return sorted(rows, key=lambda r: (r["partition"], r["node"]))


@click.command()
@config_option
@endpoints_option
@json_option
def status(config: str, endpoints: str | None, as_json: bool) -> None:
    """Partitions, leaders, terms, commit/applied indexes and replicas, as each node sees them (with --json
    also each replica's Raft members), each node's release, and the cluster version (the lowest release
    every member runs)."""
    with open_client(config, endpoints, timeout=5.0) as kv:
        statuses = kv.status()
        cluster_version = kv.topology().meta.cluster_version if any(s.reachable for s in statuses) else None
    rows = status_rows(statuses)
    down = [{"node": s.node_id, "address": s.address, "error": s.error} for s in statuses if not s.reachable]
    nodes = [{"node": s.node_id, "address": s.address, "version": s.version or None} for s in statuses if s.reachable]
    if as_json:
        console.print_json(json.dumps({"partitions": rows, "nodes": nodes, "unreachable": down,
                                       "cluster_version": cluster_version}))
        return
    table = Table(title="raftkv partitions")
    for column in ("partition", "node", "role", "leader", "term", "commit", "applied", "replicas"):
        table.add_column(column, justify="right" if column in ("partition", "term", "commit", "applied") else "left")
    for r in rows:
        role = Text(r["role"], style="bold green") if r["role"] == "leader" else r["role"]
        table.add_row(str(r["partition"]), r["node"], role, r["leader"] or "-", str(r["term"]),
                      str(r["commit_index"]), str(r["applied_index"]), ",".join(r["replicas"]))
    console.print(table)
    releases = ", ".join(f"{n['node']} {n['version'] or 'unknown'}" for n in sorted(nodes, key=lambda n: n["node"]))
    console.print(f"releases: {releases}; cluster version {cluster_version or 'unknown'}")
    for d in down:
        console.print(Text.assemble(("unreachable", "red"), f": {d['node']} at {d['address']} ({d['error']})"))
