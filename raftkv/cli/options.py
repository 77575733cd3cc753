"""Options shared by several commands, defined once."""

from __future__ import annotations

import click

from raftkv.spec import load_spec

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
