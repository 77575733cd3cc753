"""Options shared by several commands, defined once."""

from __future__ import annotations

import click

from raftkv.core.spec import DURABILITY_MODES, load_spec

config_option = click.option(
    "--config", "-c", "config", type=click.Path(dir_okay=False), default="raftkv-data/cluster.toml",
    show_default=True, help="Cluster spec (TOML) written by `raftkv cluster init` or `raftkv dev up`.",
)
endpoints_option = click.option(
    "--endpoints", "-e", default=None,
    help="Comma-separated node API addresses (host:port); default: every node in --config.",
)
consistency_option = click.option(
    "--consistency", type=click.Choice(["linearizable", "leader", "follower", "stale"]), default="linearizable",
    show_default=True, help="Read consistency level.",
)
json_option = click.option("--json", "as_json", is_flag=True, help="Machine-readable JSON output.")


def resolve_endpoints(config: str, endpoints: str | None) -> list[str]:
    if endpoints:
        return [e.strip() for e in endpoints.split(",") if e.strip()]
    return [n.api_address for n in load_spec(config).nodes]


def topology_options(command):
    """--nodes, --partitions, --replication, --base-port, --data-dir, --durability (cluster init, dev up)."""
    options = [
        click.option("--nodes", "-n", type=click.IntRange(1, 99), default=3, show_default=True),
        click.option("--partitions", "-p", type=click.IntRange(1, 4096), default=8, show_default=True,
                     help="Fixed for the life of the cluster."),
        click.option("--replication", "-r", type=click.IntRange(1, 99), default=3, show_default=True),
        click.option("--base-port", type=click.IntRange(1024, 65000), default=7000, show_default=True,
                     help="Node k uses ports base + k*(partitions+3) onwards: API, metrics, one Raft port a partition, the metadata group's."),
        click.option("--data-dir", type=click.Path(file_okay=False), default="raftkv-data", show_default=True),
        click.option("--durability", type=click.Choice(DURABILITY_MODES), default="default", show_default=True,
                     help="fsync: acknowledged writes survive power loss, not just process crashes."),
    ]
    for option in reversed(options):
        command = option(command)
    return command
